"""Running a deployment's processes (``fedshard aggregator up``, ``fedshard site up``) from a test."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from fedshard.deploy._processes import descendants

FEDSHARD = [sys.executable, "-m", "fedshard.cli.main"]


def env() -> dict[str, str]:
    """The environment of a fedshard process: no Flower telemetry or update check, wide output."""
    out = dict(os.environ)
    out.update(FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1", COLUMNS="200")
    return out


def fedshard(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``fedshard ARGS`` to completion."""
    return subprocess.run([*FEDSHARD, *args], cwd=cwd, env=env(), capture_output=True, text=True, timeout=timeout)


def start(args: list[str], cwd: Path, log: Path) -> subprocess.Popen[bytes]:
    """Start ``fedshard ARGS`` in its own session, its output appended to ``log``."""
    with log.open("ab") as out:
        return subprocess.Popen(
            [*FEDSHARD, *args], cwd=cwd, env=env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def kill_tree(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to ``proc`` and every process it started."""
    for pid in [proc.pid, *descendants(proc.pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def stop(procs: Iterable[subprocess.Popen[bytes]]) -> None:
    """SIGTERM every process still running (last started first), then kill what is left after 30 s."""
    procs = list(procs)
    for proc in reversed(procs):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            kill_tree(proc)


def events(root: Path) -> list[dict[str, Any]]:
    """The events of the aggregator's latest run under ``root/runs/aggregator`` (none yet: [])."""
    runs = sorted((root / "runs" / "aggregator").glob("run-*/events.jsonl"))
    if not runs:
        return []
    return [json.loads(line) for line in runs[-1].read_text().splitlines() if line.strip()]


def wait_for(predicate: Any, timeout: float, what: str, procs: list[subprocess.Popen[bytes]]) -> None:
    """Poll ``predicate`` each second until it holds; fail after ``timeout`` s or once ``procs[0]`` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if procs[0].poll() is not None:
            break
        time.sleep(1.0)
    raise AssertionError(f"timed out waiting for {what}")


def adapter_layout(
    root: Path, task: dict[str, Any], training: dict[str, Any], sites: list[str], rounds: int
) -> dict[str, Path]:
    """The shipped loopback deployment cut to an adapter task (``task``, ``training``) on ``sites``
    and the EU and US zones: each site seals its base int8; plaintext, no DP (the released bytes
    are the adapters' own). Keys are provisioned under ``root/keys``; the config paths by party."""
    from fedshard.config import load_federation
    from fedshard.deploy.keys import provision
    from fedshard.deploy.loopback import write_loopback_layout

    def edit(data: dict[str, Any]) -> None:
        data["federation"].update(rounds=rounds, min_sites=len(sites), round_timeout_s=300)
        data["task"] = task
        data["training"] = training
        data["sharding"] = {"tile": [64, 64]}
        data["store"] = {"base": "int8"}
        data.pop("privacy", None)
        data.pop("residency", None)
        data["zones"] = [z for z in data["zones"] if z["region"] in ("EU", "US")]
        data["sites"] = [s for s in data["sites"] if s["id"] in sites]
        data["deployment"].update(wait_s=300)

    paths = write_loopback_layout(Path(__file__).resolve().parents[1] / "configs", root, edit=edit)
    provision(load_federation(paths["aggregator"]), root / "keys")
    return paths


def run_deployed(root: Path, paths: dict[str, Path], sites: list[str]) -> None:
    """``aggregator up`` and ``site up`` for each of ``sites`` in ``root``, until the aggregator ends
    (it must end well); every process stopped after."""
    logs = root / "logs"
    logs.mkdir(exist_ok=True)
    aggregator = start(["aggregator", "up", "--config", str(paths["aggregator"])], root, logs / "agg.log")
    procs = [aggregator]
    try:
        for site in sites:
            procs.append(start(["site", "up", "--config", str(paths[site])], root, logs / f"{site}.log"))
        wait_for(lambda: aggregator.poll() is not None, 900, "the aggregator to finish", procs)
        assert aggregator.returncode == 0, (logs / "agg.log").read_text()[-3000:]
    finally:
        stop(procs)
