"""The runs of ``bench/hf_finetune.py`` (not a benchmark itself): the HF task's LoRA, central and
federated, each trained until its validation accuracy stops improving, then scored once on the test set.

**The patience rule, the same for both.** After every epoch (central) or round (federated) the
model is scored on the same validation examples (a split of the table the sites never train on;
this bench scores the federation's model on all of it, as it scores the central one). The best
score so far and the tensors that gave it (adapters and head: ``trained_state``) are kept;
training stops once ``patience`` evaluations in a row have not beaten the best, or after
``max_steps``; the kept best is then scored once on the test split.

**Central**: the task's own training loop (:func:`fedshard.tasks.hf.training.fit`, Adam state
carried across epochs) on the pooled training examples of every site, the fp32 base resident.

**Federated**: ``fedshard simulate`` (in-process: real gRPC zones on loopback, every site's
store sealed and verified) of ``configs/demo-hf.yaml`` with every site in the EU (one averaged
model), run one round at a time: round ``r`` is ``simulate --resume`` with ``rounds: r``, then
the model a site's store holds (:func:`fedshard.assembly.sites.site_model`, what ``fedshard
export adapter`` writes) is scored. The run's own per-round scoring is cut to one
validation row per site (``max_scored``): the bench's scoring is the one that counts.

**DP** (``Variant.epsilon``): record-level DP-SGD (Opacus on the adapters and head) at every
site, budget ε per site, δ = 1e-5. The number of rounds is not known in advance, so each site
calibrates its own σ, to its own records, for the horizon ``max_steps``
(``privacy.record_level.calibration_rounds``: a site of 400 records needs less noise than one
of 60; stopping earlier spends less), and every site's ledger is checked against ε after the
run. The central floor is DP-SGD on the pooled data with σ calibrated the same way for
``max_steps`` epochs.

**DP with shared noise** (``Variant.shared_noise``): the noise is shared under HE instead
(``privacy.record_level.distributed_over``: every site adds σ/√(n−1) of it, the zone adds
ciphertexts, the decrypted sum less any one site's share carries the full σ): a round is one
DP-SGD step of every record of every site (``batch_size: all``, plain SGD at rate 1, so the
average is the pooled data's noisy mean gradient), the server's Adam applies it at the variant's
rate. Every site's σ is then the same, calibrated for ``max_steps`` such rounds: the noise of the
pooled sum, not of a site's few records.

**Sampled rounds** (``Variant.sample_rate`` below 1, ``privacy.record_level.sample_rate``): with
the noise shared, each round is one DP-SGD step over a Poisson sample of every site's records at
that rate, which is the pooled data's DP-SGD step at that rate: ``1 / rate`` rounds make an epoch,
and the model is scored after each such epoch (the patience rule counts epochs, as the central
run's does); σ is calibrated for ``max_steps`` epochs of such rounds.
"""

from __future__ import annotations

import contextlib
import functools
import resource
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import _common as c
from _llm_finetune_runs import no_central

DEMO = c.REPO / "configs" / "demo-hf.yaml"
DELTA = 1e-5
CLIP = 1.0
"""DP-SGD's per-example clipping bound (the task trains with Adam; its step does not scale with the clip)."""
SHARED_TAU = 1e-6
"""Shared noise: the server Adam's τ, far below the averaged update's ~5e-3 per value (σ/records)."""
SHARED_VALUE_RANGE = 1.0
"""Shared noise: ``he.value_range``. A site's update is its records' mean clipped gradient (each value
≤ the clip, 1) plus its noise share, a few hundredths per value, weighed by its records over the
largest site's (≤ 1)."""


@dataclass(frozen=True)
class Setting:
    """What every run of one bench invocation shares."""

    examples: int
    """The training pool (the task's ``max_examples``), cut among the six sites with label skew."""
    validation: int
    """Validation examples scored after every epoch or round."""
    test: int
    """Test examples scored once, on the kept best."""
    max_length: int
    rank: int
    batch: int
    patience: int
    max_steps: int
    scheme: str = "ffa"
    dirichlet_alpha: float = 1.0

    def key(self) -> str:
        """The setting as one cache key."""
        return ",".join(f"{k}={v}" for k, v in asdict(self).items())


@dataclass(frozen=True)
class Variant:
    """A federated recipe: the FedAvg of FFA-LoRA, or another the literature uses for drift."""

    name: str
    server: dict[str, Any] = field(default_factory=dict)
    """``training.server_optimizer`` (empty: plain averaging)."""
    scheme: str | None = None
    """``task.options.scheme`` when it differs from the setting's."""
    epsilon: float | None = None
    """Record-level DP at every site with this budget (None: none)."""
    shared_noise: bool = False
    """DP: the noise is shared under HE, a round one full-batch step applied by the server's Adam at the
    run's rate (see the module docstring); else each site adds all of its own."""
    sample_rate: float = 1.0
    """Shared noise: each round's one step samples every record at this rate (1: every record)."""

    @property
    def rounds_per_epoch(self) -> int:
        """Rounds between two scorings: ``1 / sample_rate`` (one for rounds of whole local epochs)."""
        return round(1.0 / self.sample_rate)

    @property
    def server_step(self) -> float:
        """How many times the averaged update is applied (plain averaging's rate; 1 for other rules)."""
        return float(self.server.get("learning_rate", 1.0)) if self.server.get("kind") == "avg" else 1.0


def dp_variant(epsilon: float, server_step: float = 1.0) -> Variant:
    """FedAvg of FFA-LoRA with record-level DP at ``epsilon`` per site, the averaged update applied
    ``server_step`` times (``training.server_optimizer: {kind: avg, learning_rate: server_step}``;
    post-processing, no privacy cost).

    Why a step above 1 under DP: each site's Adam moves every coordinate by about its rate per step
    whatever the noise, and a round averages six sites' few steps, so the noise of each site is
    averaged down while the federation as a whole moves like one site's epoch; the pooled run moves
    an epoch of all 1,200 records. Scaling the average by about (records in all) / (records of the
    mean site, weighted) ≈ 4.7 for the demo's cut lets a round move as far as an epoch of the pooled
    run, with the noise of the average, not of one site."""
    server = {} if server_step == 1.0 else {"kind": "avg", "learning_rate": server_step}
    return Variant(f"dp-eps{epsilon:g}", server=server, epsilon=epsilon)


def shared_dp_variant(epsilon: float, sample_rate: float = 1.0) -> Variant:
    """Record-level DP at ``epsilon`` per site with the noise shared under HE: each round one DP-SGD step of
    every site's records (a Poisson sample at ``sample_rate``; all of them at 1), the server's Adam applying
    the average (the run's rate is the server's)."""
    if not 0 < sample_rate <= 1 or abs(1.0 / sample_rate - round(1.0 / sample_rate)) > 1e-9:
        raise SystemExit(f"--dp-sample-rate {sample_rate:g}: give one over a whole number of rounds (1, 0.5, 0.25)")
    server = {"kind": "adam", "tau": SHARED_TAU}  # its rate is the run's (federation_config)
    name = f"dp-shared-eps{epsilon:g}" if sample_rate == 1.0 else f"dp-shared-q{sample_rate:g}-eps{epsilon:g}"
    return Variant(name, server=server, epsilon=epsilon, shared_noise=True, sample_rate=sample_rate)


def parse_shared(name: str) -> Variant:
    """The :func:`shared_dp_variant` ``name`` stands for (``dp-shared-epsE`` or ``dp-shared-qQ-epsE``)."""
    rest = name.removeprefix("dp-shared-")
    rate = 1.0
    if rest.startswith("q"):
        rate_text, rest = rest[1:].split("-", 1)
        rate = float(rate_text)
    return shared_dp_variant(float(rest.removeprefix("eps")), rate)


VARIANTS = {
    "fedavg": Variant("fedavg"),
    "fedavg-lora": Variant("fedavg-lora", scheme="standard"),
    "server-adam": Variant("server-adam", server={"kind": "adam", "learning_rate": 0.01, "tau": 1e-3}),
}
"""The federated recipes by name (``--variants``)."""


@dataclass
class Outcome:
    """One run to convergence."""

    kind: str
    lr: float
    seed: int
    curve: list[float]
    """Validation accuracy after each epoch or round."""
    best: int
    """The epoch or round (1-based) whose model was kept."""
    test_accuracy: float | None
    """The kept model's test accuracy (None for a run that only chose a rate)."""
    seconds: float
    bytes_per_round: int = 0
    """Federated: bytes all sites released in a round (the adapters and head, every site)."""
    base_bytes_per_round: int = 0
    """Federated: bytes released beyond the adapters and head (the base's: 0)."""
    peak_rss: int = 0
    """The process's peak resident memory after the run (bytes; the simulation holds every site)."""
    epsilon_spent: float = 0.0
    """DP: the largest ε any site spent (central: what the pooled run spent)."""
    noise_multiplier: float = 0.0
    """DP: σ of the run (federated: the largest of the sites')."""
    least_noise_multiplier: float = 0.0
    """DP, federated: the smallest σ of a site (each calibrates to its own records)."""
    server_step: float = 1.0
    """Federated: how many times the averaged update is applied (``training.server_optimizer``'s rate)."""


def task_options(setting: Setting, scheme: str | None = None) -> dict[str, Any]:
    """The demo task's options at ``setting``: validation and test splits kept apart."""
    from fedshard.config.loader import load_federation

    options = dict(load_federation(DEMO).task.options)
    options.update(
        max_length=setting.max_length,
        rank=setting.rank,
        scheme=scheme or setting.scheme,
        max_examples=setting.examples,
        dirichlet_alpha=setting.dirichlet_alpha,
        validation_fraction=0.05,
        max_scored=None,
    )
    return options


@dataclass(frozen=True)
class Scored:
    """The encoded validation and test examples every run of a setting is scored on."""

    validation: Any
    test: Any


def scored_examples(setting: Setting) -> Scored:
    """The first ``setting.validation`` validation rows and ``setting.test`` test rows, encoded."""
    import numpy as np

    from fedshard.tasks.hf.task import SequenceClassification
    from fedshard.tasks.hf.training import encode

    task = SequenceClassification(**task_options(setting))
    _, validation, test = task.splits()
    if len(validation) < setting.validation or len(test) < setting.test:
        raise SystemExit(f"the table holds {len(validation)} validation and {len(test)} test rows: ask for fewer")

    def first(table: Any, n: int) -> Any:
        rows = table.take(np.arange(n))
        return encode(task.folder.tokenizer, rows.texts, rows.labels, setting.max_length)

    return Scored(first(validation, setting.validation), first(test, setting.test))


class _Best:
    """The patience rule's state: the best validation score so far and its tensors."""

    def __init__(self, patience: int) -> None:
        self.patience = patience
        self.curve: list[float] = []
        self.step = 0
        self.state: dict[str, Any] = {}

    def see(self, model: Any, accuracy: float) -> bool:
        """Record one evaluation; True once ``patience`` in a row have not beaten the best."""
        from fedshard.task import trained_state

        self.curve.append(accuracy)
        if self.step == 0 or accuracy > self.curve[self.step - 1]:
            self.step = len(self.curve)
            self.state = {name: t.detach().clone() for name, t in trained_state(model).items()}
        return len(self.curve) - self.step >= self.patience


def _peak_rss() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def central(
    setting: Setting, scored: Scored, lr: float, seed: int, *, test: bool, epsilon: float | None = None
) -> Outcome:
    """The central LoRA on the pooled training data, to convergence (see the module docstring);
    DP-SGD at ``epsilon`` over ``max_steps`` epochs when given."""
    import torch

    from fedshard.task import Partition
    from fedshard.tasks.hf.task import SequenceClassification
    from fedshard.tasks.hf.training import fit, score

    t0 = time.perf_counter()
    task = SequenceClassification(**task_options(setting))
    train = task.load_data(Partition(None, 6, seed)).train
    torch.manual_seed(seed)
    model = task.build_model()
    best = _Best(setting.patience)
    private = None if epsilon is None else _pooled_privacy(setting, len(train), epsilon)

    def after_epoch(_: int) -> bool:
        return best.see(model, score(model, scored.validation)[1])

    fit(
        model,
        train,
        setting.max_steps,
        setting.batch,
        lr,
        seed,
        make_private=None if private is None else private.make_private,
        after_epoch=after_epoch,
    )
    accuracy = None
    if test:
        model.load_state_dict(best.state, strict=False)
        accuracy = score(model, scored.test)[1]
    kind = "central" if epsilon is None else f"central-dp-eps{epsilon:g}"
    outcome = Outcome(kind, lr, seed, best.curve, best.step, accuracy, time.perf_counter() - t0, peak_rss=_peak_rss())
    if private is not None:
        outcome.epsilon_spent = _spent(private)
        outcome.noise_multiplier = private.noise_multiplier
    return outcome


def _round_event(num_examples: int, batch: int, sigma: float) -> Any:
    """One epoch of DP-SGD over ``num_examples`` as a site's ledger accounts it."""
    from fedshard.privacy.mechanisms.dpsgd import planned_record_event

    return planned_record_event(num_examples, batch, 1, sigma)


@functools.cache
def horizon_sigma(sizes: tuple[int, ...], batch: int, epochs: int, epsilon: float) -> float:
    """The smallest σ with which every party of ``sizes`` records spends at most ``epsilon`` in ``epochs``
    (cached)."""
    from fedshard.privacy.accountant import calibrate_noise

    sigmas = []
    for n in sizes:
        one = _round_event(n, batch, 1.0)
        sigmas.append(calibrate_noise(epsilon, DELTA, one.sample_rate, one.steps * epochs))
    return max(sigmas)


def _pooled_privacy(setting: Setting, num_examples: int, epsilon: float) -> Any:
    from fedshard.privacy.mechanisms.dpsgd import RecordPrivacy

    sigma = horizon_sigma((num_examples,), setting.batch, setting.max_steps, epsilon)
    return RecordPrivacy(_round_event(num_examples, setting.batch, sigma), CLIP)


def _spent(private: Any) -> float:
    """ε the pooled DP-SGD run spent (its Opacus steps, accounted as fedshard's ledger accounts)."""
    from fedshard.privacy.accountant import epsilon as account

    event = private.spent()
    return 0.0 if event is None else float(account([event], DELTA))


def federation_config(setting: Setting, variant: Variant, lr: float, seed: int, rounds: int) -> Any:
    """configs/demo-hf.yaml with every site in the EU, ``variant``, Adam rate ``lr``, ``seed``, ``rounds``."""
    from fedshard.config import FederationConfig
    from fedshard.config.loader import load_federation

    data = load_federation(DEMO).model_dump(mode="json")
    for site in data["sites"]:
        site["jurisdiction"] = "EU"
    data["federation"].update(seed=seed, rounds=rounds, round_timeout_s=3600.0)
    data["task"]["options"] = task_options(setting, variant.scheme) | {
        "score_on": "validation",
        "max_scored": len(data["sites"]),  # one row per site: the bench scores the model itself
    }
    data["training"].update(local_epochs=1, batch_size=setting.batch, learning_rate=lr)
    if variant.server:
        data["training"]["server_optimizer"] = dict(variant.server)
    if variant.epsilon is not None:  # σ left empty: each site calibrates its own for the horizon
        horizon = setting.max_steps * variant.rounds_per_epoch
        data["privacy"] = {
            "record_level": {"enabled": True, "max_grad_norm": CLIP, "calibration_rounds": horizon},
            "budget": {"epsilon": variant.epsilon, "delta": DELTA},
        }
        if variant.sample_rate < 1.0:
            data["privacy"]["record_level"]["sample_rate"] = variant.sample_rate
    if variant.shared_noise:  # one full-batch SGD step at rate 1 a round; lr is the server Adam's
        sites = len(data["sites"])
        data["training"].update(batch_size="all", learning_rate=1.0)
        data["training"]["server_optimizer"] = dict(variant.server, learning_rate=lr)
        data["privacy"]["record_level"]["distributed_over"] = sites
        data["federation"]["min_sites"] = sites  # a round of fewer sites would carry less noise
        data["residency"] = {"encrypt": "all"}
        data["he"] = {"value_range": SHARED_VALUE_RANGE}
    return FederationConfig.model_validate(data)


@functools.cache
def site_sizes(setting: Setting, seed: int) -> tuple[int, ...]:
    """Every site's training records at ``seed`` (the Dirichlet cut of the pool; cached: a DP federation
    asks once per round, and the table takes a second to read)."""
    from fedshard.tasks.hf.task import SequenceClassification
    from fedshard.tasks.partition import dirichlet_partition

    pool, _, _ = SequenceClassification(**task_options(setting)).splits()
    return tuple(len(part) for part in dirichlet_partition(pool.labels, 6, setting.dirichlet_alpha, seed))


def adapter_bytes(config: Any) -> int:
    """Bytes of one site's released tensors (adapters and head) for ``config``'s task."""
    from fedshard.task import build_initial_model, load_task, trained_state

    task = load_task(config.task.target, dict(config.task.options))
    model = build_initial_model(task, config.federation.seed, config.privacy.layer_policy)
    return sum(t.numel() * t.element_size() for t in trained_state(model).values())


@contextlib.contextmanager
def _scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="fedshard-bench-hf-") as out:
        yield Path(out) / "run"


def federated(
    setting: Setting, scored: Scored, variant: Variant, lr: float, seed: int, *, test: bool, log: Callable[[str], None]
) -> Outcome:
    """The federation of ``variant`` to convergence, one resumed round at a time (see the module docstring)."""
    from fedshard.assembly.sites import STORE_KEYS_DIR, site_model
    from fedshard.simulate.run import simulate
    from fedshard.tasks.hf.training import score

    t0 = time.perf_counter()
    best = _Best(setting.patience)
    released = adapter_bytes(federation_config(setting, variant, lr, seed, 1))
    sent: list[int] = []
    model: Any = None
    with _scratch() as out, no_central():
        for rounds in range(
            variant.rounds_per_epoch, setting.max_steps * variant.rounds_per_epoch + 1, variant.rounds_per_epoch
        ):
            config = federation_config(setting, variant, lr, seed, rounds)
            summary = simulate(config, out, resume=rounds > variant.rounds_per_epoch)
            if summary["rounds"] != rounds or summary["stopped_reason"]:
                raise SystemExit(f"{variant.name} seed {seed}: stopped at round {rounds}: {summary['stopped_reason']}")
            sent.append(int(summary["history"][-1]["bytes_up"]))
            sites = [s["id"] for s in summary["sites"]]
            models = [
                site_model(config, out / "sites" / site, out / STORE_KEYS_DIR / f"{site}.kek")[0]
                for site in (sites[:2] if rounds == variant.rounds_per_epoch else sites[:1])
            ]
            if len(models) == 2:
                _check_one_model(models)
            model = models[0]
            accuracy = score(model, scored.validation)[1]
            log(f"  {variant.name} lr {lr:g} seed {seed} round {rounds}: validation {accuracy:.4f}")
            if best.see(model, accuracy):
                break
    result = None
    if test:
        model.load_state_dict(best.state, strict=False)
        result = score(model, scored.test)[1]
    per_round = max(sent)
    spent = max((float(site.get("epsilon_spent") or 0.0) for site in summary["sites"]), default=0.0)
    if variant.epsilon is not None and spent > variant.epsilon:
        raise SystemExit(f"{variant.name} seed {seed}: a site spent ε {spent:.4f} over its budget {variant.epsilon:g}")
    return Outcome(
        variant.name,
        lr,
        seed,
        best.curve,
        best.step,
        result,
        time.perf_counter() - t0,
        bytes_per_round=per_round,
        base_bytes_per_round=per_round - len(sites) * released,
        peak_rss=_peak_rss(),
        epsilon_spent=spent,
        server_step=variant.server_step,
        **_site_sigmas(setting, variant, seed),
    )


def _site_sigmas(setting: Setting, variant: Variant, seed: int) -> dict[str, float]:
    """The largest and smallest σ the sites calibrated (as their ledgers do: each its own records over
    ``max_steps`` rounds); none without DP."""
    from fedshard.config import FULL_BATCH

    if variant.epsilon is None:
        return {}
    if variant.sample_rate < 1.0:  # one step a round at one rate: the same σ at every site
        from fedshard.privacy.accountant import calibrate_noise

        steps = setting.max_steps * variant.rounds_per_epoch
        sigma = calibrate_noise(variant.epsilon, DELTA, variant.sample_rate, steps)
        return {"noise_multiplier": sigma, "least_noise_multiplier": sigma}
    batch = FULL_BATCH if variant.shared_noise else setting.batch
    sigmas = [horizon_sigma((n,), batch, setting.max_steps, variant.epsilon) for n in site_sizes(setting, seed)]
    return {"noise_multiplier": max(sigmas), "least_noise_multiplier": min(sigmas)}


def _check_one_model(models: list[Any]) -> None:
    """Every site of a pooled federation holds the same model (else scoring one would not be the federation's)."""
    import torch

    from fedshard.task import trained_state

    first, second = (trained_state(m) for m in models)
    if first.keys() != second.keys() or not all(torch.equal(first[k], second[k]) for k in first):
        raise SystemExit("two sites of the pooled federation hold different models: the bench cannot score one")
