"""The suite's time budget: no test's setup or body spends over :data:`BUDGET_S` seconds of a
core, nor lasts over :data:`WALL_CAP_S` seconds, unless it is listed in :data:`SLOW_ALLOWED`
with its reason.

The budget is kept in CPU time, the seconds of a core the test's process and every process it
starts spend (:mod:`tests.process_clock`): on a shared machine a test's wall time measures the
machine as much as the test (the same suite took 17 minutes one day and 38 the next, three
pytest-xdist workers and a deployment's dozen processes sharing two cores), its CPU time does not.
The wall-time cap, much looser, holds a test that waits rather than computes.

A listed entry is a test's node id (``tests/…/test_x.py::test_name``, parameters included) or,
for a fixture shared by several tests (a deployed federation set up once), ``fixture:NAME``:
the setup of any test that uses that fixture may then take longer. Keep the list short: an
entry is a property that cannot be shown faster, not a test nobody made faster.

``FEDSHARD_TEST_BUDGET_S`` changes the budget for one run (``0``: no budget).
"""

from __future__ import annotations

import os

BUDGET_S = float(os.environ.get("FEDSHARD_TEST_BUDGET_S", "90"))
"""90 s of a core, spent by the test and the processes it starts."""

WALL_CAP_S = 3 * BUDGET_S * max(1.0, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) / (os.cpu_count() or 1))
"""A test's wall time: three times the budget, times the workers per core under pytest-xdist
(405 s for 3 workers on 2 cores), for a test that waits (on a timeout, a heartbeat) rather than
computes; the factor three is a shared machine's slow day."""

_SMOKE = "tests/integration/test_bench_smoke.py::test_benchmark_runs_in_smoke_mode_and_prints_its_headline"

SLOW_ALLOWED: dict[str, str] = {
    "tests/integration/test_deployment.py::"
    "test_deployed_federation_survives_a_crash_refuses_an_unknown_site_and_grows": (
        "one deployment (SuperLink, 4 then 5 SuperNodes, 3 then 4 zones, DP-SGD, CKKS) shows a crash, a rejoin, "
        "an unknown site refused and the federation growing: ~8 rounds of ~10 s, ~50 s until the SuperLink "
        "declares the killed site unavailable, a dozen processes starting"
    ),
    "tests/integration/test_llm_deploy.py::test_deployed_sites_stream_their_sealed_base_and_release_adapters_only": (
        "three site processes each import torch, transformers and peft, seal their base int8 and train through it"
    ),
    "tests/integration/test_llm_privacy.py::"
    "test_dp_sgd_trains_the_adapters_through_the_streamed_base_within_every_budget": (
        "Opacus DP-SGD (per-example gradients) through the streamed base, on the 4,000 examples the noise needs "
        "for the model to stay useful"
    ),
    "tests/integration/test_hf_deploy.py::test_a_deployed_hf_federation_trains_adapters_a_site_exports_for_peft": (
        "three site processes each import torch, transformers and peft, seal a BERT int8 and train through it, "
        "then a site's adapters are exported and loaded by peft: 87 s within the suite on 2 cores, 140 s on CI"
    ),
    "tests/integration/test_flower_simulation.py::test_flower_engine_with_ten_sites_matches_inprocess": (
        "ten ClientApps on a local Ray runtime, then the same federation in-process"
    ),
    "tests/integration/test_hf_task.py::test_the_flower_engine_runs_it_over_a_sealed_streamed_base": (
        "a Ray runtime whose workers each import torch, transformers and peft and seal a BERT int8: 19 s alone, "
        "226 s inside the whole suite on 2 cores (3 workers), over 300 s on CI; Ray's workers end unwaited-for, "
        "so their CPU time escapes the clock"
    ),
    f"{_SMOKE}[deploy_overhead]": (
        "a deployment whose stock SuperNodes start a Python + torch process per message (what it measures), "
        "restarted warm"
    ),
    "fixture:readme_walk": (
        "the README's quick blocks as pasted, in order: the demo, its report, the metrics demo, the DP and DP+HE "
        "demos, budget show, the 200-round growing simulation, the HE demo (test_cli reads their runs instead "
        "of running its own)"
    ),
    "fixture:outcomes": (
        "every bad-input case of the CLI (96), each a fresh `fedshard` process that imports its command and "
        "is refused in one line, a few at a time: about 100 s of a quiet machine, over 160 s of a loaded one"
    ),
    f"{_SMOKE}[scale]": "two Ray runtimes (fedshard's Flower engine, plain Flower's), each started and stopped",
    f"{_SMOKE}[llm_stream]": "four processes each import torch and build the small transformer; three stores sealed",
    f"{_SMOKE}[hf_finetune]": (
        "a real 22.7 M-parameter MiniLM: central runs at two rates, a federation and a DP federation (its "
        "noise shared under HE), each round a resumed simulation whose six sites load the model folder"
    ),
    f"{_SMOKE}[llm_finetune]": "federated, central, DP and 118 M-share runs of the LLM task, and llm_stream's",
}

RAY = "ray"
"""Tests that start a Ray cluster (Flower's simulation engine): two at once would share one."""
DEPLOYMENT = "deployment"
"""Tests that deploy a federation (SuperLink, SuperNodes, zones): a dozen processes each; two
at once would only slow each other on two cores."""

GROUPS: dict[str, str] = {
    "tests/integration/test_flower_simulation.py": RAY,
    "tests/integration/test_ray_cluster.py": RAY,
    "tests/integration/test_fail_fast.py": RAY,
    "tests/integration/test_hf_task.py::test_the_flower_engine": RAY,
    "tests/integration/test_bench_smoke.py::test_benchmark_runs_in_smoke_mode_and_prints_its_headline[scale]": RAY,
    "tests/integration/test_deployment.py::test_deployed_federation": DEPLOYMENT,
    "tests/integration/test_llm_deploy.py": DEPLOYMENT,
    "tests/integration/test_hf_deploy.py": DEPLOYMENT,
    "tests/integration/test_resume.py::test_deployment_whose": DEPLOYMENT,
    "tests/integration/test_readme.py": "tests/integration/test_cli.py",  # test_cli reads the README walk's runs
    "tests/integration/test_bench_smoke.py::test_benchmark_runs_in_smoke_mode_and_prints_its_headline[deploy_": (
        DEPLOYMENT
    ),
}
"""Node id prefix → the ``xdist_group`` its tests run in (``pytest -n N --dist loadgroup``: one
worker runs a whole group, one test after the other). Any other test is in its module's group
(a module-scoped fixture is set up once), unless the module is in :data:`SPREAD`."""

SPREAD = {"tests/integration/test_bench_smoke.py"}
"""Modules whose tests share nothing and take long: they spread over the workers one by one."""
