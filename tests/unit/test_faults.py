"""The fault-injection points (fedshard.faults)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedshard import faults
from fedshard.errors import ConfigError


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    yield
    faults.configure("")


def test_parse_reads_point_occurrence_and_action() -> None:
    got = faults.parse("site.push.frame@3:kill, zone.close:pause=2.5,site.commit:raise")
    assert got == {
        "site.push.frame": [faults.Fault("site.push.frame", 3, "kill")],
        "zone.close": [faults.Fault("zone.close", 1, "pause", 2.5)],
        "site.commit": [faults.Fault("site.commit", 1, "raise")],
    }


@pytest.mark.parametrize("bad", ["site.push", "site.push:explode", ":kill", "x@0:kill", "x@a:kill", "x:pause", "x:kill=3"])
def test_a_malformed_entry_is_one_config_error(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"FEDSHARD_FAULTS: bad entry") as info:
        faults.parse(bad)
    assert "\n" not in str(info.value)


def test_raise_strikes_at_the_nth_occurrence_only(tmp_path: Path) -> None:
    log = tmp_path / "points.log"
    faults.configure("a@2:raise", log=str(log))
    faults.point("a")
    faults.point("b")
    with pytest.raises(faults.InjectedFault, match="a"):
        faults.point("a")
    faults.point("a")
    assert log.read_text().split("\n")[:-1] == ["a 1", "b 1", "a 2", "a 3"]


def test_kill_is_a_sigkill_of_the_process(tmp_path: Path) -> None:
    marker = tmp_path / "after"
    code = f"from fedshard import faults\nfaults.point('p')\nfaults.point('p')\nopen({str(marker)!r}, 'w').close()"
    env = {**os.environ, "FEDSHARD_FAULTS": "p@2:kill"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True)
    assert proc.returncode == -9 and not marker.exists()


def test_no_plan_means_no_effect() -> None:
    faults.configure("")
    for _ in range(3):
        faults.point("anything")
