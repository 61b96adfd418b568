"""One aggregator per state folder, and ports checked before anything starts (fedshard.deploy)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from fedshard.deploy.host_lock import holding, is_held
from fedshard.deploy.preflight import check_ports_free
from fedshard.errors import DeployError


def test_a_taken_port_is_refused_in_one_line_naming_it_and_what_needs_it() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(DeployError) as refused:
            check_ports_free([("zone eu-central", "127.0.0.1:1"), ("the SuperLink", f"127.0.0.1:{port}")])
    line = str(refused.value)
    assert line.startswith(f"port {port} on 127.0.0.1 (the SuperLink) is in use") and "\n" not in line
    check_ports_free([("the SuperLink", f"127.0.0.1:{port}")])  # closed: free again


def test_the_state_folder_lock_is_held_for_the_block_and_refuses_a_second_holder(tmp_path: Path) -> None:
    assert not is_held(tmp_path)
    with holding(tmp_path):
        assert is_held(tmp_path)
        # the second one names the pid the status file records (the first one's)
        refused = pytest.raises(DeployError, match=r"another aggregator \(pid 4242\) runs with state folder")
        with refused, holding(tmp_path, pid=4242):
            pass
    assert not is_held(tmp_path)


def test_one_site_up_per_site_state_folder(tmp_path: Path) -> None:
    """Two SuperNodes of one site would train on, and spend from, one ledger at once: a second
    `site up` is refused in one line naming the commands that show and stop the first."""
    from fedshard.deploy.host_lock import SITE_LOCK_FILE

    with holding(tmp_path, lock_file=SITE_LOCK_FILE):
        assert is_held(tmp_path, SITE_LOCK_FILE) and not is_held(tmp_path)  # not the aggregator's lock
        refused = pytest.raises(DeployError, match=r"another `site up` \(pid 77\) runs with state folder .*site status")
        with refused, holding(tmp_path, pid=77, lock_file=SITE_LOCK_FILE):
            pass
    assert not is_held(tmp_path, SITE_LOCK_FILE)
