"""The Ray runtime under ``fedshard simulate --engine flower``: reached or started before
Flower's engine, so that a Ray that cannot run fails the command in seconds, in one line.

Flower starts Ray itself only when no runtime is initialised in the process; starting it
here first lets us (1) check an existing cluster named by ``RAY_ADDRESS`` before anything
is written, (2) pass ``num_cpus``/``num_gpus`` only to a runtime we start (Ray refuses them
when connecting to a cluster: the cluster sizes itself), (3) retry a local start that timed
out once, with a shorter wait, instead of Flower's three tracebacks and a ServerApp left
waiting for sites that will never come.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
import os
import socket
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fedshard.errors import ConfigError, RoundError

__all__ = ["ADDRESS_ENV", "RETRY_WAIT_S", "check_ray_address", "init_args", "ray_address", "start_ray"]

log = logging.getLogger(__name__)

ADDRESS_ENV = "RAY_ADDRESS"
"""Ray's own variable naming an existing cluster (``HOST:PORT``, ``ray://HOST:PORT`` or ``auto``)."""

RETRY_WAIT_S = 10.0
"""How long the second start of a local runtime waits for Ray's GCS server (Ray's own wait,
used by the first start, is 30 s): a machine that could not start Ray once is told so soon."""

_PROBE_S = 3.0
"""Connect timeout of the reachability check of a cluster address."""

_CONNECT_ENV = {"RAY_py_gcs_connect_timeout_s": "15", "RAY_NUM_REDIS_GET_RETRIES": "1"}
"""Ray, connecting to a cluster, tries 20 times for 35 s each (over ten minutes) before it
says that what answers at the address is not Ray; one try of 20 s (5 s to connect, 15 s for
the cluster's id) says so within the minute the command has. Ray reads these when it is
imported: they are set (unless the user set them) only when a cluster address is given and
Ray is not imported yet."""


def ray_address() -> str | None:
    """The cluster address in ``RAY_ADDRESS``; None when unset, empty or ``local`` (start one here)."""
    address = os.environ.get(ADDRESS_ENV, "").strip()
    return None if address in ("", "local") else address


def _unreachable(address: str, why: str) -> RoundError:
    return RoundError(
        f"could not reach the Ray cluster at {address} ({ADDRESS_ENV}): {why}; start it with `ray start --head` "
        f"or unset {ADDRESS_ENV}"
    )


def check_ray_address(address: str | None = None) -> None:
    """Refuse, in one line, a cluster address nothing answers at (a TCP connect, ≤ 3 s).

    ``address`` defaults to :func:`ray_address`; None (a local runtime) and ``auto``
    (Ray finds its cluster in its own files) pass unchecked.

    Raises
    ------
    ConfigError
        The address is not ``HOST:PORT`` (optionally ``ray://``).
    RoundError
        Nothing accepts connections there.
    """
    address = ray_address() if address is None else address
    if address is None or address == "auto":
        return
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = hostport.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConfigError(
            f"{ADDRESS_ENV}={address!r} is not HOST:PORT; set it to the address `ray start --head` printed, "
            f"or unset {ADDRESS_ENV}"
        )
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=_PROBE_S):
            return
    except OSError as exc:
        raise _unreachable(address, exc.strerror or str(exc) or type(exc).__name__) from None


def init_args(address: str | None) -> dict[str, Any]:
    """``ray.init`` arguments: a runtime started here gets this machine's CPUs; a cluster sizes itself."""
    args: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
    if address is None:  # "local": a runtime of our own, even if a cluster runs on this machine
        args.update(address="local", num_cpus=os.cpu_count() or 1, num_gpus=0)
    else:
        args["address"] = address
    return args


def _runtime_env() -> dict[str, Any]:
    """Ray's workers import the task as this process does (Flower passes the same when it starts Ray)."""
    path = os.pathsep.join(p for p in (*sys.path, os.environ.get("PYTHONPATH", "")) if p)
    return {"env_vars": {"PYTHONPATH": path}}


@contextlib.contextmanager
def _gcs_wait(seconds: float | None) -> Iterator[None]:
    """Within the block, Ray waits at most ``seconds`` for its GCS server to write its port
    (None: Ray's own 30 s). Ray has no setting for this wait (the one that times out on a
    loaded machine), so its module-level helper is wrapped for the block; a Ray without it
    keeps its own wait."""
    import importlib

    try:
        node: Any = importlib.import_module("ray._private.node")
    except ImportError:  # pragma: no cover - Ray reorganised
        node = None
    original = getattr(node, "wait_for_persisted_port", None)
    if seconds is None or original is None:
        yield
        return
    node.wait_for_persisted_port = functools.partial(original, timeout_ms=int(seconds * 1000))
    try:
        yield
    finally:
        node.wait_for_persisted_port = original


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def start_ray(address: str | None = None) -> None:
    """Reach the cluster at ``address`` (default :func:`ray_address`), or start a local runtime.

    A local start that fails is retried once, waiting :data:`RETRY_WAIT_S` for Ray's GCS
    server; a cluster that does not answer is not retried. Ray already running in this
    process is left as it is.

    Raises
    ------
    RoundError
        One line: Ray could not be reached or started, and what to try.
    """
    if "ray" not in sys.modules and importlib.util.find_spec("ray") is None:
        raise RoundError(
            "Flower's simulation engine needs Ray, which this installation leaves out (a deployment does not use "
            "it): pip install 'fedshard[simulation]', or simulate with --engine inprocess"
        )
    address = ray_address() if address is None else address
    if address is not None and "ray" not in sys.modules:
        for name, value in _CONNECT_ENV.items():
            os.environ.setdefault(name, value)
    import ray

    if ray.is_initialized():
        return
    check_ray_address(address)
    if address is not None:
        try:
            ray.init(**init_args(address), runtime_env=_runtime_env())
        except Exception as exc:  # Ray raises ConnectionError, ValueError, RuntimeError, ...
            _shutdown(ray)
            raise _unreachable(address, _one_line(exc)) from None
        return
    for attempt, wait in enumerate((None, RETRY_WAIT_S), start=1):
        try:
            with _gcs_wait(wait):
                ray.init(**init_args(None), runtime_env=_runtime_env())
            return
        except Exception as exc:
            _shutdown(ray)
            if attempt == 2:
                raise RoundError(
                    f"Ray did not start here, twice ({_one_line(exc)}); check free memory and {_ray_tmp()}, "
                    "or run with --engine inprocess"
                ) from None
            log.warning("Ray did not start (%s); retrying once with a %.0f s wait", _one_line(exc), RETRY_WAIT_S)


def _ray_tmp() -> str:
    """Where a local Ray runtime keeps its sockets and logs (``RAY_TMPDIR``, else the system's temp folder)."""
    return str(Path(os.environ.get("RAY_TMPDIR") or tempfile.gettempdir()) / "ray")


def _shutdown(ray: Any) -> None:
    """Stop what a failed ``ray.init`` left running (its GCS server, raylet)."""
    with contextlib.suppress(Exception):
        ray.shutdown()
