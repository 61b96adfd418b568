"""Real crashes: a process writing (or rotating) the store is killed with SIGKILL at a random moment."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from fedshard.crypto.at_rest import KEK_ENV, NEW_KEK_ENV, Kek
from fedshard.errors import StoreKeyError
from fedshard.store import LocalDirBackend, SealedShardStore, rotate_keys
from fedshard.store.rotation import pending_rotation, store_kek_id
from fedshard.store.verify import check_store

ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.slow

WRITER = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    from fedshard.crypto.at_rest import Kek
    from fedshard.store import SealedShardStore

    store = SealedShardStore.open(sys.argv[1], Kek.from_text(os.environ["FEDSHARD_STORE_KEK"]))
    v = store.stat("a").version
    while True:
        v += 1
        # a large shard, so a kill often lands inside a blob write; "b" changes in the same commit
        store.put_many({"a": np.full((256, 256), v, np.float32), "b": np.full(10, -v, np.float64)})
        print(v, flush=True)
    """
)

ROTATOR = textwrap.dedent(
    """
    import os, sys
    from fedshard.crypto.at_rest import Kek
    from fedshard.store import LocalDirBackend, rotate_keys

    keys = [Kek.from_text(os.environ["FEDSHARD_STORE_KEK"]), Kek.from_text(os.environ["FEDSHARD_STORE_NEW_KEK"])]
    backend = LocalDirBackend(sys.argv[1])
    i = 0
    while True:
        rotate_keys(backend, keys[i % 2], keys[(i + 1) % 2])
        i += 1
        print(i, flush=True)
    """
)


def _run_and_kill(script: str, store: Path, env: dict[str, str], rnd: random.Random) -> int:
    """Start ``script``, let it commit a few times, SIGKILL it at a random moment; return the last commit it printed."""
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(store)],
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    last = 0
    for _ in range(3):  # it runs: three commits done
        line = proc.stdout.readline()
        assert line, "the child process died"
        last = int(line)
    time.sleep(rnd.uniform(0, 0.05))
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    for line in proc.stdout:
        last = int(line)
    return last


def test_killing_a_writer_leaves_a_readable_version(tmp_path: Path) -> None:
    kek = Kek.generate()
    store_dir = tmp_path / "store"
    store = SealedShardStore.create(store_dir, kek)
    store.put_many({"a": np.full((256, 256), 1, np.float32), "b": np.full(10, -1, np.float64), "c": np.ones(3)})
    rnd = random.Random(7)
    for _ in range(4):
        printed = _run_and_kill(WRITER, store_dir, {KEK_ENV: kek.to_text()}, rnd)
        reopened = SealedShardStore.open(store_dir, kek)
        a, b = reopened.get("a"), reopened.get("b")
        v = reopened.stat("a").version  # version v holds v
        assert (a == v).all() and (b == -v).all(), "a torn or mixed commit"
        assert printed <= v <= printed + 1  # the last commit it reported, or the one in flight
        np.testing.assert_array_equal(reopened.get("c"), np.ones(3))
        report = check_store(reopened)
        assert report.ok, report.problems
        reopened.vacuum()  # leftovers of the killed write
        assert not LocalDirBackend(store_dir).temporaries() and not reopened.orphans()


def test_killing_a_rotation_leaves_the_store_readable_and_resumable(tmp_path: Path) -> None:
    keys = [Kek.generate(), Kek.generate()]
    store_dir = tmp_path / "store"
    shards = {f"s{i}": np.full((8, 8), i, np.float32) for i in range(50)}
    SealedShardStore.create(store_dir, keys[0]).put_many(shards)
    env = {KEK_ENV: keys[0].to_text(), NEW_KEK_ENV: keys[1].to_text()}
    backend = LocalDirBackend(store_dir)
    rnd = random.Random(11)
    for _ in range(4):
        _run_and_kill(ROTATOR, store_dir, env, rnd)
        current = next(k for k in keys if k.kek_id == store_kek_id(backend))
        store = SealedShardStore.open(store_dir, current)  # readable at once, with the key it is under
        for sid, want in shards.items():
            np.testing.assert_array_equal(store.get(sid), want)
        journal = pending_rotation(backend)
        if journal is not None:  # finish the interrupted rotation
            old = next(k for k in keys if k.kek_id == journal["from"])
            new = next(k for k in keys if k.kek_id == journal["to"])
            rotate_keys(backend, old, new)
            current = new
        other = keys[1] if current is keys[0] else keys[0]
        assert check_store(SealedShardStore.open(store_dir, current)).ok
        with pytest.raises(StoreKeyError):
            SealedShardStore.open(store_dir, other)
        keys = [current, other]  # the next run rotates from the current key
        env = {KEK_ENV: current.to_text(), NEW_KEK_ENV: other.to_text()}
