"""``fedshard simulate --engine flower``: the federation on Flower's simulation engine (Ray)."""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path

from fedshard.config import load_federation
from fedshard.coordinator.events import EventKind, EventLog, replay, round_from_event
from fedshard.coordinator.results import RoundObserver, RunResult
from fedshard.protocol.messages import SiteInfo

__all__ = ["run_flower_simulation"]


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
    from flwr.simulation import run_simulation

    # Flower logs to its own handler; its records reaching the root logger too would
    # print every line twice in our progress display.
    flwr_logger = logging.getLogger("flwr")
    flwr_logger.propagate = logging.getLogger().isEnabledFor(logging.DEBUG)
    # We use the Python simulation API on purpose: `flwr run`'s local simulation installs
    # the app's dependencies per run, which machines without a package index cannot do.
    flwr_logger.addFilter(lambda record: "`run_simulation` function is deprecated" not in record.getMessage())

    from fedshard.transports.flower.client_app import create_client_app
    from fedshard.transports.flower.server_app import create_server_app

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
    cpus = os.cpu_count() or 1
    try:
        run_simulation(
            server_app=create_server_app(settings),
            client_app=create_client_app(settings),
            num_supernodes=len(config.sites),
            backend_config={
                "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                # site errors come back as error replies; actors' own chatter stays in Ray's logs
                "init_args": {"num_cpus": cpus, "num_gpus": 0, "include_dashboard": False, "log_to_driver": False},
            },
        )
    finally:
        stop.set()
        if follower is not None:
            follower.join()
    return replay(events.path)
