"""The README's example federation as containers (``deploy/compose.yaml``), from the image this
checkout builds: ``make test-containers`` (FEDSHARD_CONTAINERS=1) runs it; ``make test`` skips it.

One run, read by every assertion: keys made once and handed out per container, three zones and
the aggregator, four sites each in its own container; one site killed mid-run comes back by its
restart policy and catches up; the run ends after its rounds and its summary is read from the
aggregator's volume on the host."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from subprocess import CompletedProcess
from typing import Any

import pytest

from tests.container_helpers import ROOT, WORK, build_image, docker_daemon, run, tools_missing

pytestmark = [
    pytest.mark.skipif(os.environ.get("FEDSHARD_CONTAINERS") != "1", reason="`make test-containers` runs it"),
    pytest.mark.skipif(tools_missing() is not None, reason=str(tools_missing())),
]

COMPOSE = ROOT / "deploy" / "compose.yaml"
PROJECT = "fedshard-test"
SITES = ("charite-berlin", "ap-hp-paris", "mayo-rochester", "sgh-singapore")
CRASHED = "sgh-singapore"
ROUNDS = 7
"""The compose run's rounds (FEDSHARD_ROUNDS; the file's default is 5); 7 stay within every site's
ε budget. Rounds of the example take seconds (one message per site and round), fewer than a killed
site's container needs to come back, so the test's aggregator pauses once after round 3 is
finished (:data:`PAUSE`): rounds are left for the restarted site to join and train in on any machine."""
PAUSE = "coordinator.round.done@3:pause=45"
"""The aggregator's ``FEDSHARD_FAULTS`` in this test (an override file: the shipped compose file has none)."""
TRAIN_PAUSE = "site.train.begin:pause=10"
"""The killed site's ``FEDSHARD_FAULTS``: each of its train messages (a process of its own) stalls
10 s after taking its message, and lists the point in :data:`POINTS`. The test kills the site in
its second train's stall, so the round it is killed in cannot have its answer, whenever it comes
back: killed at a moment of the test's choosing, a site that had not yet taken the round's
message came back within the round's minute and answered it (a CI run failed so)."""
POINTS = "/state/faults.log"
"""The killed site's ``FEDSHARD_FAULTS_LOG``, in its state volume."""
Compose = Callable[..., CompletedProcess[str]]


@pytest.fixture(scope="module")
def compose() -> Iterator[Compose]:
    """``docker-compose`` on the test project, the image built from this checkout; everything it
    started (containers, network, volumes) is removed after, and the daemon stopped if started here.
    The logs stay in :data:`WORK`: ``compose.log``, and each site's SuperNode log (``SITE.log``)."""
    with docker_daemon():
        env = {**os.environ, "FEDSHARD_IMAGE": build_image(), "FEDSHARD_ROUNDS": str(ROUNDS)}
        WORK.mkdir(parents=True, exist_ok=True)
        override = WORK / "compose.pause.yaml"
        override.write_text(
            f"services:\n  aggregator:\n    environment:\n      FEDSHARD_FAULTS: '{PAUSE}'\n"
            f"  {CRASHED}:\n    environment:\n      FEDSHARD_FAULTS: '{TRAIN_PAUSE}'\n"
            f"      FEDSHARD_FAULTS_LOG: '{POINTS}'\n"
        )
        files = ["-f", str(COMPOSE), "-f", str(override)]

        def dc(*args: str, **kwargs: Any) -> CompletedProcess[str]:
            return run("docker-compose", "-p", PROJECT, *files, *args, env=env, **kwargs)

        dc("down", "-v", "--remove-orphans", check=False)
        try:
            yield dc
        finally:
            WORK.mkdir(parents=True, exist_ok=True)
            (WORK / "compose.log").write_text(dc("logs", "--no-color", check=False).stdout)
            for site in SITES:  # each site's SuperNode log (its ClientApps' errors), kept from its volume
                container = dc("ps", "-q", site, check=False).stdout.strip()
                if container:
                    run("docker", "cp", f"{container}:/state/supernode.log", str(WORK / f"{site}.log"), check=False)
            dc("down", "-v", "--remove-orphans", check=False, timeout=120)


def _container(dc: Compose, service: str) -> str:
    return dc("ps", "-q", service).stdout.strip()


def _trains_begun(dc: Compose) -> int:
    """Train messages the killed site has taken so far (its :data:`POINTS` file)."""
    out = dc("exec", "-T", CRASHED, "sh", "-c", f"cat {POINTS} 2>/dev/null", check=False).stdout
    return sum(1 for line in out.splitlines() if line.startswith("site.train.begin "))


def test_the_compose_federation_runs_and_a_killed_site_comes_back(compose: Compose, tmp_path: Path) -> None:
    dc = compose
    dc("up", "-d", timeout=600)
    # every site sees its own keys and nothing else
    for site in SITES:
        assert dc("exec", "-T", site, "ls", "/keys").stdout.split() == [site]
        listed = set(dc("exec", "-T", site, "ls", "-A", f"/keys/{site}").stdout.split())
        assert f"{site}.pem" in listed and "supernode.key" in listed, listed
        assert not any(name.endswith(".pem") and name not in {"ca.pem", f"{site}.pem"} for name in listed), listed
    # each hospital on a network of its own: the aggregator is reachable by name, another hospital is not
    probe = "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), 3)"
    assert dc("exec", "-T", "charite-berlin", "python3", "-c", probe, "aggregator", "9092", check=False).returncode == 0
    resolve = "import socket, sys; socket.gethostbyname(sys.argv[1])"
    assert dc("exec", "-T", "charite-berlin", "python3", "-c", resolve, "mayo-rochester", check=False).returncode
    assert dc("exec", "-T", "charite-berlin", "python3", "-c", resolve, "zone-us-east", check=False).returncode == 0
    # one site's `site up` killed in its second train message (a round of its is in): its container
    # exits, its restart policy brings it back
    deadline = time.monotonic() + 300
    while _trains_begun(dc) < 2:
        assert time.monotonic() < deadline, dc("logs", "--tail", "50", check=False).stdout
        time.sleep(1)
    crashed = _container(dc, CRASHED)
    kill = "import os, signal; os.kill(int(open('/proc/1/task/1/children').read().split()[0]), signal.SIGKILL)"
    # `site up` (init's child) dies: the container exits, and may take this exec with it before it
    # returns (SIGKILL: 137); the restart count below shows the kill happened either way
    killed = run("docker", "exec", crashed, "python3", "-c", kill, check=False)
    assert killed.returncode in (0, 137), killed.stdout + killed.stderr
    # the run ends after its rounds: the aggregator exits
    aggregator = _container(dc, "aggregator")
    status = run("docker", "wait", aggregator, timeout=420).stdout.strip()
    assert status == "0", dc("logs", "--tail", "80", "aggregator", check=False).stdout
    restarts = run("docker", "inspect", "-f", "{{.RestartCount}}", crashed).stdout.strip()
    assert int(restarts) >= 1
    run("docker", "cp", f"{aggregator}:/state", str(tmp_path / "state"))
    summary = json.loads(next((tmp_path / "state").glob("run-*/summary.json")).read_text())
    history = summary["history"]
    assert summary["rounds"] == ROUNDS and not summary["stopped_reason"], summary["stopped_reason"]
    assert all(len(h["sites"]) >= 3 for h in history)
    assert any(CRASHED not in h["sites"] for h in history), history  # away from the round it was killed in
    assert CRASHED in history[-1]["sites"], history  # back, caught up, and trained again
    # residency: EU personal shards only at the EU zone, and nothing refused
    zones = {z["name"]: z for z in summary["zones"]}
    assert zones["eu-central"]["shards_by_class"]["personal from EU"] > 0
    assert not any("from EU" in k for name in ("us-east", "sg-central") for k in zones[name]["shards_by_class"])
    assert all(z["refused"] == 0 for z in zones.values())
