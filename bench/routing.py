"""Routing decisions per second for a ~10 M-parameter model, against the digest work of a round.

A synthetic torch model (no download) has the kinds of tensors the sensitivity
classifier cares about: a first ``Linear`` layer that sees raw input features, an
``nn.Embedding`` table, a stack of blocks (``LayerNorm`` + two ``Linear`` layers, each
with LoRA-style adapter tensors ``*.lora_A`` / ``*.lora_B``) and an output layer with a
bias. Its ``state_dict`` is cut with ``ShardPlan.from_state_dict`` for tile 256x256
(fedshard's default) and 64x64 (many more shards).

For each tile the benchmark times the following, each after one untimed call, then
all of them interleaved for several runs with the order rotated every run (so they see
the same state of this shared machine), and reports medians:

* ``classify``: ``SensitivityClassifier.from_config(ResidencyConfig()).classify(plan, model)``
  (the site's path in ``fedshard/assembly/routing.py``: with the model, so the
  structural detectors use module types);
* ``route``: ``Router(...).route_plan(classes, origin, ShardProtection())`` over the
  whole plan for a site of each origin (EU, US, SG), with three zones (eu-central EU,
  us-east US, sg-1 SG; us-east reduces) and the default (GDPR-like) policy;
* ``policy.decide alone``: ``Policy.decide`` for every shard (the rule lookup inside ``route``);
* ``digest``: ``fedshard.integrity.shard_digest`` of every shard of the plan, the
  SHA-256 work a site does for every update it sends (the manifest), as the yardstick.

    .venv/bin/python bench/routing.py [--quick] [--json] [--runs N] [--output FILE]

``--json`` prints, for the default 256x256 tile: ``params``, ``shards``, ``route_ms`` (the slowest
origin's median), ``decisions_per_s`` (route), ``us_per_decision``, ``route_vs_digest`` (the largest
ratio over origins, a fraction), ``classify_ms`` and ``all_local`` (every shard to its own region's zone).
"""

from __future__ import annotations

import argparse
import functools
import gc
import statistics
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c

from fedshard.config.residency import ResidencyConfig
from fedshard.integrity import shard_digest
from fedshard.residency import Classification, Policy, Router, SensitivityClassifier, ShardProtection, ZoneInfo
from fedshard.sharding import ShardPlan

SECTION = "routing"
TILES = [(256, 256), (64, 64)]
ORIGINS = ["EU", "US", "SG"]
ZONES = [ZoneInfo("eu-central", "EU"), ZoneInfo("us-east", "US"), ZoneInfo("sg-1", "SG")]
REDUCING_ZONE = "us-east"
LOCAL_ZONE = {z.region: z.name for z in ZONES}
GOAL = 0.01  # routing must cost well under 1 % of a round's digest work


@dataclass(frozen=True)
class ModelShape:
    """Sizes of the synthetic model."""

    features: int  # raw input features seen by the first layer
    vocab: int  # rows of the embedding table
    width: int  # model width
    hidden: int  # width inside a block
    blocks: int
    rank: int  # LoRA rank
    outputs: int


FULL = ModelShape(features=1024, vocab=5000, width=512, hidden=1024, blocks=6, rank=8, outputs=1000)
QUICK = ModelShape(features=256, vocab=1000, width=128, hidden=256, blocks=3, rank=4, outputs=100)


class LoRALinear(nn.Module):
    """A linear layer with a LoRA-style low-rank adapter (``base`` + ``lora_B @ lora_A``)."""

    def __init__(self, fan_in: int, fan_out: int, rank: int) -> None:
        super().__init__()
        self.base = nn.Linear(fan_in, fan_out)
        self.lora_A = nn.Parameter(torch.randn(rank, fan_in) * 0.01)
        self.lora_B = nn.Parameter(torch.zeros(fan_out, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.base(x) + (x @ self.lora_A.T) @ self.lora_B.T
        return out


class Block(nn.Module):
    """Pre-norm MLP block: LayerNorm, Linear (LoRA), GELU, Linear (LoRA), residual."""

    def __init__(self, width: int, hidden: int, rank: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = LoRALinear(width, hidden, rank)
        self.fc2 = LoRALinear(hidden, width, rank)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))
        return out


class SyntheticModel(nn.Module):
    """Tabular features and a token sequence in, class scores out (registration = forward order)."""

    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.input = nn.Linear(shape.features, shape.width)  # the first layer: sees raw features
        self.embed = nn.Embedding(shape.vocab, shape.width)
        self.blocks = nn.ModuleList(Block(shape.width, shape.hidden, shape.rank) for _ in range(shape.blocks))
        self.norm = nn.LayerNorm(shape.width)
        self.head = nn.Linear(shape.width, shape.outputs)  # its bias leaks the label distribution

    def forward(self, features: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        x = self.input(features) + self.embed(tokens).mean(dim=1)
        for block in self.blocks:
            x = block(x)
        out: torch.Tensor = self.head(self.norm(x))
        return out


def interleaved(tasks: dict[str, Callable[[], None]], runs: int) -> dict[str, c.Stat]:
    """Time every task ``runs`` times (after one untimed call each), interleaved, order rotated per run,
    so that all of them see the same state of this shared machine."""
    for fn in tasks.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in tasks}
    for rep in range(runs):
        for name in c.rotated(list(tasks), rep):
            times[name].append(c.timed(tasks[name]))
    return {name: c.Stat(values) for name, values in times.items()}


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.2f}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_output_args(parser)
    parser.add_argument(
        "--runs", type=int, default=None, help="timed runs per measurement (default 31; 5 with --quick)"
    )
    return parser.parse_args(argv)


@dataclass
class TileResult:
    """What was measured for one tile."""

    tile: tuple[int, int]
    shards: int
    mbytes: float
    times: dict[str, c.Stat]
    chosen: dict[str, Counter[str]]  # origin -> zone -> shards
    classes: Counter[str] = field(default_factory=Counter)


def measure_tile(
    tile: tuple[int, int],
    model: nn.Module,
    state: dict[str, Any],
    classifier: SensitivityClassifier,
    router: Router,
    runs: int,
) -> TileResult:
    """Classify, route (per origin), ``Policy.decide`` and digest the shards of ``state`` cut by ``tile``."""
    protection = ShardProtection()
    plan = ShardPlan.from_state_dict(state, tile)
    shards = plan.split(state)
    classes: dict[str, Classification] = classifier.classify(plan, model)

    def digest_all() -> None:
        for array in shards.values():
            shard_digest(array)

    def classify() -> None:
        classifier.classify(plan, model)

    def route(origin: str) -> None:
        router.route_plan(classes, origin, protection)

    def decide(origin: str) -> None:
        for cl in classes.values():
            router.policy.decide(cl.shard_class, origin, protection)

    tasks: dict[str, Callable[[], None]] = {"classify": classify, "digest": digest_all}
    for origin in ORIGINS:
        tasks[f"route {origin}"] = functools.partial(route, origin)
        tasks[f"decide {origin}"] = functools.partial(decide, origin)
    times = interleaved(tasks, runs)
    chosen = {origin: Counter(d.zone for d in router.route_plan(classes, origin, protection)) for origin in ORIGINS}
    print(f"  tile {tile[0]}x{tile[1]}: {len(plan):,} shards done", flush=True)
    return TileResult(
        tile, len(plan), plan.nbytes / c.MB, times, chosen, Counter(cl.shard_class for cl in classes.values())
    )


HEADERS = [
    "tile",
    "shards",
    "origin",
    "classify ms",
    "route ms (min-max)",
    "policy.decide alone ms",
    "decisions/s (route)",
    "decisions/s (classify+route)",
    "digest ms",
    "route / digest",
    "classify+route / digest",
    "zones chosen",
]


def table(results: list[TileResult]) -> list[list[str]]:
    """One row per tile and origin."""
    rows = []
    for r in results:
        t_classify, t_digest = r.times["classify"], r.times["digest"]
        for origin in ORIGINS:
            t_route, t_decide = r.times[f"route {origin}"], r.times[f"decide {origin}"]
            both = t_classify.median + t_route.median
            rows.append(
                [
                    f"{r.tile[0]}x{r.tile[1]}",
                    f"{r.shards:,}",
                    origin,
                    _ms(t_classify.median),
                    f"{_ms(t_route.median)} ({_ms(t_route.min)}-{_ms(t_route.max)})",
                    _ms(t_decide.median),
                    f"{r.shards / t_route.median:,.0f}",
                    f"{r.shards / both:,.0f}",
                    _ms(t_digest.median),
                    f"{t_route.median / t_digest.median:.2%}",
                    f"{both / t_digest.median:.2%}",
                    ", ".join(f"{z} {k:,}" for z, k in sorted(r.chosen[origin].items())),
                ]
            )
    return rows


def summary(r: TileResult) -> dict[str, float]:
    """The figures of one tile the interpretation and ``--json`` use (medians; ratios over origins)."""
    digest = r.times["digest"].median
    routes = [r.times[f"route {origin}"].median for origin in ORIGINS]
    decides = [r.times[f"decide {origin}"].median for origin in ORIGINS]
    return {
        "shards": float(r.shards),
        "classify": r.times["classify"].median,
        "digest": digest,
        "route_max": max(routes),
        "route_max_ratio": max(routes) / digest,
        "route_min_ratio": min(routes) / digest,
        "mbytes": r.mbytes,
        "decide_share": statistics.median(d / t for d, t in zip(decides, routes, strict=True)),
        "us_per_decision": statistics.median(t / r.shards for t in routes) * 1e6,
    }


def all_local(results: list[TileResult]) -> bool:
    """Whether every shard went to the zone in the site's own region."""
    return all(set(r.chosen[origin]) == {LOCAL_ZONE[origin]} for r in results for origin in ORIGINS)


def outliers(results: list[TileResult]) -> bool:
    """Whether some routing run took over three times the median."""
    return any(
        r.times[f"route {origin}"].max > 3 * r.times[f"route {origin}"].median for r in results for origin in ORIGINS
    )


def interpretation(results: list[TileResult], params: int) -> str:
    """What the figures say, in words."""
    default, fine = summary(results[0]), summary(results[-1])
    met = default["route_max_ratio"] < GOAL
    counts = results[0].classes
    sentences = [
        f"Goal (routing a 10 M-parameter model must cost well under 1 % of a round's digest work): "
        f"{'met' if met else 'not met'}. With fedshard's default 256x256 tile the {params / 1e6:.1f} M-parameter "
        f"model has {default['shards']:,.0f} shards; routing them all takes "
        f"{default['route_min_ratio']:.2%}-{default['route_max_ratio']:.2%} of the time it takes to digest them "
        f"(digest: {default['digest'] * 1e3:,.1f} ms for {default['mbytes']:.1f} MB, "
        f"{default['mbytes'] / default['digest']:,.0f} MB/s), about {default['us_per_decision']:.1f} µs per "
        "decision. Counting both of the site's hashing passes in a round (the manifest before the push and the "
        f"check of the downloaded aggregate), routing is still {default['route_min_ratio'] / 2:.2%}-"
        f"{default['route_max_ratio'] / 2:.2%} of it.",
        f"The policy lookup itself (`Policy.decide`) takes only {default['decide_share']:.0%} of the routing time; "
        "the rest is "
        "the Python around it. The router decides once per (class, origin, protection) and reuses that for every "
        "shard with the same triple, so what remains per shard is a dictionary lookup and building one "
        "`RouteDecision` (a frozen dataclass with its region list).",
        f"Classification with the model takes {default['classify'] * 1e3:,.2f} ms "
        f"({default['classify'] / default['digest']:.2%} of the digest work); it depends on the plan and the "
        "model only, not on the origin or the round, so a site can do it once per run.",
        f"With 64x64 tiles ({fine['shards']:,.0f} shards) routing costs "
        f"{fine['route_min_ratio']:.2%}-{fine['route_max_ratio']:.2%} of digesting: routing has a fixed cost per "
        f"shard, digesting a cost per byte plus a per-shard overhead ({fine['digest'] * 1e3:,.1f} ms for the same "
        f"bytes in {fine['shards']:,.0f} shards against {default['digest'] * 1e3:,.1f} ms in "
        f"{default['shards']:,.0f})"
        + (
            ", so smaller shards make routing relatively dearer."
            if fine["route_max_ratio"] > default["route_max_ratio"]
            else "; here digesting's per-shard overhead grew at least as fast."
        ),
        f"Classes at 256x256: {', '.join(f'{k} {v:,}' for k, v in sorted(counts.items()))} shards.",
        "Every shard went to the zone in the site's own region: the default policy keeps EU personal shards in the "
        "EU and lets everything else go anywhere, and the router prefers a zone in the site's own region."
        if all_local(results)
        else "Not every shard went to the zone in the site's own region (see the last column).",
    ]
    if outliers(results):
        sentences.append(
            "The rare slow runs (maxima in brackets) are Python's full (generation-2) garbage collections: "
            f"routing a plan allocates a few objects per shard, and a full collection scans every object of the "
            f"process ({len(gc.get_objects()):,} here, torch's included); the medians leave them out."
        )
    return " ".join(sentences)


def headline(results: list[TileResult], params: int) -> dict[str, Any]:
    """The ``--json`` figures, for the default 256x256 tile (medians)."""
    default = summary(results[0])
    return {
        "params": params,
        "shards": int(default["shards"]),
        "route_ms": default["route_max"] * 1e3,
        "decisions_per_s": default["shards"] / default["route_max"],
        "us_per_decision": default["us_per_decision"],
        "route_vs_digest": default["route_max_ratio"],
        "classify_ms": default["classify"] * 1e3,
        "all_local": all_local(results),
    }


def main(argv: list[str] | None = None) -> int:
    """Measure, then publish (see the module docstring)."""
    args = parse_args(argv)
    runs = args.runs or (5 if args.quick else 31)
    shape = QUICK if args.quick else FULL

    desc = c.machine_description()
    ticks0 = c.cpu_ticks()
    desc["numpy"] += f", torch {torch.__version__}"
    torch.manual_seed(0)
    model = SyntheticModel(shape)
    state = model.state_dict()
    params = sum(int(t.numel()) for t in state.values())
    print(f"model: {params:,} parameters in {len(state)} tensors; {runs} runs + 1 warm-up per measurement", flush=True)

    config = ResidencyConfig()
    classifier = SensitivityClassifier.from_config(config)
    router = Router(Policy.from_config(config), ZONES, reducing_zone=REDUCING_ZONE)
    results = [measure_tile(tile, model, state, classifier, router, runs) for tile in TILES]
    c.publish(
        args,
        SECTION,
        "Routing decisions per second (residency)",
        f"{runs} timed runs per measurement after 1 warm-up each; all measurements of a tile interleaved, order "
        "rotated per run; medians (route: min-max)",
        desc,
        notes=[
            f"- Model: synthetic torch model, {params:,} float32 parameters ({params * 4 / c.MB:.1f} MB) in "
            f"{len(state)} tensors: first `Linear({shape.features}, {shape.width})`, `Embedding({shape.vocab}, "
            f"{shape.width})`, {shape.blocks} blocks of `LayerNorm` + `Linear({shape.width}, {shape.hidden})` + "
            f"`Linear({shape.hidden}, {shape.width})` each with rank-{shape.rank} `lora_A`/`lora_B` tensors, "
            f"`LayerNorm`, output `Linear({shape.width}, {shape.outputs})` with bias; all parameters trainable.",
            "- `classify` = `SensitivityClassifier.from_config(ResidencyConfig()).classify(plan, model)`; `route` = "
            "`Router(Policy.from_config(ResidencyConfig()), [eu-central EU, us-east US, sg-1 SG], "
            "reducing_zone='us-east').route_plan(classes, origin, ShardProtection())`; `digest` = "
            "`shard_digest` of every shard (SHA-256), as `build_manifest` does once per update. "
            "Decisions/s = shards / median time. Percentages are ratios of medians.",
            c.steal_note(ticks0),
        ],
        headers=HEADERS,
        rows=table(results),
        interpretation=interpretation(results, params),
        headline=headline(results, params),
        console_title=f"Routing a {params / 1e6:.1f} M-parameter model, median of {runs}",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
