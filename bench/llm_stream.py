"""Training through a frozen base streamed from the sealed cold store (issue 15, QLoRA-style).

The LLM task's classifier (``clients/tasks/llm``; the 118 M configuration,
``SIZES["large"]``; ``--quick``: ``small``), randomly initialised (this measures the
system, not accuracy), with LoRA r=8 (alpha 16) on every block's ``qkv``, ``proj``,
``ff1``, ``ff2``. One training step = forward, cross-entropy, backward, Adam on the
adapters, on a batch of 8 × 32 tokens, torch on 2 threads. Four variants:

* **resident**: the fp32 base in the module (the reference);
* **int8**, **fp8**: the module built on the ``meta`` device, the base attached from a
  sealed store written cold in that format (``fedshard.store.streamed``) as sites attach
  it (``store.base_codes: memory``): every streamed weight's codes read, decrypted and
  checked once, then held; every ``Linear`` and ``Embedding`` weight is dequantised from
  them in forward and again in backward, ``lookahead`` weights ahead in a background
  thread; biases and LayerNorms stay resident;
* **int8-store**: as int8, with nothing held (``store.base_codes: store``): every fetch
  reads, decrypts and dequantises from the store (the BLAKE3 check on a shard's first
  read only).

Step time: one process builds the four variants and runs their steps interleaved
(resident, int8, fp8, int8-store, resident, …), so load from other processes on a shared
machine hits them alike; median of the timed steps after the warm-up steps (the first step
of a streamed run records the access order). Memory: each variant alone in its own
process, its peak RSS, the median of ``--memory-runs`` processes (default 3; glibc's
allocator keeps freed blocks by its own rules, which moves a process's peak by ±25 MB
from run to run, a twentieth of the base). Base memory of a streamed run = its peak RSS −
(the resident run's peak RSS − the fp32 base's bytes): everything but the base is the
same in both (torch, peft, activations, adapters, Adam). Goals: step ratio ≤ 1.15,
base memory ≤ 30 % of fp32.

    .venv/bin/python bench/llm_stream.py [--quick] [--json] [--steps N] [--memory-runs N] [--lookahead K] --output FILE

``--json`` prints ``streamed_step_ratio`` and ``base_memory_fraction`` (int8),
``fp8_step_ratio``, ``fp8_base_memory_fraction``, ``store_step_ratio``,
``store_base_memory_fraction`` (int8-store), ``resident_step_s``, ``int8_step_s``,
``fp8_step_s``, ``store_step_s``, ``base_fp32_bytes``, ``fetch_ns_per_value`` and
``store_fetch_ns_per_value`` (fetching alone, one thread, int8 and int8-store) and
``step_ratio_floor_2_cores`` (the ratio that int8's fetching CPU alone implies on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _common as c

SECTION = "llm_stream"
CLASSES = 4
BATCH = 8
RANK, ALPHA = 8, 16
STEP_GOAL, MEMORY_GOAL = 1.15, 0.30
VARIANTS = ("resident", "int8", "fp8", "int8-store")
STREAMED = {"int8": ("int8", "memory"), "fp8": ("fp8", "memory"), "int8-store": ("int8", "store")}
"""A streamed variant's cold format (its store) and where its fetches take the codes from."""
LABELS = {
    "int8": "streamed from held int8 codes",
    "fp8": "streamed from held fp8 codes",
    "int8-store": "streamed from the sealed int8 store",
}
MEMORY_STEPS = 3  # timed steps of a variant's memory run (after the warm-up)


# the children: one variant for its memory, or all three interleaved for time ---------------------------
class Trainer:
    """One variant's model, adapters and optimiser, and its step."""

    def __init__(self, variant: str, args: argparse.Namespace) -> None:
        import torch

        from clients.tasks.llm.model import SIZES, AdapterScheme, add_lora, build_classifier

        self.variant = variant
        self.cfg = SIZES[args.size]
        self.base: Any = None
        if variant == "resident":
            torch.manual_seed(0)
            model = build_classifier(self.cfg, CLASSES)
            model.requires_grad_(False)
            self.base_bytes = sum(t.numel() * 4 for t in model.state_dict().values())
        else:
            from fedshard.crypto.at_rest import Kek
            from fedshard.store.sealed_store import SealedShardStore
            from fedshard.store.streamed import Codes, StreamedBase

            with torch.device("meta"):
                model = build_classifier(self.cfg, CLASSES)
            model.requires_grad_(False)
            kek = Kek.from_text(Path(args.key_file).read_text())
            fmt, codes = STREAMED[variant]
            store = SealedShardStore.open(Path(args.stores) / fmt, kek)
            self.base = StreamedBase(
                model,
                store,
                lookahead=args.lookahead,
                niceness=args.niceness,
                codes=Codes(codes),
                band_values=args.band_values,
            )
            self.base_bytes = self.base.resident_bytes + self.base.streamed_bytes
        self.model = add_lora(model, RANK, ALPHA, AdapterScheme.FEDAVG)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimiser = torch.optim.Adam(self.params, lr=1e-3)
        self.gen = torch.Generator().manual_seed(1)
        self.times: list[float] = []
        self.fetch_s: list[float] = []
        self.wait_s: list[float] = []
        self.fwd_wait_s: list[float] = []

    def step(self, timed: bool) -> None:
        """One training step on a fresh random batch."""
        import torch

        from fedshard.store.held_codes import HeldStats
        from fedshard.store.weight_stream import StreamStats

        x = torch.randint(1, self.cfg.vocab, (BATCH, self.cfg.max_len), generator=self.gen)
        y = torch.randint(0, CLASSES, (BATCH,), generator=self.gen)
        if self.base is not None:
            self.base.stream.stats = StreamStats()  # counters per step; the peaks run on
            self.base.held_stats = HeldStats()
        t0 = time.perf_counter()
        self.optimiser.zero_grad()
        loss = torch.nn.functional.cross_entropy(self.model(x), y)
        loss.backward()
        self.optimiser.step()
        dt = time.perf_counter() - t0
        if timed:
            self.times.append(dt)
            if self.base is not None and self.base.held_bytes:  # dequantised in the training thread
                self.fetch_s.append(self.base.held_stats.seconds)
                self.wait_s.append(self.base.held_stats.seconds)
                self.fwd_wait_s.append(0.0)
            elif self.base is not None:
                self.fetch_s.append(self.base.stats.fetch_s)
                self.wait_s.append(self.base.stats.wait_s)
                self.fwd_wait_s.append(self.base.stats.phases.get("fwd", 0.0))

    def figures(self) -> dict[str, Any]:
        """What the parent needs of this variant."""
        out: dict[str, Any] = {
            "variant": self.variant,
            "step_s": self.times,
            "base_bytes": self.base_bytes,
            "trainable": sum(p.numel() for p in self.params),
        }
        if self.base is not None:
            stats = self.base.stats
            held = self.base.held_stats
            out.update(
                fetch_s=statistics.median(self.fetch_s),
                wait_s=statistics.median(self.wait_s),
                fwd_wait_s=statistics.median(self.fwd_wait_s),
                fetched_bytes=held.fetched_bytes if self.base.held_bytes else stats.fetched_bytes,
                misses=stats.misses,
                peak_resident=self.base.peak_resident,
                peak_stream_bytes=self.base.stream.peak_bytes,
                spare_bytes=self.base._buffers.spare_bytes,
                resident_bytes=self.base.resident_bytes,
                held_bytes=self.base.held_bytes,
            )
        return out


def child(args: argparse.Namespace) -> None:
    """``--child VARIANT``: that variant alone, for its peak RSS; ``--child timing``: the variants'
    steps interleaved (so that other load on the machine hits them alike). Prints JSON last."""
    import torch

    torch.set_num_threads(args.torch_threads)
    variants = VARIANTS if args.child == "timing" else (args.child,)
    trainers = [Trainer(v, args) for v in variants]
    for i in range(args.warmup + args.steps):
        for t in trainers:
            t.step(timed=i >= args.warmup)
    out = {t.variant: t.figures() for t in trainers}
    for t in trainers:
        if t.base is not None:
            t.base.close()
    peak = c.status_bytes("VmHWM")  # not ru_maxrss: that holds the parent's peak when the parent is larger
    print(json.dumps({"peak_rss": peak, "variants": out}))


# the parent: write the stores, run the variants ------------------------------------------------------
def write_stores(root: Path, size: str, key_file: Path) -> dict[str, float]:
    """Seal the base (seed 0) into an int8 and an fp8 store under ``root``; seconds per format."""
    import torch

    from clients.tasks.llm.model import SIZES, build_classifier
    from fedshard.crypto.at_rest import Kek
    from fedshard.store.quantize import ColdFormat
    from fedshard.store.sealed_store import SealedShardStore
    from fedshard.store.streamed import seal_base

    torch.manual_seed(0)
    model = build_classifier(SIZES[size], CLASSES)
    model.requires_grad_(False)
    kek = Kek.generate()
    key_file.write_text(kek.to_text())
    seconds = {}
    for fmt in (ColdFormat.INT8, ColdFormat.FP8):
        t0 = time.perf_counter()
        seal_base(model, SealedShardStore.create(root / fmt.value, kek), fmt)
        seconds[fmt.value] = time.perf_counter() - t0
    return seconds


def run_child(what: str, args: argparse.Namespace, root: Path, key_file: Path, size: str, steps: int) -> Any:
    """``--child what`` in a fresh process; its JSON."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", what, "--size", size, "--stores", str(root)]
    cmd += ["--key-file", str(key_file), "--steps", str(steps), "--warmup", str(args.warmup)]
    cmd += ["--lookahead", str(args.lookahead), "--niceness", str(args.niceness)]
    cmd += ["--band-values", str(args.band_values)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"child {what} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def children_cpu() -> float:
    """CPU seconds of this process's finished children."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def fetch_cost(store_dir: Path, key_file: Path, size: str, codes: str) -> float:
    """Wall nanoseconds per value of fetching every streamed weight once, alone (median of 3 passes), with the
    codes taken from ``codes``: ``memory`` (dequantised band by band by torch's threads, as in training) or
    ``store`` (read, decrypted and dequantised whole in this one thread, as the prefetch thread does)."""
    import torch

    from clients.tasks.llm.model import SIZES, build_classifier
    from fedshard.crypto.at_rest import Kek
    from fedshard.store.sealed_store import SealedShardStore
    from fedshard.store.streamed import Codes, StreamedBase

    with torch.device("meta"):
        model = build_classifier(SIZES[size], CLASSES)
    model.requires_grad_(False)
    store = SealedShardStore.open(store_dir, Kek.from_text(key_file.read_text()))
    base = StreamedBase(model, store, codes=Codes(codes))
    passes = []
    for _ in range(3):
        t0 = time.perf_counter()
        for name in base.streamed:
            held = base._held.get(name)
            if held is None:
                base._fetch(name)
            else:  # every band dequantised into the band buffer
                for _ in held._dequantised():
                    pass
        passes.append(time.perf_counter() - t0)
    return statistics.median(passes) / (base.streamed_bytes / 4) * 1e9


@dataclass(frozen=True, slots=True)
class Figures:
    """Derived figures of one streamed variant against the resident run."""

    step_s: float
    ratio: float
    base_memory: float
    fraction: float


def derive(resident: dict[str, Any], run: dict[str, Any]) -> Figures:
    """Step ratio and base memory of ``run`` (see the module docstring)."""
    ref = statistics.median(resident["step_s"])
    step = statistics.median(run["step_s"])
    others = resident["peak_rss"] - resident["base_bytes"]
    memory = run["peak_rss"] - others
    return Figures(step, step / ref, memory, memory / resident["base_bytes"])


def spread(xs: list[float]) -> str:
    """Median (min–max) in seconds."""
    return f"{statistics.median(xs):.3f} s ({min(xs):.3f}–{max(xs):.3f})"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_output_args(parser)
    parser.add_argument("--steps", type=int, default=None, help="timed steps per variant (default 7; 5 --quick)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (default 2)")
    parser.add_argument("--lookahead", type=int, default=2, help="weights fetched ahead (default 2)")
    parser.add_argument("--child", choices=(*VARIANTS, "timing"), help=argparse.SUPPRESS)
    parser.add_argument("--size", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--stores", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--key-file", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--torch-threads", type=int, default=2, help=argparse.SUPPRESS)
    parser.add_argument(
        "--memory-runs", type=int, default=None, help="processes per variant for its peak RSS, median (default 3)"
    )
    parser.add_argument("--niceness", type=int, default=0, help="lower the prefetch thread's priority (default 0)")
    parser.add_argument(
        "--band-values",
        type=int,
        default=None,
        help="held codes: most values dequantised at once (default: fedshard's BAND_VALUES)",
    )
    args = parser.parse_args(argv)
    if args.band_values is None:
        from fedshard.store.held_codes import BAND_VALUES

        args.band_values = BAND_VALUES
    args.steps = args.steps or (2 if args.smoke else 5 if args.quick else 9)
    args.memory_runs = args.memory_runs or (1 if args.smoke else 3)
    if args.smoke:
        args.warmup = 1
    return args


def measure(args: argparse.Namespace, size: str) -> dict[str, Any]:
    """Seal the stores, measure each variant's peak RSS alone and their steps interleaved."""
    with tempfile.TemporaryDirectory(prefix="fedshard-bench-llm-stream-") as tmp:
        root = Path(tmp)
        key_file = root / "kek.txt"
        seal_s = write_stores(root, size, key_file)
        peaks: dict[str, list[int]] = {v: [] for v in VARIANTS}
        for _ in range(args.memory_runs):  # the variants in turn, so that a drift of the machine hits them alike
            for v in VARIANTS:
                peaks[v].append(run_child(v, args, root, key_file, size, MEMORY_STEPS)["peak_rss"])
        wall0, busy0, own0 = time.perf_counter(), c.machine_busy_seconds(), children_cpu()
        runs = run_child("timing", args, root, key_file, size, args.steps)["variants"]
        wall = time.perf_counter() - wall0
        others = max(0.0, c.machine_busy_seconds() - busy0 - (children_cpu() - own0)) / wall
        import torch

        torch.set_num_threads(args.torch_threads)  # as the timed children
        fetch_ns = {v: fetch_cost(root / "int8", key_file, size, STREAMED[v][1]) for v in ("int8", "int8-store")}
    for v in VARIANTS:
        runs[v]["peak_rss"] = statistics.median(peaks[v])
        runs[v]["peak_rss_runs"] = peaks[v]
    return {"runs": runs, "seal_s": seal_s, "others": others, "fetch_ns": fetch_ns}


def _peak(run: dict[str, Any]) -> str:
    """A variant's peak RSS: the median (min–max) of its memory processes."""
    peaks = run["peak_rss_runs"]
    spread_mb = f" ({min(peaks) / c.MB:.0f}–{max(peaks) / c.MB:.0f})" if len(peaks) > 1 else ""
    return f"{run['peak_rss'] / c.MB:.0f} MB{spread_mb}"


def _rows(runs: dict[str, Any], figs: dict[str, Figures]) -> list[list[str]]:
    resident = runs["resident"]
    fp32 = resident["base_bytes"]
    rows = [
        [
            "fp32 base resident",
            spread(resident["step_s"]),
            "1.00",
            _peak(resident),
            f"{fp32 / c.MB:.0f} MB",
            "100 %",
        ]
    ]
    for v in STREAMED:
        f, r = figs[v], runs[v]
        rows.append(
            [
                LABELS[v],
                spread(r["step_s"]),
                f"{round(f.ratio, 4):.2f}",  # from the headline's rounded figure: table and --json agree
                _peak(r),
                f"{f.base_memory / c.MB:.0f} MB",
                f"{100 * round(f.fraction, 4):.1f} %",
            ]
        )
    return rows


def step_floor(runs: dict[str, Any], fetch_ns: float, variant: str = "int8") -> tuple[float, float]:
    """Seconds of fetching per step of ``variant`` (measured alone), and the step ratio they allow at best:
    held codes are dequantised in the training thread, so their time adds to the step; a store's fetch runs on
    one core beside torch's 2 threads, so at best it costs half its time."""
    per_step = runs[variant]["fetched_bytes"] / 4 * fetch_ns / 1e9
    overlap = 1 if runs[variant]["held_bytes"] else 2
    return per_step, 1 + per_step / (overlap * statistics.median(runs["resident"]["step_s"]))


def _notes(args: argparse.Namespace, size: str, m: dict[str, Any], ticks0: Any) -> list[str]:
    runs, seal_s, fetch_ns, others = m["runs"], m["seal_s"], m["fetch_ns"], m["others"]
    resident = runs["resident"]
    fp32 = resident["base_bytes"]
    notes = [
        f"- model: `SIZES[{size!r}]`, {fp32 / 1e6:.1f} MB fp32 base ({fp32 // 4 / 1e6:.1f} M values), "
        f"{resident['trainable']:,} trainable LoRA values; batch {BATCH} × 32 tokens; "
        f"lookahead {args.lookahead} (int8-store); held codes "
        f"dequantised in bands of at most {args.band_values:,} values; "
        f"step times: one process with the four variants, their steps interleaved ({args.warmup} warm-up + "
        f"{args.steps} timed steps each), so other load on the machine hits them alike; peak RSS: each variant alone "
        f"in its own process ({args.warmup} + {MEMORY_STEPS} steps), median of {args.memory_runs} processes",
        f"- sealing the base: {seal_s['int8']:.1f} s (int8), {seal_s['fp8']:.1f} s (fp8), one commit each",
    ]
    for v in STREAMED:
        r = runs[v]
        step = statistics.median(r["step_s"])
        if r["held_bytes"]:
            notes.append(
                f"- {v}: {r['held_bytes'] / 1e6:.0f} MB of codes held; per step {r['fetched_bytes'] / 1e6:.0f} MB of "
                f"fp32 values dequantised, a band of rows at a time in the training thread ({r['fetch_s']:.3f} s of "
                f"the {step:.3f} s step); no full-precision weight exists; {r['resident_bytes'] / 1e3:.0f} kB stays "
                "resident (biases, LayerNorms)"
            )
            continue
        notes.append(
            f"- {v}: no codes held; per step {r['fetched_bytes'] / 1e6:.0f} MB of fp32 weights fetched; fetch time "
            f"{r['fetch_s']:.3f} s (one core, background), caller waited {r['wait_s']:.3f} s "
            f"({r['fwd_wait_s']:.3f} s in forward) of the {step:.3f} s step; {r['misses']} misses; at most "
            f"{r['peak_resident']} streamed weights resident, {r['peak_stream_bytes'] / 1e6:.0f} MB at most (plus at "
            f"most {r['spare_bytes'] / 1e6:.0f} MB of spare buffers for reuse); {r['resident_bytes'] / 1e3:.0f} kB "
            "stays resident (biases, LayerNorms)"
        )
    per_step, floor = step_floor(runs, fetch_ns["int8"])
    store_step, store_floor = step_floor(runs, fetch_ns["int8-store"], "int8-store")
    notes.append(
        f"- fetching alone: int8 from held codes {fetch_ns['int8']:.2f} ns per value (torch's threads dequantise "
        f"a band into the band buffer), i.e. {per_step:.3f} s per step, in the training thread: the step cannot be "
        f"shorter than {floor:.2f}× the resident one ({statistics.median(resident['step_s']):.3f} s); from the "
        f"store {fetch_ns['int8-store']:.2f} ns (one thread: read, decrypt, dequantise, assemble; the BLAKE3 check "
        f"is paid on a shard's first read only), {store_step:.3f} core-s per step, beside torch's 2 threads on 2 "
        f"cores: {store_floor:.2f}× at best, with perfect overlap"
    )
    notes.append(f"- other processes used {others:.2f} of the 2 cores on average while the steps were timed")
    if others > 0.2:
        notes.append(
            "- **the machine was not quiet**: torch's 2 threads on 2 shared cores stall whenever one is preempted, "
            "which inflates every step and pulls the ratios towards 1; these step ratios are not a quiet machine's"
        )
    notes.append(c.steal_note(ticks0))
    return notes


def _interpretation(runs: dict[str, Any], figs: dict[str, Figures], fetch_ns: dict[str, float]) -> str:
    verdict = "meets" if figs["int8"].ratio <= STEP_GOAL else "misses"
    memory = "meets" if figs["int8"].fraction <= MEMORY_GOAL else "misses"
    where = ""
    for v in ("int8", "fp8"):
        if figs[v].ratio <= STEP_GOAL:
            continue
        r = runs[v]
        excess = statistics.median(r["step_s"]) - statistics.median(runs["resident"]["step_s"])
        floor = ""
        if v == "int8":  # its dequantising alone was measured
            per_step, at_best = step_floor(runs, fetch_ns["int8"])
            floor = f" ({per_step:.3f} s alone: every weight dequantised twice, a floor of {at_best:.2f}×)"
        where += (
            f" {v} misses the step goal: its step is {excess:.3f} s longer than the resident one; dequantising "
            f"takes {r['fetch_s']:.3f} s in the training thread{floor}"
            + (
                "; the rest is the banded matmuls' own cost (a layer's output computed a band of rows at a time)."
                if excess > r["fetch_s"]
                else "."
            )
        )
    return (
        f"Streaming the base from held int8 codes (the default) costs {figs['int8'].ratio:.2f}× the resident step "
        f"(goal ≤ {STEP_GOAL}: {verdict} it) and holds {100 * figs['int8'].fraction:.1f} % of the fp32 base in memory "
        f"(goal ≤ {100 * MEMORY_GOAL:.0f} %: {memory} it); fp8: {figs['fp8'].ratio:.2f}×, "
        f"{100 * figs['fp8'].fraction:.1f} %; reading the int8 codes from the store at every use instead: "
        f"{figs['int8-store'].ratio:.2f}×, {100 * figs['int8-store'].fraction:.1f} %." + where
    )


def _headline(runs: dict[str, Any], figs: dict[str, Figures], fetch_ns: dict[str, float]) -> dict[str, Any]:
    return {
        "streamed_step_ratio": round(figs["int8"].ratio, 4),
        "base_memory_fraction": round(figs["int8"].fraction, 4),
        "fp8_step_ratio": round(figs["fp8"].ratio, 4),
        "fp8_base_memory_fraction": round(figs["fp8"].fraction, 4),
        "store_step_ratio": round(figs["int8-store"].ratio, 4),
        "store_base_memory_fraction": round(figs["int8-store"].fraction, 4),
        "resident_step_s": round(statistics.median(runs["resident"]["step_s"]), 4),
        "int8_step_s": round(figs["int8"].step_s, 4),
        "fp8_step_s": round(figs["fp8"].step_s, 4),
        "store_step_s": round(figs["int8-store"].step_s, 4),
        "base_fp32_bytes": runs["resident"]["base_bytes"],
        "fetch_ns_per_value": round(fetch_ns["int8"], 3),
        "store_fetch_ns_per_value": round(fetch_ns["int8-store"], 3),
        "step_ratio_floor_2_cores": round(step_floor(runs, fetch_ns["int8"])[1], 4),
    }


def main(argv: list[str] | None = None) -> int:
    """Measure, then publish (see the module docstring)."""
    args = parse_args(argv)
    if args.child:
        child(args)
        return 0
    size = "small" if args.quick else "large"
    ticks0 = c.cpu_ticks()
    m = measure(args, size)
    runs = m["runs"]
    figs = {v: derive(runs["resident"], runs[v]) for v in STREAMED}
    c.publish(
        args,
        SECTION,
        "Training through a frozen base streamed from the sealed cold store",
        f"{args.steps} timed steps per variant after {args.warmup} warm-up; medians (min–max)",
        None,
        notes=_notes(args, size, m, ticks0),
        headers=["variant", "step (median, min–max)", "× resident", "peak RSS", "base memory", "of fp32 base"],
        rows=_rows(runs, figs),
        interpretation=_interpretation(runs, figs, m["fetch_ns"]),
        headline=_headline(runs, figs, m["fetch_ns"]),
        console_title="streamed base",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
