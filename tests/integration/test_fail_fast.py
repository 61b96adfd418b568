"""Fail fast: an engine or a process fedshard depends on that cannot start or dies ends the
command with one line naming it, instead of a wait to ``round_timeout_s`` and tracebacks.

Real processes throughout: ``fedshard simulate --engine flower`` against a Ray cluster
address nothing listens at, and a local Ray that cannot start; an in-process simulation
whose zone server stops after round 1; ``fedshard aggregator up --insecure`` whose zone and
SuperLink are SIGKILLed while it waits for its sites (no round has to run), with a
``fedshard site up`` connected to it; the aggregator's supervision of real ``zone up``
processes, one of which dies twice.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from fedshard.config import FederationConfig, load_federation
from fedshard.deploy.aggregator_host import AggregatorHost
from fedshard.deploy.keys import provision
from fedshard.deploy.loopback import free_ports, write_loopback_layout
from fedshard.deploy.status import HostState, read_state
from fedshard.errors import ConfigError, DeployError, RoundError, ZoneError
from fedshard.simulate.ray_runtime import check_ray_address, init_args
from fedshard.simulate.run import simulate
from tests.deploy_helpers import FEDSHARD, env, stop, wait_for

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "configs" / "demo.yaml"


def _simulate(tmp_path: Path, **extra_env: str) -> subprocess.CompletedProcess[str]:
    """``fedshard simulate --engine flower`` on the demo; the issue's bound (60 s) is the timeout."""
    cmd = [*FEDSHARD, "simulate", "--config", str(DEMO), "--engine", "flower", "--out", str(tmp_path / "run")]
    return subprocess.run(
        cmd, cwd=ROOT, env={**env(), **extra_env}, capture_output=True, text=True, timeout=60, check=False
    )


def _lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip()]


# --- Ray -------------------------------------------------------------------------------------


def test_a_ray_cluster_nobody_answers_at_is_one_line_and_nothing_is_written(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    proc = _simulate(tmp_path, RAY_ADDRESS=f"127.0.0.1:{port}")
    assert proc.returncode == 2, proc.stderr
    assert _lines(proc.stderr) == [
        f"error: could not reach the Ray cluster at 127.0.0.1:{port} (RAY_ADDRESS): Connection refused; "
        "start it with `ray start --head` or unset RAY_ADDRESS"
    ]
    assert not (tmp_path / "run").exists()  # refused before the run folder, its zones or sites


@pytest.mark.slow
def test_a_local_ray_that_cannot_start_is_retried_once_then_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")  # Ray cannot make its session folder below a file: every start fails
    proc = _simulate(tmp_path, RAY_TMPDIR=str(blocker / "tmp"), RAY_ADDRESS="")
    assert proc.returncode == 2, proc.stderr
    lines = _lines(proc.stderr)
    assert "Traceback" not in proc.stderr
    assert len(lines) == 2, lines
    assert "Ray did not start" in lines[0] and "retrying once with a 10 s wait" in lines[0]
    assert lines[1].startswith("error: Ray did not start here, twice (")
    assert f"check free memory and {blocker / 'tmp' / 'ray'}, or run with --engine inprocess" in lines[1]


def test_ray_addresses_are_checked_and_a_cluster_is_never_sized_by_us() -> None:
    local = init_args(None)  # a runtime of our own, even beside a running cluster
    assert local["address"] == "local" and local["num_cpus"] >= 1 and local["num_gpus"] == 0
    connect = init_args("10.0.0.5:6379")
    assert connect["address"] == "10.0.0.5:6379" and "num_cpus" not in connect and "num_gpus" not in connect
    with pytest.raises(ConfigError, match="RAY_ADDRESS='nonsense' is not HOST:PORT"):
        check_ray_address("nonsense")
    (port,) = free_ports(1)
    with pytest.raises(RoundError, match=f"could not reach the Ray cluster at ray://127.0.0.1:{port}"):
        check_ray_address(f"ray://127.0.0.1:{port}")
    check_ray_address("auto")  # Ray finds its cluster itself


# --- simulate's in-process zones ---------------------------------------------------------------


@pytest.mark.slow
def test_a_zone_server_that_stops_mid_run_ends_the_simulation_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``simulate`` serves its zones in this process; one that stops after round 1 ends the run
    at once with a one-line :class:`ZoneError` (round_timeout_s is 600 s: no wait for it)."""
    import fedshard.zone.rpc.service as service

    servers: list[Any] = []
    real_serve = service.serve

    def serve(*args: Any, **kwargs: Any) -> Any:  # the real server, kept at hand to stop it
        server, port = real_serve(*args, **kwargs)
        servers.append(server)
        return server, port

    monkeypatch.setattr(service, "serve", serve)
    config = FederationConfig.model_validate(
        {
            "federation": {"name": "toy", "seed": 3, "rounds": 3, "min_sites": 2, "round_timeout_s": 600},
            "task": {"target": "tests.toy_task:task", "options": {"examples": 40}},
            "training": {"local_epochs": 1, "batch_size": 8, "learning_rate": 0.05},
            "sharding": {"tile": [4, 4]},
            "zones": [{"name": "z1", "region": "EU"}],
            "sites": [{"id": f"s{i}", "jurisdiction": "EU"} for i in range(3)],
        }
    )
    rounds: list[int] = []

    class StopZoneAfterRoundOne:
        def on_start(self, *args: Any) -> None:
            pass

        def on_round(self, result: Any) -> None:
            rounds.append(result.round)
            servers[0].stop(0)

    with pytest.raises(ZoneError) as caught:
        simulate(config, tmp_path / "run", observer=StopZoneAfterRoundOne())
    assert rounds == [1]
    assert "unreachable" in str(caught.value) and "\n" not in str(caught.value)


# --- aggregator up / site up -----------------------------------------------------------------


@pytest.fixture
def deployment(tmp_path: Path) -> dict[str, Path]:
    """The example deployment on free loopback ports, without TLS, hosting one zone (no round
    runs, so one is enough); the aggregator waits for its sites for ever."""

    def edit(data: dict[str, Any]) -> None:
        data["deployment"].update(wait_s=600, zones=["eu-central"])

    paths = write_loopback_layout(ROOT / "configs", tmp_path, edit=edit, tls=False)
    provision(load_federation(paths["aggregator"]), tmp_path / "keys")
    return paths


def _up(args: list[str], cwd: Path, log: Path) -> subprocess.Popen[bytes]:
    """Start ``fedshard ARGS`` in its own session: stdout to ``log``, stderr to ``log.err``."""
    with log.open("ab") as out, log.with_suffix(".err").open("ab") as err:
        return subprocess.Popen([*FEDSHARD, *args], cwd=cwd, env=env(), stdout=out, stderr=err, start_new_session=True)


def _stderr(log: Path) -> list[str]:
    return _lines(log.with_suffix(".err").read_text())


def _kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_a_dead_superlink_stops_the_aggregator_and_its_sites_in_one_line_a_dead_zone_is_restarted(
    tmp_path: Path, deployment: dict[str, Path]
) -> None:
    state_dir = tmp_path / "runs" / "aggregator"
    agg_log, site_log = tmp_path / "agg.log", tmp_path / "site.log"
    aggregator = _up(["aggregator", "up", "--insecure", "--config", str(deployment["aggregator"])], tmp_path, agg_log)
    procs = [aggregator]
    try:
        wait_for(lambda: _phase(state_dir) == "waiting for sites", 120, "the aggregator to start", procs)
        site = _up(
            ["site", "up", "--insecure", "--retry-s", "8", "--config", str(deployment["charite-berlin"])],
            tmp_path,
            site_log,
        )
        procs.append(site)
        wait_for(lambda: len(_state(state_dir).online) == 1, 120, "the site to connect", procs)

        zone = _state(state_dir).zones["eu-central"]
        _kill(zone["pid"])
        wait_for(lambda: _state(state_dir).zones["eu-central"]["pid"] != zone["pid"], 60, "a restart", procs)
        assert aggregator.poll() is None

        _kill(_state(state_dir).superlink_pid or 0)
        killed = time.monotonic()
        aggregator.wait(60)
        agg_s = time.monotonic() - killed
        site.wait(60)
        site_s = time.monotonic() - killed
        print(f"after the SuperLink's SIGKILL: aggregator exited in {agg_s:.1f}s, site (--retry-s 8) in {site_s:.1f}s")
    finally:
        stop(procs)
    # stderr: the --insecure warning, the zone restart's warning, the error
    lines = _stderr(agg_log)
    assert aggregator.returncode == 2 and len(lines) == 3, lines
    assert lines[1].startswith("WARNING fedshard.deploy.aggregator_host: zone eu-central exited (killed by signal 9): ")
    assert lines[1].endswith("restarting it (once per run)")
    assert lines[2].startswith("error: SuperLink exited (killed by signal 9): ") and "superlink.log" in lines[2]
    # the site's SuperNode gave up on the gone SuperLink within the site's --retry-s
    site_lines = _stderr(site_log)
    assert site.returncode == 2 and len(site_lines) == 2, site_lines
    assert site_lines[1].startswith(
        "error: the SuperNode of charite-berlin lost its SuperLink 127.0.0.1:"
    ) and site_lines[1].endswith(
        "no answer from the SuperLink for 8s. Is the aggregator up? (--retry-s sets how long a site keeps trying)"
    )


@pytest.mark.slow
def test_a_zone_is_restarted_once_per_run_then_its_death_is_one_line(deployment: dict[str, Path]) -> None:
    host = AggregatorHost(load_federation(deployment["aggregator"]), insecure=True)
    host.state_dir.mkdir(parents=True)
    host.run_dir.mkdir()
    host._write_config()
    try:
        host._start_zones()  # real `fedshard zone up` processes, as `aggregator up` starts them
        zone = next(c for c in host.children if c.name == "zone eu-central")
        first = zone.pid
        _kill(first)
        zone.popen.wait(10)
        host._check_children()  # restarts it on its port, from the same folder
        assert zone.alive() and zone.pid != first and zone.restarts == 1
        assert host.state.zones["eu-central"]["pid"] == zone.pid and "restarting it" in host.state.message
        _kill(zone.pid)
        zone.popen.wait(10)
        with pytest.raises(DeployError) as caught:
            host._check_children()
    finally:
        host.stop_children()
    message = str(caught.value)
    assert message.startswith("zone eu-central exited again after 1 restart(s) (killed by signal 9): ")
    assert "\n" not in message and message.endswith(f"(log: {host.state_dir / 'logs' / 'zone-eu-central.log'})")


def _state(state_dir: Path) -> HostState:
    """The aggregator's status.json (an empty state before it wrote one)."""
    try:
        return read_state(state_dir)
    except DeployError:
        return HostState()


def _phase(state_dir: Path) -> str:
    return _state(state_dir).phase
