"""Before/after in one run: the same mTLS push measured with this tree's fedshard and another commit's.

``git archive`` extracts the other commit's ``fedshard/`` and ``bench/`` into a temporary
folder; a small driver (below, the same text for both trees) runs in a fresh process with
that tree first on ``sys.path`` and measures pushes with *that tree's* ``bench/_common.py``
(its zone server process, its client, its round protocol). Drivers of the two trees
alternate, their order rotated every repetition, so both see the same machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

DRIVER = r"""
import json, sys, tempfile
from pathlib import Path

tree, values, rounds = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
sys.path[:0] = [str(tree), str(tree / "bench")]
import psutil
import _common as c
from fedshard.crypto import pki
from fedshard.crypto.tls import TlsFiles
from fedshard.zone.rpc.client import GrpcZoneClient

with tempfile.TemporaryDirectory() as tmp:
    ca = pki.init_ca(Path(tmp) / "ca")
    zone = pki.issue_zone(Path(tmp) / "ca", c.ZONE, "EU", Path(tmp) / "zone")
    site = pki.issue_site(Path(tmp) / "ca", "site-0", "EU", Path(tmp) / "site")
    if hasattr(pki, "issue_coordinator"):  # trees with lifecycle authority
        lead = pki.issue_coordinator(Path(tmp) / "ca", "EU", Path(tmp) / "lead")
    else:
        lead = pki.issue_site(Path(tmp) / "ca", "coordinator", "EU", Path(tmp) / "lead")
    files = lambda p: TlsFiles(p.cert, p.key, ca.cert)
    update = c.synthetic_update(values)
    plan = c.make_plan(update, (256, 256))
    shards = plan.split(update)
    pushes = []
    with c.ZoneServerProcess(tls=files(zone)) as server:
        proc = psutil.Process(server.pid)
        with GrpcZoneClient(server.endpoint, tls=files(lead)) as coordinator, GrpcZoneClient(
            server.endpoint, tls=files(site)
        ) as client:
            coordinator.wait_ready()
            for r in range(rounds + 1):  # the first round warms up
                times = c.push_round(coordinator, client, proc, plan, shards, r + 1, "site-0")
                if r:
                    pushes.append(times["push"])
    print(json.dumps({"push": pushes, "bytes": c.num_bytes(update)}))
"""


def extract(ref: str, into: Path) -> Path:
    """``fedshard/`` and ``bench/`` of commit ``ref`` under ``into``; raises RuntimeError if git cannot."""
    archive = into / "tree.tar"
    proc = subprocess.run(
        ["git", "archive", "--format=tar", "-o", str(archive), ref, "fedshard", "bench"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"cannot extract {ref} with git archive: {proc.stderr.strip()}")
    tree = into / "tree"
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    return tree


def run_driver(tree: Path, values: int, rounds: int) -> dict[str, Any]:
    """One driver process on ``tree``: its push seconds and the update's bytes."""
    env = dict(os.environ, PYTHONPATH=str(tree), GRPC_VERBOSITY="ERROR")
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, str(tree), str(values), str(rounds)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"driver on {tree} failed: {proc.stderr.strip()[-2000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def compare(ref: str, values: int, rounds: int, reps: int) -> dict[str, Any]:
    """Push seconds of ``ref``'s tree (``before``) and this one (``after``), alternating ``reps`` times."""
    pushes: dict[str, list[float]] = {"before": [], "after": []}
    nbytes = 0
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"before": extract(ref, Path(tmp)), "after": REPO}
        for rep in range(reps):
            order = ["before", "after"] if rep % 2 == 0 else ["after", "before"]
            for name in order:
                out = run_driver(trees[name], values, rounds)
                pushes[name] += out["push"]
                nbytes = out["bytes"]
            print(f"  before/after repetition {rep + 1}/{reps} done", flush=True)
    return {"ref": ref, "bytes": nbytes, **pushes}
