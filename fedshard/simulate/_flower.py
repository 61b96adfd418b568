"""``fedshard simulate --engine flower``: the federation on Flower's simulation engine (Ray)."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path

from fedshard.config import load_federation
from fedshard.coordinator.events import EventKind, EventLog, replay, round_from_event
from fedshard.coordinator.results import RoundObserver, RunResult
from fedshard.errors import RoundError
from fedshard.protocol.messages import SiteInfo
from fedshard.simulate.ray_runtime import init_args, ray_address, start_ray
from fedshard.transports.flower.grid import ENGINE_STOPPED

__all__ = ["run_flower_simulation"]

log = logging.getLogger(__name__)

_ATTEMPTS = 2
"""Runs of the engine when one stops before any site answered (Ray's actors sometimes fail
on a loaded machine; a Ray that does not start at all is retried by
:func:`~fedshard.simulate.ray_runtime.start_ray`); a run that got its sites is never repeated."""

_ENGINE_STOP_WAIT_S = 30.0
"""How long the ServerApp may take to notice a stopped engine and end its run."""


def _run_engine(settings: dict[str, str], sites: int, events: EventLog, offset: int) -> None:
    """One run of Flower's simulation engine, logging to ``events`` after byte ``offset``;
    returns once the engine and the ServerApp have stopped."""
    from flwr.simulation import run_simulation

    from fedshard.transports.flower.client_app import create_client_app
    from fedshard.transports.flower.compat.delivery import install
    from fedshard.transports.flower.server_app import create_server_app

    install()  # one pass over the engine's stored messages per tick (Flower's scans each per node)
    engine_stopped = threading.Event()
    try:
        run_simulation(
            server_app=create_server_app(settings, engine_stopped=engine_stopped),
            client_app=create_client_app(settings),
            num_supernodes=sites,
            backend_config={
                "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                # site errors come back as error replies; actors' own chatter stays in Ray's logs
                # (Flower uses the runtime start_ray() began; these apply only if it starts its own)
                "init_args": init_args(ray_address()),
            },
        )
    finally:
        # the engine is gone: a ServerApp still waiting for replies ends now (it logs a stop event)
        engine_stopped.set()
        deadline = time.monotonic() + _ENGINE_STOP_WAIT_S
        while not _logged(events, offset, EventKind.STOP) and time.monotonic() < deadline:
            time.sleep(0.1)


def _logged(events: EventLog, offset: int, kind: EventKind) -> bool:
    """Whether an event of ``kind`` was logged after byte ``offset``."""
    batch, _ = events.read(offset)
    return any(e["event"] == kind for e in batch)


def _engine_failed(events: EventLog, offset: int) -> bool:
    """Whether the run logged after ``offset`` lost its engine before its sites answered
    (no start event; stopped, if at all, because the engine had stopped)."""
    batch, _ = events.read(offset)
    if any(e["event"] == EventKind.START for e in batch):
        return False
    stops = [e for e in batch if e["event"] == EventKind.STOP]
    return not stops or str(stops[-1].get("reason", "")).startswith(ENGINE_STOPPED)


def _reset_ray() -> None:
    """Shut down what is left of a Ray runtime that did not start, before starting anew."""
    import ray

    if ray.is_initialized():
        ray.shutdown()


def _follow(events: EventLog, observer: RoundObserver, stop: threading.Event) -> None:
    """Forward events written by the ServerApp to ``observer`` until ``stop``."""
    offset = 0
    while True:
        done = stop.is_set()
        batch, offset = events.read(offset)
        for event in batch:
            if event["event"] == EventKind.START:
                sites = [SiteInfo(**s) for s in event["sites"]]
                observer.on_start(sites, event["rounds"], event["genesis_version"])
            elif event["event"] == EventKind.ROUND:
                observer.on_round(round_from_event(event))
        if done:
            return
        stop.wait(0.2)


def run_flower_simulation(
    config_path: Path,
    out: Path,
    endpoints: dict[str, str],
    events: EventLog,
    observer: RoundObserver | None = None,
) -> RunResult:
    """Run the federation in ``config_path`` with one simulated SuperNode per site."""
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")

    # Flower logs to its own handler; its records reaching the root logger too would
    # print every line twice in our progress display.
    flwr_logger = logging.getLogger("flwr")
    flwr_logger.propagate = logging.getLogger().isEnabledFor(logging.DEBUG)
    # We use the Python simulation API on purpose: `flwr run`'s local simulation installs
    # the app's dependencies per run, which machines without a package index cannot do.
    flwr_logger.addFilter(lambda record: "`run_simulation` function is deprecated" not in record.getMessage())

    config = load_federation(config_path)
    settings = {
        "config": str(Path(config_path).resolve()),
        "state-root": str((out / "sites").resolve()),
        "zones": json.dumps(endpoints),
        "events": str(events.path.resolve()),
    }
    stop = threading.Event()
    follower = None
    if observer is not None:
        follower = threading.Thread(target=_follow, args=(events, observer, stop), daemon=True)
        follower.start()
    try:
        for attempt in range(1, _ATTEMPTS + 1):
            offset = events.path.stat().st_size if events.path.exists() else 0
            # Ray is reached or started before the ServerApp exists (Flower then uses it): a
            # Ray that cannot run ends the command in one line, with no ServerApp left waiting.
            start_ray()
            try:
                _run_engine(settings, len(config.sites), events, offset)
            except Exception as exc:
                if not _engine_failed(events, offset):
                    raise
                if attempt == _ATTEMPTS:
                    raise RoundError(
                        f"{ENGINE_STOPPED} before any site answered, {_ATTEMPTS} times ({exc}); check that Ray can "
                        "start here (free memory, /tmp/ray), or run with --engine inprocess"
                    ) from exc
            if attempt == _ATTEMPTS or not _engine_failed(events, offset):
                break
            log.warning("%s before any site answered (Ray did not start?); retrying once", ENGINE_STOPPED)
            _reset_ray()
    finally:
        stop.set()
        if follower is not None:
            follower.join()
    return replay(events.path)
