"""Server-side optimisers applied by sites to each aggregate."""

from __future__ import annotations

import numpy as np
import pytest

from fedshard.aggregation import ServerOptimizer
from fedshard.aggregation.server_rules import RULES, register
from fedshard.errors import ConfigError
from tests.toy_parts import SignMomentum


def _params() -> dict[str, np.ndarray]:
    return {"w#r0c0": np.array([[1.0, -2.0]], np.float32), "b#r0c0": np.array([[0.5]], np.float32)}


def test_avg_adds_the_scaled_aggregate() -> None:
    params = _params()
    ServerOptimizer("avg", learning_rate=0.5).apply(params, {"w#r0c0": np.array([[2.0, 2.0]], np.float32)}, {})
    np.testing.assert_array_equal(params["w#r0c0"], [[2.0, -1.0]])
    np.testing.assert_array_equal(params["b#r0c0"], [[0.5]])  # absent from the aggregate: unchanged


def test_momentum_accumulates_across_rounds() -> None:
    params, state = _params(), {}
    opt = ServerOptimizer("momentum", learning_rate=1.0, beta1=0.5)
    delta = {"b#r0c0": np.array([[1.0]], np.float32)}
    opt.apply(params, delta, state)  # m = 1
    opt.apply(params, delta, state)  # m = 1.5
    assert params["b#r0c0"][0, 0] == pytest.approx(0.5 + 1.0 + 1.5)
    assert state["m:b#r0c0"][0, 0] == pytest.approx(1.5)


def test_adam_normalises_the_step() -> None:
    params, state = _params(), {}
    opt = ServerOptimizer("adam", learning_rate=0.1, beta1=0.9, beta2=0.99, tau=1e-3)
    opt.apply(params, {"b#r0c0": np.array([[4.0]], np.float32)}, state)
    m, v = 0.1 * 4.0, 0.01 * 16.0
    assert params["b#r0c0"][0, 0] == pytest.approx(0.5 + 0.1 * m / (np.sqrt(v) + 1e-3), rel=1e-6)
    assert params["b#r0c0"].dtype == np.float32


def test_every_site_computes_the_same_bits() -> None:
    rng = np.random.default_rng(0)
    deltas = [{"w#r0c0": rng.standard_normal((1, 2)).astype(np.float32)} for _ in range(5)]
    results = []
    for _ in range(2):
        params, state = _params(), {}
        opt = ServerOptimizer("adam", learning_rate=0.01)
        for d in deltas:
            opt.apply(params, d, state)
        results.append(params["w#r0c0"].tobytes())
    assert results[0] == results[1]


def test_describe_names_the_rule() -> None:
    assert ServerOptimizer("momentum", 0.5).describe().startswith("momentum:lr=0.5")


def test_a_new_rule_is_one_class_and_one_registration() -> None:
    toy = SignMomentum()
    register(toy)
    try:
        params, state = _params(), {}
        ServerOptimizer("sign-momentum", learning_rate=0.25, beta1=0.5).apply(
            params, {"w#r0c0": np.array([[3.0, -0.1]], np.float32)}, state
        )
        np.testing.assert_array_equal(params["w#r0c0"], [[1.25, -2.25]])
        assert state["m:w#r0c0"].tolist() == [[3.0, pytest.approx(-0.1)]]
        with pytest.raises(ConfigError, match="already registered"):
            register(SignMomentum())  # another rule under a taken name
    finally:
        RULES.remove("sign-momentum")
    with pytest.raises(ConfigError, match=r"'sign-momentum': no such server optimiser \(adam, avg, momentum\)"):
        ServerOptimizer("sign-momentum").apply(_params(), {"w#r0c0": np.zeros((1, 2), np.float32)}, {})
