"""The README's list of the modules one shard passes through is the code's: a deployment-path
round (gRPC zones, CKKS on the personal class, update-level DP, a partial sum forwarded to the
reducing zone) is traced, and every module the README lists for a step is entered in that step,
25 modules at most in all. (Within a step, which helper is entered first depends on what a
process has cached, so the order inside a step is the README's reading order, not checked.)"""

from __future__ import annotations

import re
import sys
import threading
from collections import defaultdict
from pathlib import Path
from types import FrameType
from typing import Any

from fedshard.assembly import make_site, running_zones
from fedshard.assembly.routing import FederationRouting
from fedshard.config import FederationConfig
from fedshard.coordinator.coordinator import Coordinator
from fedshard.transports.inprocess import InProcessSiteGateway
from fedshard.zone.rpc.client import GrpcZoneClient

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = str(ROOT / "fedshard") + "/"

STEP_ENTRIES = {  # where each step begins, as (module, function); a step's modules are those entered below it
    "release": [("site/site.py", "_train_and_push")],
    "push": [("zone/rpc/client.py", "push"), ("zone/rpc/service.py", "Push")],
    "intake": [("zone/rpc/service.py", "Push")],
    "fold": [("zone/rpc/service.py", "Push")],
    "forward": [("zone/rpc/service.py", "CloseRound"), ("zone/rpc/service.py", "Forward")],
    "publish": [("zone/rpc/service.py", "CloseRound")],
    "fetch": [("site/_apply.py", "fetch_view"), ("zone/rpc/service.py", "FetchAggregate")],
    "apply": [("site/site.py", "_catch_up")],
    "save": [("site/site.py", "_save")],
}


def _readme_steps() -> dict[str, list[str]]:
    text = (ROOT / "README.md").read_text()
    table = text.split("<!-- round-trip -->")[1].split("<!-- /round-trip -->")[0]
    steps = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0] in STEP_ENTRIES:
            steps[cells[0]] = re.findall(r"`([^`]+)`", cells[1])
    return steps


class _Trace:
    """The fedshard modules each thread enters below each step entry, in first-entry order."""

    def __init__(self) -> None:
        self.entries = {entry for entries in STEP_ENTRIES.values() for entry in entries}
        self.entered: dict[tuple[str, str], list[str]] = defaultdict(list)
        self._local = threading.local()

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        path = frame.f_code.co_filename
        if not path.startswith(PACKAGE) or frame.f_code.co_name == "<module>":
            return
        module = path[len(PACKAGE) :]
        stack = self._local.__dict__.setdefault("stack", [])
        if event == "call":
            key = (module, frame.f_code.co_name)
            if key in self.entries:
                stack.append((key, frame))
            if stack and module not in self.entered[stack[-1][0]]:
                self.entered[stack[-1][0]].append(module)
        elif event == "return" and stack and stack[-1][1] is frame:
            stack.pop()


def test_the_readme_lists_the_modules_one_shard_passes_through(tmp_path: Path) -> None:
    from fedshard.crypto.he import he_init

    steps = _readme_steps()
    assert list(steps) == list(STEP_ENTRIES)
    listed = {m for modules in steps.values() for m in modules}
    assert len(listed) <= 25, sorted(listed)

    he_init(tmp_path / "keys")
    config = FederationConfig.model_validate(
        {
            "federation": {"name": "trip", "seed": 5, "rounds": 2, "min_sites": 2, "round_timeout_s": 60},
            "task": {"target": "tests.toy_task:task", "options": {"examples": 40}},
            "training": {"local_epochs": 2, "batch_size": 8, "learning_rate": 0.05},
            "sharding": {"tile": [4, 4]},
            "zones": [{"name": n, "region": r} for n, r in (("eu-central", "EU"), ("us-east", "US"))],
            "reducing_zone": "eu-central",
            "sites": [{"id": s, "jurisdiction": j} for s, j in (("eu-a", "EU"), ("eu-b", "EU"), ("us-a", "US"))],
            "residency": {"encrypt": ["personal"]},
            "he": {"keys": str(tmp_path / "keys"), "value_range": 8.0, "max_sites": 8},
            "privacy": {
                "update_level": {"enabled": True, "clip_norm": 1.0, "noise_multiplier": 1.0},
                "budget": {"epsilon": 50.0, "delta": 1e-3},
            },
        }
    )
    routing = FederationRouting(config)
    trace = _Trace()
    with running_zones(config, tmp_path / "zones") as endpoints:
        sites = {s.id: make_site(config, s.id, tmp_path / "sites", routing) for s in config.sites}
        gateway = InProcessSiteGateway(sites)
        zones = {n: GrpcZoneClient(ep) for n, ep in endpoints.items()}
        sys.setprofile(trace)
        threading.setprofile(trace)
        try:
            result = Coordinator(config, gateway, zones, endpoints).run()
        finally:
            sys.setprofile(None)
            threading.setprofile(None)  # type: ignore[arg-type]
            gateway.close()
            for zone in zones.values():
                zone.close()
    assert len(result.rounds) == 2 and not result.stopped_reason

    for step, modules in steps.items():
        entered = [m for entry in STEP_ENTRIES[step] for m in trace.entered[entry]]
        missing = [m for m in modules if m not in entered]
        assert not missing, f"{step}: the README lists {missing}, which the step never entered"
