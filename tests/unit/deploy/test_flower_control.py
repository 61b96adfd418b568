"""The aggregator's two polled SuperLink queries (SuperNodes, run status) asked in-process give
what the ``flwr`` CLI gives, against a real SuperLink; without Flower's internals, or when the
in-process client fails, the CLI answers (or names the error in one line)."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedshard.deploy._flower import CONNECTION, FlowerCli, flower_env, superlink_command, write_connection
from fedshard.deploy.keys import generate_supernode_key
from fedshard.deploy.loopback import free_ports
from fedshard.errors import DeployError
from fedshard.transports.flower.compat import control


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A plain-text SuperLink on a free port and a ``$FLWR_HOME`` whose connection names it."""
    folder = tmp_path_factory.mktemp("superlink")
    port = free_ports(1)[0]
    cmd = superlink_command(listen="127.0.0.1", port=port, database=folder / "state.db", tls=None)
    proc = subprocess.Popen(cmd, env=flower_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert proc.poll() is None and time.monotonic() < deadline, "the SuperLink did not start"
            time.sleep(0.2)
        write_connection(folder / "flwr", f"127.0.0.1:{port}", None)
        yield folder / "flwr"
    finally:
        proc.terminate()
        proc.wait(30)


def test_in_process_answers_are_the_clis(home: Path) -> None:
    flwr = FlowerCli(home)
    try:
        assert flwr._in_process() is not None  # the pinned Flower: its internals are there
        public = home.parent / "node.pub"
        generate_supernode_key(home.parent / "node.key", public)
        node = flwr.register(public)
        nodes = flwr.nodes()
        cli = flwr.call(["supernode", "list", CONNECTION])["nodes"]
        assert [(n.node_id, n.status) for n in nodes] == [(str(n["node-id"]), n["status"]) for n in cli]
        assert node in [n.node_id for n in nodes] and not any(n.online for n in nodes)  # registered, never seen
        with pytest.raises(DeployError, match=r"(?s)^`flwr list fedshard` failed: .*not found"):
            flwr.run_status("12345")  # no such run: the in-process client fails, the CLI says why
    finally:
        flwr.close()


def test_without_flowers_internals_the_cli_answers(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(control, "release_problem", lambda what: f"flwr 9.9 is installed; {what} was written …")
    flwr = FlowerCli(home)
    assert flwr._in_process() is None
    assert [n.node_id for n in flwr.nodes()] == [str(n["node-id"]) for n in flwr.call(["supernode", "list"])["nodes"]]
