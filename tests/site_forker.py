"""A warm parent that runs site messages in forked children, for crash tests.

Starting a Python process that imports torch, Opacus and fedshard takes seconds; a crash
test that kills a site at a hundred points cannot pay that a hundred times. This module
runs as one process (``python -m tests.site_forker``) that imports everything once and
then, for each job it reads on stdin, forks a child that builds
the site from its config and state folder, exactly as a fresh site process would, and
answers one message, with ``FEDSHARD_FAULTS`` planned for it. The parent never trains,
opens a gRPC channel or starts a thread, so every child starts clean.

A job::

    {"id": "...", "config": {...federation config...}, "state_root": "...", "site": "s2",
     "kind": "train", "message": "...encoded instruction...", "faults": "POINT@N:kill",
     "log": "/path/or/empty", "out": "/path/of/the/reply"}

A job with ``"modules": PATH`` lists there the modules its message imported; a line
``{"import": [names]}`` has the parent import them (torch imports parts of itself, e.g.
``torch._dynamo``, on the first training step: a second of every child otherwise). A
line ``{"prime": [[σ, q, steps], ...], "delta": δ, "accountant": "prv"}`` has it compose
those record-level events once (see :func:`_prime`). Any other line is
a batch (a JSON list of jobs). The parent runs up to ``--workers`` children at once and
writes one line per finished job to stdout: ``{"id": ..., "status": "ok" | "killed" |
"signalled" | "error", "code": exit status or signal}``, then ``{"done": true}`` when the
batch is over; the child writes its encoded reply to ``out`` (the traceback to ``out +
".error"`` if the message raised). An empty line on stdin (or its end) stops the parent.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import json
import os
import signal
import sys
import time
import traceback
from typing import Any

# Everything a site message imports, once, before any fork (no work is done with it here).
import grpc  # noqa: F401
import opacus  # noqa: F401
import sklearn.datasets  # noqa: F401
import torch

import clients.tasks.breast_cancer  # noqa: F401
import fedshard.privacy.accountant
import fedshard.store.sealed_store
import fedshard.zone.rpc.client  # noqa: F401
from fedshard import faults
from fedshard.assembly import make_site
from fedshard.config import FederationConfig
from fedshard.protocol.messages import MessageKind, decode, encode
from fedshard.transports.flower.records import REQUESTS

_ERROR = 3  # the child's exit status when the message raised


def _child(job: dict[str, Any]) -> None:
    """Run one job in this (forked) process; never returns."""
    code = _ERROR
    before = set(sys.modules)
    try:
        os.dup2(2, 1)  # stdout is the parent's answer channel
        torch.set_num_threads(1)
        faults.configure(job.get("faults") or "", job.get("log") or "")
        config = FederationConfig.model_validate(job["config"])
        site = make_site(config, job["site"], job["state_root"])
        kind = MessageKind(job["kind"])
        reply = site.handle(kind, decode(REQUESTS[kind], job["message"]))
        with open(job["out"], "wb") as fh:
            fh.write(encode(reply))
        if job.get("modules"):
            with open(job["modules"], "w", encoding="utf-8") as fh:
                fh.write("\n".join(sorted(set(sys.modules) - before)))
        code = 0
    except BaseException:
        with open(job["out"] + ".error", "w", encoding="utf-8") as fh:
            fh.write(traceback.format_exc())
    finally:
        os._exit(code)


def _prime(compositions: list[list[float]], delta: float, accountant: str) -> None:
    """Compute ε of each ``[σ, q, steps]`` here, once: the accountant caches it, so the children,
    which inherit the cache, do not compose the same events again (seconds each with PRV)."""
    from fedshard.privacy.accountant import AccountantKind, epsilon
    from fedshard.privacy.events import DPEvent, Guarantee

    for sigma, q, steps in compositions:
        epsilon([DPEvent(Guarantee.RECORD, sigma, q, int(steps))], delta, AccountantKind(accountant))


def _status(raw: int) -> tuple[str, int]:
    if os.WIFSIGNALED(raw):
        sig = os.WTERMSIG(raw)
        return ("killed" if sig == signal.SIGKILL else "signalled"), sig
    code = os.WEXITSTATUS(raw)
    return ("ok" if code == 0 else "error"), code


def main() -> None:
    """Run batches of jobs read from stdin (a JSON list a line), at most ``--workers`` children
    at once; report each job as it ends, then ``{"done": true}`` after each batch."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=2)
    workers = max(1, parser.parse_args().workers)
    gc.freeze()  # the children's collector leaves the parent's objects (and their pages) alone
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            break
        doc = json.loads(line)
        if isinstance(doc, dict):  # {"prime": ...} or {"import": ...}
            if "prime" in doc:
                _prime(doc["prime"], doc["delta"], doc["accountant"])
            for name in doc.get("import", ()):
                with contextlib.suppress(Exception):
                    importlib.import_module(name)
            gc.freeze()
            print(json.dumps({"done": True}), flush=True)
            continue
        running: dict[int, tuple[str, float]] = {}
        for job in doc:
            if len(running) >= workers:
                _reap(running)
            pid = os.fork()
            if pid == 0:
                _child(job)
            running[pid] = (job["id"], time.monotonic())
        while running:
            _reap(running)
        print(json.dumps({"done": True}), flush=True)


def _reap(running: dict[int, tuple[str, float]]) -> None:
    """Wait for one child of ``running`` to end and report it."""
    pid, raw, usage = os.wait4(-1, 0)
    status, code = _status(raw)
    cpu = usage.ru_utime + usage.ru_stime
    job, started = running.pop(pid)
    wall = time.monotonic() - started
    print(json.dumps({"id": job, "status": status, "code": code, "cpu": cpu, "wall": wall}), flush=True)


if __name__ == "__main__":
    main()
