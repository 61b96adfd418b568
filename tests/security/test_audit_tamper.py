"""A real zone's signed audit log, tampered with after it stopped: `fedshard audit verify` names the record.

Starts ``fedshard zone up`` with mutual TLS, has a site make it record refusals
(pushes for a round that is not open), stops it, then forges a record with a correct
hash chain (anyone who can write the file can) and flips a byte of a real one.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedshard.audit import record_hash
from fedshard.crypto.pki import init_ca, issue_site, issue_zone
from fedshard.crypto.tls import TlsFiles
from fedshard.errors import PushRejectedError
from fedshard.sharding import ShardPlan
from fedshard.zone.rpc.client import GrpcZoneClient
from tests.zone_helpers import TOKEN, manifest_for, random_update

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
FEDSHARD = [sys.executable, "-m", "fedshard.cli.main"]
PLAN = ShardPlan.from_state_dict({"w": np.zeros((6, 8), np.float32)}, tile=(4, 4))


def _env() -> dict[str, str]:
    return {**os.environ, "COLUMNS": "400", "FLWR_TELEMETRY_ENABLED": "0"}


def _verify(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*FEDSHARD, "audit", "verify", *args], cwd=ROOT, env=_env(), capture_output=True, text=True)


@pytest.fixture(scope="module")
def zone_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """``(store, zone certificate, CA)`` of a zone that ran over mutual TLS and refused two pushes (run once)."""
    tmp_path = tmp_path_factory.mktemp("zone")
    ca = init_ca(tmp_path / "ca")
    zone = issue_zone(tmp_path / "ca", "eu-central", "EU", tmp_path / "zone")
    site = issue_site(tmp_path / "ca", "charite-berlin", "EU", tmp_path / "site")
    store = tmp_path / "store"
    proc = subprocess.Popen(
        [
            *FEDSHARD,
            "zone",
            "up",
            "--config",
            "configs/demo.yaml",
            "--zone",
            "eu-central",
            "--store",
            str(store),
            "--cert",
            str(zone.cert),
            "--key",
            str(zone.key),
            "--ca",
            str(ca.cert),
        ],
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "listening on" in line, line + (proc.stderr.read() if proc.poll() is not None and proc.stderr else "")
        endpoint = line.strip().rsplit(" ", 1)[-1]
        update = random_update(1, PLAN)
        with GrpcZoneClient(endpoint, tls=TlsFiles(site.cert, site.key, ca.cert)) as client:
            for _ in range(2):  # no round is open: refused, and the refusal audited
                with pytest.raises(PushRejectedError):
                    client.push(manifest_for("charite-berlin", update, plan=PLAN, zone="eu-central"), TOKEN, update)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0  # a zone that never stops fails here, not at the suite timeout
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return store, zone.cert, ca.cert


@pytest.fixture
def zone_log(zone_run: tuple[Path, Path, Path], tmp_path: Path) -> tuple[Path, Path, Path]:
    """A copy of the zone's ``audit.jsonl`` and signed head for one test to tamper with; certificate and CA."""
    store, cert, ca = zone_run
    for name in ("audit.jsonl", "audit.head.json"):
        shutil.copy(store / name, tmp_path / name)
    return tmp_path / "audit.jsonl", cert, ca


def test_the_zone_signs_its_log(zone_log: tuple[Path, Path, Path]) -> None:
    log, cert, ca = zone_log
    lines = log.read_bytes().splitlines()
    assert lines, "the zone wrote no audit record"
    ok = _verify("--log", str(log), "--cert", str(cert), "--ca", str(ca))
    assert ok.returncode == 0, ok.stderr
    assert f"{len(lines)} lines, chain intact" in ok.stdout
    assert "signed by zone eu-central (fingerprint " in ok.stdout and f"at line {len(lines)}" in ok.stdout


def test_a_forged_record_after_the_signed_head_is_reported(zone_log: tuple[Path, Path, Path]) -> None:
    log, cert, ca = zone_log
    n = len(log.read_bytes().splitlines())
    last = json.loads(log.read_bytes().splitlines()[-1])
    body = {
        "seq": n + 1,
        "time": last["time"] + 1,
        "decision": "accepted",
        "site": "charite-berlin",
        "prev": last["hash"],
    }
    forged = {**body, "hash": record_hash(body)}
    order = ["seq", "time", "decision", "site", "prev", "hash"]
    with log.open("ab") as fh:
        fh.write(("{" + ",".join(f"{json.dumps(k)}:{json.dumps(forged[k])}" for k in order) + "}\n").encode())
    bad = _verify("--log", str(log), "--cert", str(cert), "--ca", str(ca))
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1  # one line, no traceback
    assert f"line {n + 1} was appended after the head the zone signed (line {n})" in bad.stderr


def test_a_flipped_byte_names_the_first_bad_record(zone_log: tuple[Path, Path, Path]) -> None:
    log, cert, ca = zone_log
    data = bytearray(log.read_bytes())
    first_line_end = data.index(b"\n")
    data[first_line_end // 2] ^= 0x01  # inside the first record
    log.write_bytes(bytes(data))
    bad = _verify("--log", str(log), "--cert", str(cert), "--ca", str(ca))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert "line 1 " in bad.stderr


def test_a_cut_tail_is_reported(zone_log: tuple[Path, Path, Path]) -> None:
    log, _, ca = zone_log
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(b"".join(lines[:-1]))
    bad = _verify("--log", str(log), "--ca", str(ca))
    assert bad.returncode == 2
    assert f"covers {len(lines)} lines but the log has {len(lines) - 1}" in bad.stderr
