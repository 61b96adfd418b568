"""Loading the large model in ``bench/store.py`` (not a benchmark itself).

:class:`ModelLoads` holds the 118 M-parameter transformer written into an encrypted store
and into one ``safetensors`` file, and offers every way of loading it that the benchmark
times: from the store into a module without and with prefetch, ``safetensors``
``load_file`` / ``load_model``, a forward pass alone, and layer-by-layer inference that runs
each layer as soon as it is loaded. Every load is checked against the reference weights.
"""

from __future__ import annotations

import functools
import gc
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _common as c

from clients.tasks.large_transformer import TransformerConfig, build_model, init_tensors, write_to_store
from fedshard.store import SealedShardStore
from fedshard.store.model_io import load_module
from fedshard.store.prefetch import PrefetchLoader

__all__ = [
    "FILE",
    "FORWARD",
    "NO_PREFETCH",
    "PREFETCH",
    "PREFETCH_2",
    "REFERENCE",
    "STREAM_0",
    "STREAM_2",
    "ModelLoads",
    "time_loads",
]

NO_PREFETCH = "store, no prefetch (look-ahead 0)"
PREFETCH = "store, prefetch (look-ahead 2, 1 fetch thread)"
PREFETCH_2 = "store, prefetch (look-ahead 2, 2 fetch threads: `load_module`'s default)"
FILE = "safetensors load_file (dict)"
REFERENCE = "safetensors load_model (module)"
FORWARD = "forward pass alone (model already loaded), {t} torch thread(s)"
STREAM_0 = "load + forward layer by layer, no prefetch, {t} torch thread(s)"
STREAM_2 = "load + forward layer by layer, prefetch (look-ahead 2), {t} torch thread(s)"

Timed = tuple[float, Any]  # seconds, and the load's report (``None`` if it has none)


class ModelLoads:
    """The model in ``store`` and in ``root/model.safetensors``, and the timed ways of loading it."""

    def __init__(self, cfg: TransformerConfig, store: SealedShardStore, root: Path, seed: int) -> None:
        import safetensors.torch

        self.cfg, self.store = cfg, store
        t0 = time.perf_counter()
        self.record = write_to_store(store, cfg, seed)
        self.write_s = time.perf_counter() - t0
        self.st_path = root / "model.safetensors"
        reference = {n: t.contiguous() for n, t in init_tensors(cfg, seed)}
        safetensors.torch.save_file(reference, str(self.st_path))
        self.probe = ["embed.weight", f"blocks.{cfg.layers - 1}.ff2.weight"]
        self.probe_values = {n: reference[n].clone() for n in self.probe}
        del reference
        gc.collect()
        self.tokens = torch.randint(
            0, cfg.vocab, (2, min(128, cfg.max_len)), generator=torch.Generator().manual_seed(1)
        )
        self.loaded = build_model(cfg)
        load_module(self.loaded, store)
        with torch.no_grad():
            self.expected_logits = self.loaded(self.tokens)
        self.torch_threads = torch.get_num_threads()

    def _check(self, state: dict[str, torch.Tensor]) -> None:
        assert all(torch.equal(state[n], self.probe_values[n]) for n in self.probe)

    def load_store(self, lookahead: int, workers: int) -> Timed:
        """``load_module`` from the encrypted store into a module built on the meta device."""
        model = build_model(self.cfg)
        t0 = time.perf_counter()
        report = load_module(model, self.store, lookahead=lookahead, workers=workers)
        seconds = time.perf_counter() - t0
        self._check(model.state_dict())
        return seconds, report

    def load_file(self) -> Timed:
        """``safetensors.torch.load_file`` into a dict."""
        import safetensors.torch

        t0 = time.perf_counter()
        sd = safetensors.torch.load_file(str(self.st_path))
        seconds = time.perf_counter() - t0
        self._check(sd)
        return seconds, None

    def load_model(self) -> Timed:
        """``safetensors.torch.load_model`` into a module (``to_empty`` included)."""
        import safetensors.torch

        model = build_model(self.cfg)
        t0 = time.perf_counter()
        model.to_empty(device="cpu")
        safetensors.torch.load_model(model, str(self.st_path))
        seconds = time.perf_counter() - t0
        self._check(model.state_dict())
        return seconds, None

    def forward_alone(self, threads: int) -> Timed:
        """One forward pass of the loaded model on ``threads`` torch threads."""
        torch.set_num_threads(threads)
        t0 = time.perf_counter()
        with torch.no_grad():
            self.loaded(self.tokens)
        seconds = time.perf_counter() - t0
        torch.set_num_threads(self.torch_threads)
        return seconds, None

    def streamed(self, lookahead: int, threads: int) -> Timed:
        """Layer-streamed inference: each layer runs as soon as it is loaded (what prefetch is for)."""
        torch.set_num_threads(threads)
        model = build_model(self.cfg)
        t0 = time.perf_counter()
        model.to_empty(device="cpu")
        out = {name: t.detach().numpy() for name, t in model.state_dict(keep_vars=True).items()}
        loader = PrefetchLoader(self.store.get, self.record.plan, lookahead=lookahead, out=out)
        positions = torch.arange(self.tokens.shape[1])
        x = logits = None
        with torch.no_grad():
            for layer, _ in loader:
                if layer.name == "pos":  # embed and pos both loaded
                    x = model.embed(self.tokens) + model.pos(positions)
                elif layer.name.startswith("blocks."):
                    x = model.blocks[int(layer.name.split(".")[1])](x)
                elif layer.name == "norm":
                    logits = model.norm(x) @ model.embed.weight.T
        seconds = time.perf_counter() - t0
        torch.set_num_threads(self.torch_threads)
        assert logits is not None and torch.allclose(logits, self.expected_logits, atol=1e-4)
        return seconds, None

    def variants(self) -> dict[str, Callable[[], Timed]]:
        """Every timed way of loading (and running) the model, by its row label."""
        threads = (self.torch_threads, 1)
        return {
            NO_PREFETCH: lambda: self.load_store(0, 1),
            PREFETCH: lambda: self.load_store(2, 1),
            PREFETCH_2: lambda: self.load_store(2, 2),
            FILE: self.load_file,
            REFERENCE: self.load_model,
            **{FORWARD.format(t=t): functools.partial(self.forward_alone, t) for t in threads},
            **{STREAM_0.format(t=t): functools.partial(self.streamed, 0, t) for t in threads},
            **{STREAM_2.format(t=t): functools.partial(self.streamed, 2, t) for t in threads},
        }


def time_loads(
    variants: dict[str, Callable[[], Timed]], runs: int, warm_up: bool
) -> tuple[dict[str, list[float]], dict[str, tuple[int, int]]]:
    """Seconds of every variant per run (interleaved, order rotated), and the peak resident layers and
    bytes of the store loads; after one untimed call of each when ``warm_up``."""
    loads: dict[str, list[float]] = {k: [] for k in variants}
    peaks: dict[str, tuple[int, int]] = {}
    for fn in variants.values() if warm_up else []:  # warm-up: file cache, allocator
        fn()
        gc.collect()
    for rep in range(runs):
        for name in c.rotated(list(variants), rep):
            seconds, report = variants[name]()
            loads[name].append(seconds)
            if report is not None:
                peaks[name] = (report.peak_resident_layers, report.peak_resident_bytes)
            gc.collect()
    return loads, peaks
