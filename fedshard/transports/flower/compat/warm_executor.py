"""``python -m fedshard.transports.flower.compat.warm_executor``: a site's SuperExec that forks
warm ClientApp processes.

Flower's stock SuperExec starts a fresh ``flwr-clientapp`` process for every message a
SuperNode receives, and each pays the interpreter, Flower, torch and fedshard imports
(3–6 s on two cores) before any work. This executor takes the same tasks from the
SuperNode's Runtime API (``AcquireTask``, authenticated with the SuperExec secret that
``fedshard site up`` writes for this SuperNode alone), but imports those modules once and
then forks one child per task. The child runs Flower's own ``run_clientapp`` with the
task's token, exactly as ``flwr-clientapp --token`` would: it pulls the message, its
context and the FAB through the Runtime API, loads the ClientApp from the installed FAB,
replies and exits. Isolation is the stock one (one process and one token per message);
the parent holds no keys, site state, threads or torch tensors when it forks (checked at
start-up: :func:`preload` refuses to start with more than one thread).

    python -m fedshard.transports.flower.compat.warm_executor --runtime-api-address 127.0.0.1:9094 \\
        --superexec-auth-secret-file SECRET --parent-pid PID [--poll-s 0.05]

It exits when the SuperNode (``--parent-pid``) is gone, and stops its children on SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import pkgutil
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from fedshard.transports.flower.compat.waits import shorten_object_pulls
from fedshard.transports.flower.host_watch import pid_alive

__all__ = ["PRELOAD", "WarmExecutor", "main", "preload", "thread_count"]

PRELOAD = (
    "torch",
    "torch._dynamo",  # imported by the first optimiser a process builds: ~0.5 s of every message otherwise
    "flwr.supernode.runtime.run_clientapp",
    "flwr.clientapp",
    "fedshard.assembly",
    "fedshard.site.site",
    "fedshard.transports.flower.client_app",
    "fedshard.transports.flower.records",
    "fedshard.zone.rpc.client",
)
"""What every fedshard ClientApp process imports; loaded once, before any fork."""

PRELOAD_PACKAGES = (
    "fedshard.site",
    "fedshard.store",
    "fedshard.crypto",
    "fedshard.privacy",
    "fedshard.integrity",
    "fedshard.sharding",
    "fedshard.residency",
    "fedshard.protocol",
    "fedshard.config",
    "fedshard.zone.rpc",
    "fedshard.transports.flower",
)
"""Packages whose every module a site message may import lazily (each imported once, here)."""

OPTIONAL_PRELOAD = (
    "opacus",
    "tenseal",
    "grpc.experimental",
    "sklearn.datasets",
    "sklearn.model_selection",
    "sklearn.preprocessing",
)
"""Heavy imports some sites need (DP-SGD, HE, the example tasks' data), when installed."""

ACQUIRE = "/flwr.proto.Runtime/AcquireTask"
ONE_THREAD = ("OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS")
"""Thread pools that start when their library loads, unless told to use one thread: OpenBLAS's
(numpy) and numexpr's (pandas imports it where it is installed, e.g. beside scikit-survival)."""


def thread_count() -> int:
    """Operating-system threads of this process (psutil)."""
    import psutil

    return int(psutil.Process().num_threads())


def preload(
    modules: Sequence[str] = PRELOAD,
    optional: Sequence[str] = OPTIONAL_PRELOAD,
    packages: Sequence[str] = PRELOAD_PACKAGES,
) -> list[str]:
    """Import ``modules``, every module of ``packages`` and those of ``optional`` that are
    installed; the names imported.

    Raises
    ------
    RuntimeError
        An import started a thread: forking this process would not be safe.
    """
    done = []
    for name in [*modules, *_walk(packages), *optional]:
        try:
            importlib.import_module(name)
        except ImportError:
            if name in modules:
                raise
            continue
        done.append(name)
    shorten_object_pulls("flwr.supernode.runtime.run_clientapp")  # the child pulls its message's objects
    if (threads := thread_count()) > 1:
        raise RuntimeError(f"importing {', '.join(done)} started {threads - 1} thread(s); forking is not safe")
    return done


class WarmExecutor:
    """Takes ClientApp tasks from one SuperNode's Runtime API and forks a child for each.

    Parameters
    ----------
    runtime_api_address:
        The SuperNode's Runtime API (``127.0.0.1:<deployment.port>``), plain HTTP on
        loopback as in Flower's stock subprocess mode.
    secret:
        The SuperExec auth secret the SuperNode was started with (its ``AcquireTask``
        answers only requests signed with it).
    parent_pid:
        The SuperNode's pid: the executor exits when it is gone.
    poll_s:
        Pause between ``AcquireTask`` calls while none is pending (right after a task it
        asks again at once).
    """

    def __init__(self, runtime_api_address: str, secret: bytes, parent_pid: int, poll_s: float = 0.05) -> None:
        from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor, SuperExecAuthHttpInterceptor
        from flwr.supercore.retry import make_simple_http_retry_invoker
        from flwr.supercore.runtime import RuntimeHttpClient

        self.address = runtime_api_address
        self.parent_pid = parent_pid
        self.poll_s = poll_s
        self.children: set[int] = set()
        retry = make_simple_http_retry_invoker()
        retry.max_time = 10.0  # a SuperNode that does not answer for this long is gone: see run()
        self.client = RuntimeHttpClient.from_server_address(
            server_address=runtime_api_address,
            insecure=True,
            root_certificates=None,
            interceptors=[
                RuntimeVersionHttpInterceptor(component_name="SuperExec"),
                SuperExecAuthHttpInterceptor(master_secret=secret, protected_methods=frozenset({ACQUIRE})),
            ],
            retry_invoker=retry,
        )

    def acquire(self) -> str | None:
        """One ``AcquireTask``: the token of a pending ClientApp task, or None."""
        from flwr.proto.runtime_pb2 import AcquireTaskRequest
        from flwr.supercore.constant import TaskType

        res = self.client.AcquireTask(AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP]))
        return str(res.token) if res.HasField("task") and res.token else None

    def launch(self, token: str) -> int:
        """Fork a child that runs the task of ``token``; its pid."""
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child never returns
            _run_task(self.address, token, parent_pid=os.getppid())
        self.children.add(pid)
        return pid

    def reap(self) -> None:
        """Collect the children that exited."""
        for pid in list(self.children):
            with contextlib.suppress(ChildProcessError):
                done, _ = os.waitpid(pid, os.WNOHANG)
                if not done:
                    continue
            self.children.discard(pid)

    def run(self, stop: Callable[[], bool]) -> None:
        """Take and launch tasks until ``stop()`` is true or the SuperNode is gone."""
        pause = self.poll_s
        while not stop() and pid_alive(self.parent_pid):
            self.reap()
            try:
                token = self.acquire()
            except Exception as exc:
                if not pid_alive(self.parent_pid):
                    break
                print(f"fedshard warm executor: AcquireTask failed ({type(exc).__name__}: {exc})", flush=True)
                token = None
            if token is not None:
                self.launch(token)
                pause = self.poll_s
                continue
            time.sleep(pause)
            pause = min(pause * 1.5, 0.25)

    def stop_children(self, timeout: float = 10.0) -> None:
        """SIGTERM the running children, then SIGKILL those still there after ``timeout``."""
        for pid in self.children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while self.children and time.monotonic() < deadline:
            self.reap()
            time.sleep(0.05)
        for pid in self.children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.client.close()


def _walk(packages: Sequence[str]) -> list[str]:
    """Every module below ``packages`` (the packages included)."""
    names = []
    for package in packages:
        names.append(package)
        path = getattr(importlib.import_module(package), "__path__", None)
        if path is not None:
            names += [info.name for info in pkgutil.walk_packages(path, prefix=f"{package}.")]
    return names


def _run_task(address: str, token: str, parent_pid: int) -> None:
    """In the forked child: Flower's ``run_clientapp`` for one task, then ``os._exit``."""
    code = 1
    try:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)  # Flower's run_clientapp installs its own
        from flwr.supernode.runtime.run_clientapp import run_clientapp

        run_clientapp(
            runtime_api_address=address,
            token=token,
            insecure=True,
            certificates=None,
            parent_pid=parent_pid,
            runtime_dependency_install=False,
        )
        code = 0
    except SystemExit as exc:  # Flower's flwr_exit ends every task this way
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def main(argv: list[str] | None = None) -> int:
    """Check Flower's internals, preload, then serve tasks until the SuperNode or a signal stops us."""
    parser = argparse.ArgumentParser(
        prog="python -m fedshard.transports.flower.compat.warm_executor",
        description=" ".join(__doc__.split("\n\n")[0].split()),
    )
    parser.add_argument("--runtime-api-address", required=True, help="the SuperNode's Runtime API, host:port")
    parser.add_argument("--superexec-auth-secret-file", type=Path, required=True, help="the SuperExec auth secret")
    parser.add_argument("--parent-pid", type=int, required=True, help="the SuperNode's pid")
    parser.add_argument("--poll-s", type=float, default=0.05, help="pause between task polls (default 0.05)")
    args = parser.parse_args(argv)
    # OpenBLAS and numexpr start their worker threads when they load, unless told not to: one
    # thread, so that the parent forks with none (torch's own threads start lazily, in the child)
    for pool in ONE_THREAD:
        os.environ[pool] = "1"
    from fedshard.transports.flower.compat.warm_checks import problem

    if reason := problem():
        print(f"fedshard warm executor: cannot run: {reason}", file=sys.stderr, flush=True)
        return 3
    t0 = time.perf_counter()
    try:
        loaded = preload()
    except (ImportError, RuntimeError) as exc:
        print(f"fedshard warm executor: cannot run: {exc}", file=sys.stderr, flush=True)
        return 3
    stopping = False

    def _stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    executor = WarmExecutor(
        args.runtime_api_address, args.superexec_auth_secret_file.read_bytes(), args.parent_pid, args.poll_s
    )
    print(
        f"fedshard warm executor: {len(loaded)} modules preloaded in {time.perf_counter() - t0:.1f}s; "
        f"serving {args.runtime_api_address} for SuperNode pid {args.parent_pid}",
        flush=True,
    )
    try:
        executor.run(lambda: stopping)
    finally:
        executor.stop_children()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
