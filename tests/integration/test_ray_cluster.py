"""``simulate --engine flower`` on an existing Ray cluster: a real ``ray start --head`` on
loopback, reached with ``--ray-address``; the run's driver attaches to that cluster (its
log lands in the cluster's session folder) instead of starting a runtime of its own, and
the cluster sizes the actors (fedshard passes it no ``num_cpus``)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from fedshard.deploy.loopback import free_ports
from tests.deploy_helpers import FEDSHARD, env

ROOT = Path(__file__).resolve().parents[2]
RAY = Path(os.environ.get("VIRTUAL_ENV", ROOT / ".venv")) / "bin" / "ray"

pytestmark = pytest.mark.slow


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_simulate_runs_on_an_existing_ray_cluster(tmp_path: Path) -> None:
    ray = RAY if RAY.exists() else Path(shutil.which("ray") or "ray")
    (port,) = free_ports(1)
    session_root = Path(tempfile.mkdtemp(prefix="fsray", dir="/tmp"))  # Ray's socket paths must stay short
    head = subprocess.Popen(
        [
            str(ray),
            "start",
            "--head",
            "--node-ip-address=127.0.0.1",
            f"--port={port}",
            "--num-cpus=2",
            "--include-dashboard=false",
            "--disable-usage-stats",
            f"--temp-dir={session_root}",
            "--block",
        ],
        cwd=ROOT,
        env={**env(), "RAY_ADDRESS": ""},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not _listening(port):
            assert head.poll() is None, "ray start --head exited"
            assert time.monotonic() < deadline, "the Ray head did not listen within 120 s"
            time.sleep(0.5)
        cmd = [
            *FEDSHARD,
            "simulate",
            "--config",
            str(ROOT / "configs" / "demo.yaml"),
            "--rounds",
            "1",
            "--engine",
            "flower",
            "--ray-address",
            f"127.0.0.1:{port}",
            "--out",
            str(tmp_path / "run"),
        ]
        run = subprocess.Popen(
            cmd, cwd=ROOT, env={**env(), "RAY_ADDRESS": ""}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        out, err = run.communicate(timeout=600)
        assert run.returncode == 0, out[-2000:] + err[-2000:]
        summary = json.loads((tmp_path / "run" / "summary.json").read_text())
        assert summary["engine"] == "flower" and summary["rounds"] == 1 and not summary["stopped_reason"]
        assert len(summary["history"][0]["sites"]) == 4
        # the driver was a client of the cluster: its log is in the cluster's session folder
        logs = list((session_root / "session_latest" / "logs").glob(f"python-core-driver-*_{run.pid}.log"))
        assert logs, sorted(p.name for p in (session_root / "session_latest" / "logs").iterdir())[:20]
        assert not (Path(tempfile.gettempdir()) / "ray" / f"session_{run.pid}").exists()
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait(timeout=30)
        time.sleep(1)
        with_pg = subprocess.run(["pgrep", "-g", str(head.pid)], capture_output=True, text=True, check=False)
        for pid in with_pg.stdout.split():
            os.kill(int(pid), signal.SIGKILL)
        shutil.rmtree(session_root, ignore_errors=True)
