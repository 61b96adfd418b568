"""One lying site in the demo federation: its accuracy against the honest run's.

Runs ``configs/demo.yaml`` as ``fedshard simulate`` does (in-process engine, the zones'
real checks and signatures; the sites call the zone objects directly) once honestly
and once per attack, one site lying (a member: its own certificate and signing key):

* ``over-report``: it reports ``--examples`` training examples (10^6) when the
  coordinator asks who it is, so the coordinator fixes it a large weight;
* ``scale``: it pushes its update multiplied by ``--scale`` (100), under a manifest it
  signs with its own key, at the weight the coordinator fixed;
* ``both``: the two together.

It prints, for each run, the accuracy of the honest sites' models on their own test
records (85 in the demo with ``charite-berlin`` lying: one record is 0.012), measured from
the honest sites' evaluations, not from the federation's figures (which the lying site's
weight enters): after round 4, after the last round and its mean over the last five
rounds; the rounds aborted and the pushes the zones clipped. ``--set KEY=VALUE``
changes the config of every run (YAML values), e.g. ``--set
aggregation.max_weight_over_median=null --set aggregation.max_norm_over_median=null`` for
the rules before issue 32 (no weight relative to the median, no norm bound)::

    .venv/bin/python bench/lying_site.py [--quick] [--json] [--output FILE] [--sites S ...] [--rounds N]
                                         [--set KEY=VALUE ...]

By default every run is made twice, with the defaults and with the rules before issue 32
(``BEFORE``); the section goes to BENCHMARKS.md. ``--json`` prints ``honest_accuracy``,
``lying_accuracy`` (the worst attack's, defaults), ``gap_pp``, ``gap_before_pp`` and
``runs_stopped`` on the last line.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from collections.abc import Callable, Generator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _common as c

import fedshard.simulate.run as simulate_run
from fedshard.assembly import SIGNING_KEY_FILE
from fedshard.config import FederationConfig, load_federation
from fedshard.crypto.signing import load_signing_key
from fedshard.integrity import Manifest, build_manifest
from fedshard.protocol.channels import ZoneClient, ZoneConnector
from fedshard.protocol.messages import EvaluateReport, MessageKind, SiteInfo, TrainReport
from fedshard.protocol.rounds import PushReceipt, ShardPayload

ATTACKS = ("honest", "over-report", "scale", "both")


class ScaledClient:
    """A zone client that pushes the site's plaintext update ×``scale``, re-signed with the site's key."""

    def __init__(self, inner: ZoneClient, scale: float, key_file: Path) -> None:
        self._inner, self._scale, self._key_file = inner, scale, key_file

    def push(self, manifest: Manifest, token: str, shards: Mapping[str, ShardPayload]) -> PushReceipt:
        scaled = {s: v if isinstance(v, bytes) else np.asarray(v) * np.float32(self._scale) for s, v in shards.items()}
        forged = build_manifest(
            site_id=manifest.site_id,
            round=manifest.round,
            plan_digest=manifest.plan_digest,
            base_version=manifest.base_version,
            zone=manifest.zone,
            weight=manifest.weight,
            shards=scaled,
            classes={e.shard_id: e.shard_class for e in manifest.shards},
            policy_digest=manifest.policy_digest,
            encrypted=frozenset(e.shard_id for e in manifest.shards if e.encrypted),
        )
        return self._inner.push(forged.signed(load_signing_key(self._key_file)), token, scaled)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class Watched:
    """A site as it runs (``examples``: the number of training examples it claims when asked
    who it is, None: the truth); the evaluations of honest sites go to ``evaluations``."""

    def __init__(self, inner: Any, examples: int | None, evaluations: dict[int, list[tuple[float, int]]] | None):
        self._inner, self._examples, self._evaluations = inner, examples, evaluations

    def handle(self, kind: MessageKind, message: Any) -> Any:
        return self._watched(self._inner.handle(kind, message))

    def staged(self, kind: MessageKind, message: Any) -> Generator[None, None, Any]:
        """As the simulation's gateway runs a site (in stages around its durability barrier)."""
        reply = yield from self._inner.staged(kind, message)
        return self._watched(reply)

    def _watched(self, reply: Any) -> Any:
        """``reply``, its evaluation noted, its examples rewritten for a liar."""
        if isinstance(reply, SiteInfo) and self._examples is not None:
            return reply.model_copy(update={"num_examples": self._examples})
        evaluation = reply.evaluation if isinstance(reply, TrainReport) else reply  # carried by the next train
        if isinstance(evaluation, EvaluateReport) and self._evaluations is not None:
            self._evaluations.setdefault(evaluation.round, []).append((evaluation.accuracy, evaluation.num_examples))
        return reply

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


_MAKE_SITE = simulate_run.make_site


def _lying_make_site(
    attacker: str, examples: int | None, scale: float | None, evaluations: dict[int, list[tuple[float, int]]]
) -> Callable[..., Any]:
    real = _MAKE_SITE  # the real one: each run's wrapper wraps it, never the previous run's wrapper

    def make_site(
        config: FederationConfig,
        site_id: str,
        state_root: str | Path,
        routing: Any = None,
        *,
        connect: Any = None,
        **kwargs: Any,
    ) -> Any:
        if site_id == attacker and scale is not None:
            inner: ZoneConnector = connect
            key_file = Path(state_root) / site_id / SIGNING_KEY_FILE

            def connect(name: str, endpoint: str) -> ZoneClient:
                return ScaledClient(inner(name, endpoint), scale, key_file)  # type: ignore[return-value]

        site = real(config, site_id, state_root, routing, connect=connect, **kwargs)
        liar = site_id == attacker
        return Watched(site, examples if liar else None, None if liar else evaluations)

    return make_site


def _pooled(evaluations: list[tuple[float, int]]) -> float:
    """Accuracy over the honest sites' test records (their evaluations pooled)."""
    return sum(a * n for a, n in evaluations) / sum(n for _, n in evaluations)


def _config(path: Path, rounds: int, settings: list[str]) -> FederationConfig:
    data = load_federation(path).model_dump(mode="json")
    data["federation"]["rounds"] = rounds
    for setting in settings:
        key, _, value = setting.partition("=")
        *parents, leaf = key.split(".")
        target = data
        for part in parents:
            target = target.setdefault(part, {})
        target[leaf] = yaml.safe_load(value)
    return FederationConfig.model_validate(data)


def run(config: FederationConfig, attack: str, attacker: str, examples: int, scale: float) -> dict[str, Any]:
    """One run of ``config`` under ``attack``; its accuracy per round and what the zones clipped."""
    lie_examples = examples if attack in ("over-report", "both") else None
    lie_scale = scale if attack in ("scale", "both") else None
    evaluations: dict[int, list[tuple[float, int]]] = {}
    simulate_run.make_site = _lying_make_site(attacker, lie_examples, lie_scale, evaluations)  # type: ignore[assignment]
    try:
        with tempfile.TemporaryDirectory(prefix="fedshard-lying-") as out:
            summary = simulate_run.simulate(config, out)
            audit = [json.loads(line) for p in Path(out, "zones").glob("*/audit.jsonl") for line in p.open()]
    finally:
        simulate_run.make_site = _MAKE_SITE
    finished = [h["round"] for h in summary["history"]]
    accuracy = [_pooled(evaluations[r]) for r in finished]
    clipped = [r for r in audit if r.get("decision") == "accepted" and "norm_scale" in r]
    return {
        "attack": attack,
        "rounds": len(accuracy),
        "aborted": len(summary["aborted_rounds"]),
        "accuracy_round_4": accuracy[3] if len(accuracy) >= 4 else None,
        "final_accuracy": accuracy[-1] if accuracy else None,
        "mean_last_5": sum(accuracy[-5:]) / len(accuracy[-5:]) if accuracy else None,
        "pushes_clipped": {
            "attacker": sum(1 for r in clipped if r.get("site") == attacker),
            "honest": sum(1 for r in clipped if r.get("site") != attacker),
        },
        "stopped_reason": summary["stopped_reason"],
    }


BEFORE = ["aggregation.max_weight_over_median=null", "aggregation.max_norm_over_median=null"]
"""The rules before issue 32: no weight relative to the median, no norm bound."""
SITES = ("charite-berlin", "mayo-rochester")
HEADERS = [
    "lying site",
    "attack",
    "rules",
    "after round 4",
    "last round",
    "mean of the last 5",
    "rounds (aborted)",
    "pushes clipped (attacker / honest)",
    "stopped",
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("configs/demo.yaml"))
    parser.add_argument("--sites", nargs="*", default=None, help=f"the lying sites, one at a time (default: {SITES})")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per run (default 20; 3 with --quick)")
    parser.add_argument("--examples", type=int, default=10**6)
    parser.add_argument("--scale", type=float, default=100.0)
    parser.add_argument("--attacks", nargs="*", default=None, choices=ATTACKS)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config change, YAML value")
    c.add_output_args(parser)
    return parser.parse_args(argv)


def _row(site: str, rules: str, r: dict[str, Any]) -> list[str]:
    clipped = r["pushes_clipped"]
    return [
        site,
        r["attack"],
        rules,
        _number(r["accuracy_round_4"]),
        _number(r["final_accuracy"]),
        _number(r["mean_last_5"]),
        f"{r['rounds']} ({r['aborted']})",
        f"{clipped['attacker']} / {clipped['honest']}",
        r["stopped_reason"][:80] or "-",
    ]


def main(argv: list[str] | None = None) -> int:
    """Run every lying site under every attack, with the defaults and with the rules before issue 32; publish."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    sites = args.sites or (SITES[:1] if args.quick else SITES)
    attacks = args.attacks or (["honest", "both"] if args.quick else list(ATTACKS))
    rounds = args.rounds or (3 if args.quick else 20)
    rules = {"defaults": args.set} if args.quick else {"defaults": args.set, "before issue 32": args.set + BEFORE}
    desc = c.machine_description()
    rows, runs = [], {}
    for site in sites:
        for name, settings in rules.items():
            config = _config(args.config, rounds, settings)
            for attack in attacks:
                result = run(config, attack, site, args.examples, args.scale)
                runs[(site, name, attack)] = result
                rows.append(_row(site, name, result))
    honest = [r["mean_last_5"] for (s, n, a), r in runs.items() if a == "honest" and n == "defaults"]
    lying = [r for (s, n, a), r in runs.items() if a != "honest" and n == "defaults"]
    before = [r for (s, n, a), r in runs.items() if a != "honest" and n != "defaults"]
    worst = min(lying, key=lambda r: r["mean_last_5"] or 0.0) if lying else None
    worst_before = min(before, key=lambda r: r["mean_last_5"] or 0.0) if before else None
    honest_accuracy = min(honest) if honest else float("nan")
    headline = {
        "honest_accuracy": honest_accuracy,
        "lying_accuracy": worst["mean_last_5"] if worst else float("nan"),
        "gap_pp": 100 * (honest_accuracy - (worst["mean_last_5"] or 0.0)) if worst else float("nan"),
        "gap_before_pp": 100 * (honest_accuracy - (worst_before["mean_last_5"] or 0.0)) if worst_before else None,
        "runs_stopped": sum(1 for r in lying if r["stopped_reason"]),
    }
    interpretation = (
        f"With the default rules the honest sites' accuracy (mean of the last 5 rounds) is {honest_accuracy:.4f} "
        f"without a liar and {headline['lying_accuracy']:.4f} under the worst attack "
        f"({worst['attack'] if worst else '-'}): {headline['gap_pp']:.1f} pp lower"
        + (f" (before issue 32: {headline['gap_before_pp']:.1f} pp)" if worst_before else "")
        + f"; {headline['runs_stopped']} run(s) with a liar stopped before its last round. The weight rule takes "
        "an over-reported count down to 4× the median; the norm bound clips a scaled update to 10× the median of "
        "the norms the zone accepted, which a site pushing a boosted update every round still uses to steer the "
        'model (SECURITY.md, "Malicious sites").'
    )
    c.publish(
        args,
        "lying_site",
        "One lying site in the demo federation (issue 32)",
        f"one run per lying site, attack and rules; {rounds} rounds each",
        desc,
        notes=[
            f"- Command: `{c.command_line()}`",
            f"- Config: `{args.config}`; attacks: over-report = {args.examples:,} examples claimed at discovery; "
            f"scale = the update ×{args.scale:g}, re-signed with the site's own key; both. Accuracy: the honest "
            "sites' evaluations pooled over their own test records.",
        ],
        headers=HEADERS,
        rows=rows,
        interpretation=interpretation,
        headline=headline,
        console_title="One lying site",
    )
    return 0


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


if __name__ == "__main__":
    raise SystemExit(main())
