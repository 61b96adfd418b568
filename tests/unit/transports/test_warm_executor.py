"""The warm SuperNode's parts: the Flower-internals check, the poll shim, fork-safe preloading,
and the choice between the warm and the stock executor."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fedshard.deploy.site import plan_site
from fedshard.transports.flower.compat import supernode, waits, warm_checks, warm_executor

ROOT = Path(__file__).resolve().parents[3]


def test_the_installed_flower_has_the_internals_the_warm_executor_relies_on() -> None:
    assert warm_checks.problem() is None


def test_another_flower_release_is_refused_by_version(monkeypatch: pytest.MonkeyPatch) -> None:
    """One release range for every patch (fedshard.transports.flower.compat._release): each falls back on another."""
    from fedshard.transports.flower.compat import _release as release
    from fedshard.transports.flower.compat import delivery, waits

    monkeypatch.setattr(release, "version", lambda _: "1.43.0")
    assert warm_checks.problem() == ("flwr 1.43.0 is installed; the warm executor was written against flwr 1.42.*")
    assert delivery.problem() == "flwr 1.43.0 is installed; the one-pass delivery was written against flwr 1.42.*"
    assert waits.shorten_object_pulls("flwr.supernode.start_client_internal") is False  # changed nothing


def test_a_changed_run_clientapp_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from flwr.supernode.runtime import run_clientapp as module

    def run_clientapp(runtime_api_address: str, token: str) -> None: ...

    monkeypatch.setattr(module, "run_clientapp", run_clientapp)
    reason = warm_checks.problem()
    assert reason is not None and reason.startswith("run_clientapp takes (runtime_api_address, token)")


def test_a_supernode_loop_that_no_longer_sleeps_through_time_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from flwr.supernode import start_client_internal as loop

    monkeypatch.setattr(loop, "time", waits.PollClock(0.1, 0.01))
    assert warm_checks.problem() == "flwr.supernode.start_client_internal no longer polls with `time.sleep(3)`"


def test_the_poll_clock_shortens_only_flowers_fixed_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    clock = waits.PollClock(poll_s=0.2, wait_s=0.02)
    clock.sleep(3)  # an empty pull
    clock.sleep(0.5)  # waiting for the ClientApp's reply
    clock.sleep(0.001)
    assert slept == [0.2, 0.02, 0.001]
    assert clock.monotonic is time.monotonic  # everything else is the time module's


def test_install_puts_the_clock_into_flowers_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    from flwr.supernode import start_client_internal as loop

    monkeypatch.setattr(loop, "time", time)
    clock = supernode.install(0.3, 0.05)
    assert loop.time is clock and clock.poll_s == 0.3


def test_object_pulls_back_off_briefly_where_flower_waits_a_second(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    calls: list[dict[str, float]] = []

    def pull_objects(ids: list[str], *, initial_backoff: float = 1, backoff_cap: float = 10) -> None:
        calls.append({"initial_backoff": initial_backoff, "backoff_cap": backoff_cap})

    def pull_and_inflate_object_from_tree(tree: object) -> None: ...  # no backoff parameters: left alone

    fake = types.ModuleType("fake_flower_module")
    fake.pull_objects = pull_objects  # type: ignore[attr-defined]
    fake.pull_and_inflate_object_from_tree = pull_and_inflate_object_from_tree  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_flower_module", fake)
    assert waits.shorten_object_pulls("fake_flower_module")
    fake.pull_objects(["a"])
    assert calls == [{"initial_backoff": waits.PULL_BACKOFF, "backoff_cap": waits.PULL_BACKOFF_CAP}]
    assert fake.pull_and_inflate_object_from_tree is pull_and_inflate_object_from_tree
    assert waits.shorten_object_pulls("fake_flower_module")  # twice: still one partial, not two
    assert fake.pull_objects.func is pull_objects
    assert not waits.shorten_object_pulls("no_such_module_here")


@pytest.mark.parametrize(
    "module",
    ["flwr.supernode.runtime.run_clientapp", "flwr.supernode.start_client_internal", "flwr.superlink.grid.http_grid"],
)
def test_flowers_own_pull_functions_are_shortened(module: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    target = importlib.import_module(module)
    for name in ("pull_objects", "pull_and_inflate_object_from_tree"):
        if hasattr(target, name):
            monkeypatch.setattr(target, name, getattr(target, name))  # restored after the test
    assert waits.shorten_object_pulls(module)


def test_preload_refuses_to_fork_from_a_process_with_threads() -> None:
    release = threading.Event()
    worker = threading.Thread(target=release.wait)
    worker.start()
    try:
        with pytest.raises(RuntimeError, match="forking is not safe"):
            warm_executor.preload(modules=[], optional=[], packages=[])
    finally:
        release.set()
        worker.join()


def test_preloading_everything_a_site_imports_starts_no_thread() -> None:
    """What the executor imports before it forks (torch, Flower, fedshard, Opacus, TenSEAL)
    leaves one thread, with OpenBLAS and numexpr told to start none (as the executor does)."""
    code = "from fedshard.transports.flower.compat import warm_executor as w; print(len(w.preload()), w.thread_count())"
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # a site's shell need not set it
    env.update(dict.fromkeys(warm_executor.ONE_THREAD, "1"))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, check=True)
    loaded, threads = map(int, done.stdout.split())
    assert loaded >= len(warm_executor.PRELOAD) and threads == 1


@pytest.fixture
def site_config(tmp_path: Path) -> Path:
    from fedshard.config import load_federation
    from fedshard.deploy.keys import provision
    from fedshard.deploy.loopback import write_loopback_layout

    paths = write_loopback_layout(ROOT / "configs", tmp_path)
    provision(load_federation(paths["aggregator"]), tmp_path / "keys")
    return paths["charite-berlin"]


def test_a_site_runs_warm_by_default_and_stock_when_asked(site_config: Path) -> None:
    warm = plan_site(site_config)
    assert (warm.executor, warm.fallback) == ("warm", None)
    stock = plan_site(site_config, executor="flower")
    assert (stock.executor, stock.fallback) == ("flower", None)
    assert stock.command[0].endswith("flower-supernode")


def test_a_site_falls_back_to_flowers_executor_when_the_internals_differ(
    site_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(warm_checks, "problem", lambda: "flwr 9.9 is installed")
    launch = plan_site(site_config)
    assert (launch.executor, launch.fallback) == ("flower", "flwr 9.9 is installed")


def _executor(parent_pid: int) -> warm_executor.WarmExecutor:
    return warm_executor.WarmExecutor("127.0.0.1:9", b"secret", parent_pid, poll_s=0.01)


def test_each_task_runs_in_its_own_forked_child_with_its_own_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def run_task(address: str, token: str, parent_pid: int) -> None:  # in the child
        (tmp_path / token).write_text(f"{os.getpid()} {parent_pid} {address}")
        os._exit(0)

    monkeypatch.setattr(warm_executor, "_run_task", run_task)
    tokens = iter(["token-a", None, "token-b"])
    executor = _executor(os.getpid())
    monkeypatch.setattr(executor, "acquire", lambda: next(tokens, None))
    executor.run(stop=lambda: (tmp_path / "token-b").exists())
    while executor.children:
        executor.reap()
    records = [(tmp_path / t).read_text().split() for t in ("token-a", "token-b")]
    assert {r[1] for r in records} == {str(os.getpid())}  # each child's parent is the executor
    assert records[0][0] != records[1][0] != str(os.getpid())  # one process per task
    assert all(r[2] == "127.0.0.1:9" for r in records)


def test_the_executor_stops_when_its_supernode_is_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    executor = _executor(gone.pid)
    monkeypatch.setattr(executor, "acquire", lambda: pytest.fail("asked for a task without a SuperNode"))
    executor.run(stop=lambda: False)  # returns at once
