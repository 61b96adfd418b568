"""Carrying a run on from its folder: the config it ran with, what it recorded, more rounds.

``fedshard simulate --resume`` and ``fedshard aggregator up --resume`` both read a run's
folder through here: the run's ``federation.yaml`` and its event log
(:func:`fedshard.coordinator.recovery.recover`)."""

from __future__ import annotations

from pathlib import Path

from fedshard.config import FederationConfig
from fedshard.coordinator.recovery import RunRecovery, recover
from fedshard.errors import ConfigError

__all__ = ["resumable_config", "resumable_run", "with_rounds"]


def with_rounds(config: FederationConfig, rounds: int | None) -> FederationConfig:
    """``config`` with ``federation.rounds`` replaced (when ``rounds`` is given)."""
    if rounds is None:
        return config
    data = config.model_dump(mode="json")
    data["federation"]["rounds"] = rounds
    return FederationConfig.model_validate(data)


def resumable_config(out: str | Path) -> FederationConfig:
    """The config a run in folder ``out`` ran with (its ``federation.yaml``), to resume it.

    Raises
    ------
    ConfigError
        ``out`` holds no run (no ``federation.yaml`` or no ``events.jsonl``).
    """
    from fedshard.config import load_federation

    out = Path(out)
    if not (out / "federation.yaml").is_file() or not (out / "events.jsonl").is_file():
        raise ConfigError(
            f"{out} holds no run to resume (no federation.yaml or events.jsonl); give the folder of an earlier "
            "`fedshard simulate` run"
        )
    return load_federation(out / "federation.yaml")


def resumable_run(config: FederationConfig, out: Path) -> RunRecovery:
    """What the run in ``out`` recorded, checked for a resume with ``config``.

    Raises
    ------
    FedshardError
        One line, nothing changed: a log it cannot resume; a config that changes what the run
        keeps fixed (what ``reconfigure`` would refuse); a finished run that ``config`` gives
        no more rounds (with the command that trains on).
    """
    recovery = recover(out / "events.jsonl")
    recovery.check_config(config, str(out / "federation.yaml"))
    more = recovery.last_round + config.federation.rounds
    recovery.check_more_to_do(config.federation.rounds, f"`fedshard simulate --resume {out} --rounds {more}`")
    return recovery
