"""Issue 39: an in-process simulation makes its sites' writes durable with one barrier per batch
of sites (:class:`fedshard._fs.Barrier`, :class:`~fedshard.transports.inprocess.StagedDurability`),
and still no site releases an update before what it reserved and saved is durable.

A real DP federation (:func:`tests.toy_federations.dp_toy`: 3 sites, one zone, 2 rounds) runs
under ``simulate`` with every fault point logged in order (:mod:`fedshard.faults`) and the
barrier's syncs logged among them; every ``os.fsync`` is recorded with its thread and file. Then:

* between a site's reservation (or model save) and its first push there is always a barrier sync;
* the sites' own files (keys, stores, ledgers) are never fsync'd one by one, nor the zones' audit
  records of the sites' pushes and fetches (each zone flushes its log when it closes a round);
* the barrier syncs twice per message the federation sends (and once after the sites' keys and
  once after their stores' keys), whatever the number of sites (one batch holds every site here).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

import fedshard.simulate.run as simulate_run
from fedshard import faults
from fedshard._fs import Barrier, syncfs_supported
from fedshard.assembly._zones import AUDIT_FILE
from tests.toy_federations import dp_toy

pytestmark = pytest.mark.skipif(not syncfs_supported(), reason="the barrier needs syncfs (Linux 5.8+)")

WRITES = ("site.ledger.reserved", "site.save.end")
"""Fault points reached once a site's reservation or its caught-up model is written."""


class LoggedBarrier(Barrier):
    """The simulation's barrier, its syncs logged among the fault points."""

    def sync(self) -> None:
        super().sync()
        faults.point("test.barrier.synced")


def test_each_batch_of_sites_is_flushed_once_before_any_of_them_releases(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    points = tmp_path / "points.log"
    fsyncs: list[tuple[str, str]] = []
    real_fsync = os.fsync

    def recorded(fd: int) -> None:
        fsyncs.append((threading.current_thread().name, os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    monkeypatch.setattr(simulate_run, "Barrier", LoggedBarrier)
    monkeypatch.setattr(os, "fsync", recorded)
    faults.configure("", log=str(points))
    try:
        summary = simulate_run.simulate(dp_toy("staged", rounds=2), tmp_path / "run")
    finally:
        faults.configure("")
    assert summary["rounds"] == 2 and not summary["stopped_reason"]
    assert all(len(h["sites"]) == 3 for h in summary["history"])

    reached = [line.split()[0] for line in points.read_text().splitlines()]
    pushes = reached.count("site.push.manifest")
    syncs = reached.count("test.barrier.synced")
    # one after the sites' signing keys, one after their store keys, then two per message sent to the
    # batch (the query, two rounds' train messages, the last evaluate): not per site
    assert pushes == 6 and syncs == 2 + 2 * 4
    dirty = False  # a site wrote something no barrier has flushed yet
    for point in reached:
        if point in WRITES:
            dirty = True
        elif point == "test.barrier.synced":
            dirty = False
        elif point == "site.push.manifest":
            assert not dirty, "a site pushed before its writes were flushed"

    sites = str(tmp_path / "run" / "sites")
    assert [path for _, path in fsyncs if path.startswith(sites) or "/store-keys/" in path] == []
    # the zones' audit records of the sites' pushes and fetches wait for the batch's barrier too; each zone's
    # log is flushed by the zone's own calls (opening a round; closing one, before any sum leaves it:
    # AuditLog.sync, tests/unit/audit/test_audit.py), never from a site's thread
    audits = [(thread, path) for thread, path in fsyncs if path.endswith("/" + AUDIT_FILE)]
    assert not [path for thread, path in audits if thread.startswith("site")]
    assert len({path for _, path in audits}) == len(summary["zones"])
