"""DP mechanisms behind one Protocol, in a registry: a task's own mechanism is one class and a
``register`` line; names nobody registered, or registered for the other guarantee, are refused
in one line; a coordinator cannot switch a site to another mechanism than its own config's."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedshard.config import BudgetConfig, PrivacyConfig
from fedshard.errors import ConfigError, PrivacyError
from fedshard.privacy.events import DPEvent, Guarantee
from fedshard.privacy.mechanisms import MECHANISMS, Mechanism, RoundShape, Sharing, mechanism, register
from fedshard.privacy.mechanisms.gaussian_update import update_event
from fedshard.protocol.messages import UpdatePlan
from fedshard.site.terms import PrivacyTerms
from tests.toy_parts import PerTensorGaussian


def test_the_built_in_mechanisms_follow_the_protocol_one_per_guarantee() -> None:
    assert isinstance(MECHANISMS["dpsgd"], Mechanism) and isinstance(MECHANISMS["gaussian"], Mechanism)
    assert mechanism("dpsgd", Guarantee.RECORD).event(RoundShape(40, 8, 2), 1.1) == DPEvent(
        Guarantee.RECORD, 1.1, 0.2, 10
    )
    assert mechanism("gaussian", Guarantee.UPDATE).event(RoundShape(40, 8, 2), 0.7) == update_event(0.7)


def test_names_nobody_registered_or_for_the_other_guarantee_are_refused_in_one_line(per_tensor) -> None:
    with pytest.raises(ConfigError, match=r"update_level\.mechanism 'laplace': no such .*ones: gaussian, per-tensor$"):
        mechanism("laplace", Guarantee.UPDATE)
    with pytest.raises(
        ConfigError, match=r"record_level\.mechanism 'per-tensor': a update-level .*ones: dpsgd, dpsgd-normalized$"
    ):
        mechanism("per-tensor", Guarantee.RECORD)
    with pytest.raises(ConfigError, match="already registered"):
        register(PerTensorGaussian())
    with pytest.raises(ValueError, match="'dpsgd' is not a update-level DP mechanism this party knows"):
        UpdatePlan(mechanism="dpsgd", clip_norm=1.0, noise_multiplier=1.0)
    with pytest.raises(ConfigError, match="no such DP mechanism"):  # a site's own config is checked when it is built
        PrivacyTerms(PrivacyConfig(update_level={"enabled": True, "mechanism": "lapalce"}, budget={"epsilon": 1}))


def test_a_coordinator_cannot_switch_a_site_to_another_mechanism(per_tensor) -> None:
    budget = BudgetConfig(epsilon=3.0)
    own = PrivacyConfig(update_level={"enabled": True, "mechanism": "per-tensor"}, budget=budget)
    terms = PrivacyTerms(own, budget)
    from fedshard.privacy.accountant import AccountantKind
    from fedshard.protocol.messages import PrivacyPlan

    def plan(name: str) -> PrivacyPlan:
        update = UpdatePlan(mechanism=name, clip_norm=1.0, noise_multiplier=1.0)
        return PrivacyPlan(
            accountant=AccountantKind.RDP, epsilon=3.0, delta=1e-5, batch_size=8, epochs=1, update=update
        )

    assert terms.admit(plan("per-tensor"), "h1") is not None
    with pytest.raises(PrivacyError, match=r"h1: .*mechanism 'gaussian'; its own config names 'per-tensor'"):
        terms.admit(plan("gaussian"), "h1")


def test_a_registered_mechanism_releases_what_it_promises(per_tensor) -> None:
    run = mechanism("per-tensor", Guarantee.UPDATE).start(update_event(1e-9), 2.0, Sharing(None, 10, 1.0, 1.0))
    out = run.release({"a": np.full(100, 3.0, np.float32), "b": np.full(4, -0.5, np.float32)})
    assert float(np.linalg.norm(out["a"])) == pytest.approx(2.0 / math.sqrt(2), rel=1e-6)
    assert float(np.linalg.norm(out["b"])) == pytest.approx(1.0, rel=1e-6)  # 1 < √2: unclipped
    assert run.training is None
