"""The LLM fine-tuning benchmark's report: gaps, goal rows, notes and interpretation (see ``llm_finetune.py``)."""

from __future__ import annotations

import argparse
from typing import Any

import llm_stream
from _dp_runs import mean_se
from _llm_finetune_runs import DELTA, GAP_GOAL_PP, SHARE_GOAL, TEST_GOAL, Run, Share

__all__ = ["gaps", "goal_rows", "interpretation", "notes", "pp"]


def gaps(runs: list[Run], kind: str, central: dict[int, float]) -> tuple[list[float], float | None, float | None]:
    """Per-seed accuracies of ``kind``, and the mean and SE of their gap to the central run, in pp."""
    mine = {r.seed: r.accuracy for r in runs if r.kind == kind}
    if not mine:
        return [], None, None
    m, se = mean_se([100 * (mine[s] - central[s]) for s in sorted(mine)])
    return [mine[s] for s in sorted(mine)], m, se


def pp(m: float | None, se: float | None) -> str:
    return "not run" if m is None or se is None else f"{m:+.2f} ± {se:.2f} pp"


def met(ok: bool) -> str:
    return "yes" if ok else "**no**"


def goal_rows(
    args: argparse.Namespace,
    gap: tuple[float, float],
    dp: dict[float, tuple[list[float], float | None, float | None]],
    regional: tuple[list[float], float | None, float | None],
    n_test: int,
    streamed: tuple[dict[str, Any], str],
    share: Share,
    released: int,
) -> list[list[str]]:
    """The report's table: each goal, what was measured, the target, whether it is met."""
    fed_m, fed_se = gap
    stream, stream_size = streamed
    rows = [
        [
            f"federated − central accuracy ({args.size}, {args.seeds} seed{'s' * (args.seeds > 1)})",
            pp(fed_m, fed_se),
            f"≥ −{GAP_GOAL_PP} pp",
            met(fed_m >= -GAP_GOAL_PP),
        ],
        *[
            [f"DP ε={eps:g} federated − non-private central", pp(m, se), "(reported)", "–"]
            for eps, (_, m, se) in dp.items()
        ],
        ["regional adapters (3 EU + 3 US sites) − central", pp(regional[1], regional[2]), "(reported)", "–"],
        ["test predictions per model", f"{n_test:,}", f"≥ {TEST_GOAL:,}", met(n_test >= TEST_GOAL)],
        [
            f"base memory while training, int8 ({stream_size})",
            f"{100 * stream['base_memory_fraction']:.1f} % of fp32",
            "≤ 30 %",
            met(stream["base_memory_fraction"] <= llm_stream.MEMORY_GOAL),
        ],
        [
            f"streamed int8 step / resident fp32 step ({stream_size})",
            f"{stream['streamed_step_ratio']:.2f}×",
            f"≤ {llm_stream.STEP_GOAL}×",
            met(stream["streamed_step_ratio"] <= llm_stream.STEP_GOAL),
        ],
        [
            f"fedshard's share of a round ({args.share_size})",
            f"{100 * round(share.share, 4):.1f} %",  # from the headline's rounded figure: table and --json agree
            f"≤ {100 * SHARE_GOAL:.0f} %",
            met(share.share <= SHARE_GOAL),
        ],
        [
            "base bytes released (every round of every run)",
            f"{released:,} B",
            "0",
            met(released == 0),
        ],
    ]
    return rows


def notes(
    args: argparse.Namespace,
    runs: list[Run],
    central: dict[int, float],
    dp: dict[float, tuple[list[float], float | None, float | None]],
    regional: tuple[list[float], float | None, float | None],
    shared: Run,
    share: Share,
    stream: dict[str, Any],
    stream_size: str,
    seconds: tuple[float, float, float],
) -> list[str]:
    accuracy_s, share_s, stream_s = seconds
    notes = [
        f"- accuracy runs: `configs/demo-llm.yaml` (6 sites, 2 zones, FFA-LoRA r=8, Dirichlet(1.0) label skew) with "
        "every site in the EU, so all six sites' adapters are averaged into one model, at "
        f"size `{args.size}`, {args.rounds} round(s) × {args.local_epochs} local epoch(s), batch {args.batch}, Adam lr "
        f"{args.lr:g}, {args.private_examples:,} private examples, `store.base: int8`; central: the same LoRA on the "
        f"pooled private data, {args.rounds * args.local_epochs} epoch(s), Adam lr {args.central_lr:g}, fp32 base; "
        f"DP: record-level DP-SGD, δ = {DELTA:g}, σ calibrated per site, clip {args.dp_clip:g}",
        "- per seed (accuracy on the whole test set):",
    ]
    for i, seed in enumerate(args.seed_values):
        fed = next(r for r in runs if r.kind == "federated" and r.seed == seed)
        parts = [f"federated {fed.accuracy:.4f}", f"central {central[seed]:.4f}"]
        parts += [f"DP ε={eps:g} {accs[i]:.4f}" for eps, (accs, _, _) in dp.items() if accs]
        parts += [f"regional {regional[0][i]:.4f}"] if regional[0] else []
        secs = [f"{r.kind} {r.seconds:.0f} s" for r in runs if r.seed == seed]
        notes.append(f"  - seed {seed}: {', '.join(parts)} ({', '.join(secs)})")
    for r in runs:
        if r.kind.startswith("dp_"):
            spent = max(site["epsilon_spent"] for site in r.summary["sites"])
            notes.append(f"  - {r.kind} seed {r.seed}: largest ε spent by a site {spent:.3f}")
    notes += [
        f"- fedshard_share: {len(shared.summary['sites'])} sites, {args.share_rounds} round(s), `{args.share_size}` "
        f"base (not pretrained), {args.share_examples} private examples, test fraction {args.share_test_fraction:g}, "
        f"`store.base: int8`. Last round {share.round_s:.2f} s wall: the task's train {share.train_s:.2f} s and "
        f"evaluate {share.evaluate_s:.2f} s (every site, one after the other), the rest "
        f"{share.round_s - share.train_s - share.evaluate_s:.2f} s is fedshard's (and the machine's other load). "
        f"Over all {len(share.rounds_s)} round(s) ({sum(share.rounds_s):.2f} s), inside the task's calls, the "
        f"training thread waited {share.wait_s:.2f} s for streamed weights (fetching or dequantising them "
        f"took {share.fetch_s:.2f} s): counted as fedshard's too, that is {100 * share.wait_share:.1f} % more. "
        f"Rounds: {', '.join(f'{s:.1f} s' for s in share.rounds_s)}; "
        f"shares {', '.join(f'{100 * x:.1f} %' for x in share.shares)}",
        f"- released per site per round: {runs[0].adapter_bytes:,} adapter bytes at `{args.size}`, "
        f"{shared.adapter_bytes:,} at `{args.share_size}`; measured bytes_up per site per round: "
        + ", ".join(sorted({f"{b:,.0f}" for r in [*runs, shared] for b in r.bytes_per_site_round})),
        f"- streamed base (`bench/llm_stream.py`, `{stream_size}`): int8 step {stream['int8_step_s']:.3f} s vs "
        f"resident {stream['resident_step_s']:.3f} s; fp8 {stream['fp8_step_ratio']:.2f}×, "
        f"{100 * stream['fp8_base_memory_fraction']:.1f} % of fp32; floor of the step ratio on 2 cores "
        f"{stream['step_ratio_floor_2_cores']:.2f}",
        "- regional: the demo's residency as it is (3 EU + 3 US sites): EU sites' adapters are averaged into an EU "
        "regional model, the US sites' into a global one, each from half the data; every site is scored with its "
        "own model on its test slice (non-private; the same seed's central run)",
        f"- wall time: accuracy runs {accuracy_s:.0f} s, share run {share_s:.0f} s, llm_stream {stream_s:.0f} s",
    ]
    return notes


def interpretation(
    args: argparse.Namespace,
    fed_m: float,
    fed_se: float,
    dp: dict[float, tuple[list[float], float | None, float | None]],
    regional: tuple[list[float], float | None, float | None],
    share: Share,
    stream: dict[str, Any],
    released: int,
    adapters: int,
    shared: Run,
) -> str:
    dp_text = "; ".join(f"with DP at ε = {eps:g}: {pp(m, se)}" for eps, (_, m, se) in dp.items() if m is not None)
    if regional[1] is not None:
        dp_text += f"; with the demo's EU-regional and global adapters: {pp(regional[1], regional[2])}"
    return (
        f"Federated LoRA over the sealed int8 base is {pp(fed_m, fed_se)} from the same LoRA trained centrally on "
        f"the pooled data (size `{args.size}`, {args.seeds} seed(s); goal ≥ −{GAP_GOAL_PP} pp)"
        + (f"; {dp_text}" if dp_text else "")
        + f". The {'118 M' if not args.quick else args.share_size} base streamed from the sealed int8 store takes "
        f"{stream['streamed_step_ratio']:.2f}× the resident step and holds "
        f"{100 * stream['base_memory_fraction']:.1f} % of its fp32 size; fedshard's share of a round is "
        f"{100 * share.share:.1f} %; the sites released {released:,} bytes beyond their adapters "
        f"({adapters:,} B per site per round at `{args.size}`, {shared.adapter_bytes:,} B at `{args.share_size}`)."
        + (
            " --quick: one seed (SE 0), the tiny model, one round and the small base for the system figures; these "
            "are a smoke test, not the goals' figures."
            if args.quick
            else ""
        )
    )
