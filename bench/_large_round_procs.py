"""The large-round benchmark's processes: sites and zones in child processes of their own, the
phases timed inside them, and the round clock (see ``large_round.py``)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import _common as c

__all__ = ["Phases", "ProcessSiteGateway", "RoundClock", "SiteProcess", "ZoneProcess", "reset_peak"]

SCRIPT = Path(__file__).resolve().with_name("large_round.py")
"""The benchmark script: each site and zone child runs it with ``--site-child`` or ``--zone-child``."""


# timing the library's calls in a child process ------------------------------------------------------
class Phases:
    """Seconds per phase since the last :meth:`take`: the wall time during which at least one
    call of the phase was running (nested calls and calls in parallel threads, such as a
    site's pushes to several zones, count once)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.missing: list[str] = []
        self._running: Counter[str] = Counter()
        self._since: dict[str, float] = {}
        self._lock = threading.Lock()

    def _enter(self, phase: str) -> None:
        with self._lock:
            if self._running[phase] == 0:
                self._since[phase] = time.perf_counter()
            self._running[phase] += 1

    def _leave(self, phase: str) -> None:
        with self._lock:
            self._running[phase] -= 1
            if self._running[phase] == 0:
                self.seconds[phase] += time.perf_counter() - self._since.pop(phase)

    def wrap(self, module: str, path: str, phase: str) -> None:
        """Time every call of ``module.path`` as ``phase`` (a missing target is noted, not fatal)."""
        import functools
        import importlib

        owner: Any = importlib.import_module(module)
        *parents, name = path.split(".")
        for p in parents:
            owner = getattr(owner, p, None)
        target = getattr(owner, name, None) if owner is not None else None
        if target is None:
            self.missing.append(f"{module}.{path}")
            return

        @functools.wraps(target)
        def timed(*args: Any, **kwargs: Any) -> Any:
            self._enter(phase)
            try:
                return target(*args, **kwargs)
            finally:
                self._leave(phase)

        setattr(owner, name, timed)

    def take(self) -> dict[str, float]:
        """The seconds so far, reset (between messages: no call is running)."""
        with self._lock:
            out = dict(self.seconds)
            self.seconds.clear()
        return out


def reset_peak() -> None:
    # VmHWM back to the current RSS; where that is refused the peak is the process's so far (an upper bound)
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def _child_env() -> dict[str, str]:
    return dict(os.environ, GRPC_VERBOSITY="ERROR", PYTHONUNBUFFERED="1", PYTHONPATH=str(c.REPO))


class SiteProcess:
    """One site in its own process, reached through its stdin/stdout."""

    def __init__(self, site_id: str, config_path: Path, state_root: Path) -> None:
        self.site_id = site_id
        argv = [sys.executable, str(SCRIPT), "--site-child", site_id, "--config", str(config_path)]
        argv += ["--state-root", str(state_root)]
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=c.REPO, env=_child_env()
        )
        self.missing: list[str] = []
        self.base_rss = 0  # its RSS once assembled, before any message

    def ready(self) -> None:
        """Wait for the site to be assembled."""
        ready = self._read()
        self.missing, self.base_rss = ready["missing"], int(ready["rss"])

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"site process {self.site_id} ended (exit {self.proc.wait()})")
        return dict(json.loads(line))

    def call(self, kind: str, message: bytes) -> dict[str, Any]:
        """Send one message, return what the site process measured (and its reply)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"kind": kind, "message": message.decode()}) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        """Close its stdin; wait for it."""
        _end(self.proc)


def _end(proc: subprocess.Popen[str]) -> None:
    """Close a child's stdin (it exits then); wait for it, killing it after a minute."""
    if proc.stdin is not None:
        proc.stdin.close()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class ProcessSiteGateway:
    """A SiteGateway over site processes (records what each measured).

    Before a round's train messages it marks the ``clock``. ``at_once(round)`` says whether a
    round's messages go to every site at once (a thread per site, as a deployment's SuperNodes
    receive them) or to one site after the other.
    """

    def __init__(
        self, sites: Mapping[str, SiteProcess], clock: RoundClock, at_once: Callable[[int], bool] = lambda rnd: False
    ) -> None:
        self.sites = dict(sites)
        self.clock = clock
        self.at_once = at_once
        self.records: list[dict[str, Any]] = []

    def nodes(self) -> list[str]:
        """The site ids."""
        return list(self.sites)

    def send(self, kind: Any, messages: Mapping[str, Any], timeout: float) -> dict[str, Any]:
        """Each message to its site: all at once or in turn (``at_once``)."""
        from fedshard.protocol.messages import SiteFailure, decode, encode
        from fedshard.transports.flower.records import REPLIES

        def one(node: str, message: Any) -> tuple[str, Any, dict[str, Any]]:
            measured = self.sites[node].call(kind.value, encode(message))
            return node, decode(REPLIES[kind], measured.pop("reply")), measured

        rounds = {int(getattr(m, "round", 0)) for m in messages.values()}
        if kind.value == "train":
            for rnd in rounds:
                self.clock.mark(rnd)
        if len(messages) > 1 and any(self.at_once(r) for r in rounds):
            with ThreadPoolExecutor(max_workers=len(messages)) as pool:
                answered = list(pool.map(lambda item: one(*item), messages.items()))
        else:
            answered = [one(node, message) for node, message in messages.items()]
        out: dict[str, Any] = {}
        for node, reply, measured in answered:
            if getattr(reply, "ok", True) is False:
                out[node] = SiteFailure(reason=str(reply.reason))
                continue
            pushed = sum(p.nbytes for p in getattr(reply, "pushes", []))
            rnd = int(getattr(messages[node], "round", 0))
            self.records.append({"kind": kind.value, "round": rnd, "site": node, "pushed_bytes": pushed} | measured)
            out[node] = reply
        return out


class ZoneProcess:
    """One zone in its own process."""

    def __init__(self, name: str, config_path: Path, store_root: Path, keys_file: Path) -> None:
        self.name = name
        argv = [sys.executable, str(SCRIPT), "--zone-child", name, "--config", str(config_path)]
        argv += ["--state-root", str(store_root), "--site-keys", str(keys_file)]
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=c.REPO, env=_child_env()
        )
        started = self._read()
        self.endpoint = f"127.0.0.1:{started['port']}"
        self.missing: list[str] = started["missing"]
        self.staging_bytes = int(started["staging_bytes"])
        self.base_rss = c.status_bytes("VmRSS", self.proc.pid)

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"zone process {self.name} ended (exit {self.proc.wait()})")
        return dict(json.loads(line))

    def phases(self) -> dict[str, float]:
        """Its phase seconds since the last call."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        return dict(self._read()["phases"])

    def peak_rss(self) -> int:
        """Its peak RSS so far (bytes)."""
        return c.status_bytes("VmHWM", self.proc.pid)

    def close(self) -> None:
        """Close its stdin; wait for it."""
        _end(self.proc)


# one federation run ---------------------------------------------------------------------------------
class RoundClock:
    """Where each round starts: the moment its train messages are sent (marked by the gateway).

    A round is then everything up to the next round's train messages: its messages (which
    catch each site up to the round before, train and push), the zones' close, and the
    coordinator's work between; the zones' phases over the same span are read at the
    next mark.
    """

    def __init__(self, zones: Mapping[str, ZoneProcess]) -> None:
        self.zones = zones
        self._marks: dict[int, tuple[float, dict[str, float]]] = {}

    def mark(self, rnd: int) -> None:
        """Round ``rnd``'s train messages are about to be sent."""
        zone: dict[str, float] = defaultdict(float)
        for z in self.zones.values():
            for phase, s in z.phases().items():
                zone[phase] += s
        self._marks[rnd] = (time.perf_counter(), dict(zone))

    @property
    def rounds(self) -> list[dict[str, Any]]:
        """Every round followed by another: its wall seconds and its zones' phases."""
        return [
            {"round": r, "seconds": self._marks[r + 1][0] - t, "zone": self._marks[r + 1][1]}
            for r, (t, _) in sorted(self._marks.items())
            if r + 1 in self._marks
        ]
