"""The Flower internals fedshard's warm SuperNode relies on, checked before it uses them.

``fedshard site up`` runs a site's SuperNode warm (:mod:`fedshard.transports.flower.compat.warm_executor`,
:mod:`fedshard.transports.flower.compat.supernode`) only when :func:`problem` finds every one of these as
expected; otherwise it runs Flower's stock SuperNode and says why in one line. What is
relied on (all public modules of the ``flwr`` wheel, but not documented APIs):

* ``flwr.supernode.cli.flower_supernode.flower_supernode``: the ``flower-supernode``
  entry point, started in ``--isolation process`` with a SuperExec auth secret;
* ``flwr.supernode.start_client_internal``: its main loop sleeps through its module-level
  ``time`` (3 s when the SuperLink has no message, 0.5 s while a reply is awaited); the
  shim gives that module a ``time`` whose ``sleep`` is shorter;
* ``flwr.supercore.runtime.RuntimeHttpClient.AcquireTask`` with ``AcquireTaskRequest``,
  ``SuperExecAuthHttpInterceptor`` and ``RuntimeVersionHttpInterceptor``: how a SuperExec
  takes a task and its token from the SuperNode's Runtime API;
* ``flwr.supernode.runtime.run_clientapp.run_clientapp``: what ``flwr-clientapp`` runs for
  one task (the forked child calls it with the task's token).

The object-pull backoffs are shortened by :func:`fedshard.transports.flower.compat.waits.shorten_object_pulls`,
which checks each function it rebinds itself and leaves a different one alone.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from collections.abc import Callable

from fedshard.transports.flower.compat._release import SUPPORTED, release_problem

__all__ = ["SUPPORTED", "problem"]

_RUN_CLIENTAPP_PARAMETERS = (
    "runtime_api_address",
    "token",
    "insecure",
    "certificates",
    "parent_pid",
    "runtime_dependency_install",
)


def problem() -> str | None:
    """Why the warm SuperNode cannot run on the installed Flower, in a few words; None when it can."""
    wrong = release_problem("the warm executor")
    if wrong is not None:
        return wrong
    for check in _CHECKS:
        try:
            reason = check()
        except (ImportError, AttributeError, TypeError, ValueError, OSError) as exc:
            reason = f"{check.__doc__}: {type(exc).__name__}: {exc}"
        if reason:
            return reason
    return None


def _supernode_loop() -> str | None:
    """flwr.supernode.start_client_internal sleeps through its module's ``time``"""
    module = importlib.import_module("flwr.supernode.start_client_internal")
    if getattr(module, "time", None) is not importlib.import_module("time") or not _sleeps(module, 3):
        return "flwr.supernode.start_client_internal no longer polls with `time.sleep(3)`"
    entry = importlib.import_module("flwr.supernode.cli.flower_supernode")
    parse = getattr(entry, "_parse_args_run_supernode", None)
    if not callable(getattr(entry, "flower_supernode", None)) or not callable(parse):
        return "flwr.supernode.cli.flower_supernode has no flower_supernode() with --isolation"
    try:  # by behaviour: its parser takes the isolation mode the warm executor needs
        args, _ = parse().parse_known_args(["--isolation", "process", "--insecure"])
    except SystemExit:
        args = None
    if getattr(args, "isolation", None) != "process":
        return "flwr.supernode.cli.flower_supernode has no flower_supernode() with --isolation"
    return None


def _sleeps(module: object, seconds: float) -> bool:
    """Whether ``module``'s code calls ``time.sleep(seconds)`` (read from its syntax tree: a
    loop's sleep cannot be watched without running the SuperNode)."""
    tree = ast.parse(inspect.getsource(module))  # type: ignore[arg-type]
    return any(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "sleep"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "time"
        and [a.value for a in node.args if isinstance(a, ast.Constant)] == [seconds]
        for node in ast.walk(tree)
    )


def _runtime_api() -> str | None:
    """the SuperNode's Runtime API client"""
    runtime = importlib.import_module("flwr.supercore.runtime")
    messages = importlib.import_module("flwr.proto.runtime_pb2")
    interceptors = importlib.import_module("flwr.supercore.interceptors")
    constant = importlib.import_module("flwr.supercore.constant")
    missing = [
        name
        for name, ok in (
            ("RuntimeHttpClient.AcquireTask", hasattr(runtime.RuntimeHttpClient, "AcquireTask")),
            ("RuntimeHttpClient.from_server_address", hasattr(runtime.RuntimeHttpClient, "from_server_address")),
            ("AcquireTaskRequest", hasattr(messages, "AcquireTaskRequest")),
            ("SuperExecAuthHttpInterceptor", hasattr(interceptors, "SuperExecAuthHttpInterceptor")),
            ("RuntimeVersionHttpInterceptor", hasattr(interceptors, "RuntimeVersionHttpInterceptor")),
            ("TaskType.CLIENT_APP", hasattr(getattr(constant, "TaskType", None), "CLIENT_APP")),
        )
        if not ok
    ]
    return f"Flower's Runtime API lacks {', '.join(missing)}" if missing else None


def _run_clientapp() -> str | None:
    """flwr.supernode.runtime.run_clientapp.run_clientapp"""
    module = importlib.import_module("flwr.supernode.runtime.run_clientapp")
    parameters = tuple(inspect.signature(module.run_clientapp).parameters)
    if parameters != _RUN_CLIENTAPP_PARAMETERS:
        return f"run_clientapp takes ({', '.join(parameters)}), not ({', '.join(_RUN_CLIENTAPP_PARAMETERS)})"
    return None


_CHECKS: tuple[Callable[[], str | None], ...] = (_supernode_loop, _runtime_api, _run_clientapp)
