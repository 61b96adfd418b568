"""What ``fedshard aggregator up`` (and ``reconfigure``) refuse before anything starts: an
unsafe or incomplete deployment config, a HE secret context on the aggregator host, a
run to resume that is not there, a port it must listen on that another process holds.
Each refusal is one line saying how to fix it."""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterable
from pathlib import Path

from fedshard.assembly.parts import check_parts
from fedshard.config import AggregatorDeployment, FederationConfig
from fedshard.config.layout import AggregatorKeys, KeysLayout
from fedshard.errors import ConfigError, DeployError

__all__ = [
    "LATEST_RUN",
    "check_aggregator_config",
    "check_ports_free",
    "check_public_context",
    "check_same_parties",
    "he_folder",
    "run_to_resume",
]

LATEST_RUN = Path("latest")
"""``AggregatorHost(resume=LATEST_RUN)``: resume the newest run folder under ``deployment.state_dir``."""


def check_aggregator_config(config: FederationConfig, *, insecure: bool) -> AggregatorDeployment:
    """Refuse, with one line each, a config the aggregator must not run with.

    TLS off without ``--insecure``; a zone endpoint with port 0 (sites must know where
    to dial); hosted zones that do not exist; a server optimiser, an accountant or a DP
    mechanism none is registered for; a HE secret context on the aggregator host; keys
    ``fedshard keys init`` did not write.
    """
    check_parts(config)
    dep = config.deployment
    if dep is None:
        raise ConfigError(
            "the config has no `deployment` section (keys, state_dir, superlink); see configs/aggregator.yaml"
        )
    if not dep.tls and not insecure:
        raise ConfigError(
            "deployment.tls is false: pass --insecure to run without TLS and SuperNode authentication "
            "(test networks only)"
        )
    names = [z.name for z in config.zones]
    for name in dep.zones or []:
        if name not in names:
            raise ConfigError(f"deployment.zones names {name!r}, which is not one of the zones ({', '.join(names)})")
    for zone in config.zones:
        if zone.endpoint.endswith(":0"):
            raise ConfigError(f"zone {zone.name}: endpoint {zone.endpoint} has port 0; give the port sites should dial")
    keys = KeysLayout(dep.keys).aggregator
    if config.residency.encrypting:
        check_public_context(he_folder(config, keys))
    if dep.tls and not insecure:
        hosted = dep.zones or names
        needed = [keys.ca, keys.superlink.cert, keys.superlink.key, keys.coordinator.cert, keys.coordinator.key]
        needed += [keys.site_keys]
        needed += [p for z in hosted for p in (keys.zone(z).cert, keys.zone(z).key)]
        needed += [keys.supernode_key(s.id) for s in config.sites]
        missing = [p for p in needed if not p.exists()]
        if missing:
            raise ConfigError(
                f"{missing[0]} is missing ({len(missing)} key file(s) in all): run "
                f"`fedshard keys init --config <this config> --out {dep.keys}` first (with --add for zones and "
                "sites added to a federation that has keys)"
            )
    return dep


def run_to_resume(state_dir: Path, resume: Path) -> Path:
    """The run folder to resume: ``resume`` itself, or the newest ``run-*`` under ``state_dir``
    that logged events (``resume`` is :data:`LATEST_RUN`).

    Raises
    ------
    ConfigError
        No such run folder, or it holds no ``events.jsonl`` (nothing to resume), or one that
        cannot be resumed (:func:`~fedshard.coordinator.recovery.recover`: checked here, before
        anything starts).
    """
    folder = _run_folder(state_dir, resume)
    from fedshard.coordinator.recovery import recover
    from fedshard.errors import RoundError

    try:
        recover(folder / "events.jsonl")
    except RoundError as exc:
        raise ConfigError(str(exc)) from None
    return folder


def _run_folder(state_dir: Path, resume: Path) -> Path:
    if resume == LATEST_RUN:
        from fedshard.coordinator.events import EventKind, EventLog

        logs = sorted(state_dir.glob("run-*/events.jsonl"), key=lambda p: p.stat().st_mtime, reverse=True)
        for log in logs:  # the newest that assembled its sites (not one refused at the start)
            if any(e["event"] == EventKind.START for e in EventLog(log).read()[0]):
                return log.parent.resolve()
        raise ConfigError(
            f"no run to resume under {state_dir} (no run-*/events.jsonl of a run that started); "
            "start one with `fedshard aggregator up`"
        )
    if not (resume / "events.jsonl").is_file():
        raise ConfigError(f"{resume} holds no run to resume (no events.jsonl); give a run folder of {state_dir}")
    return resume.resolve()


def he_folder(config: FederationConfig, keys: AggregatorKeys) -> Path:
    """Where the zones' public HE context is: ``he.keys`` when set, else the aggregator's keys."""
    return config.he.keys if config.he.keys is not None else keys.he


def check_public_context(folder: Path) -> None:
    """Refuse a folder of HE contexts that holds the secret one, or lacks the public one."""
    from fedshard.crypto.he import PUBLIC_CONTEXT_FILE, SECRET_CONTEXT_FILE

    if (folder / SECRET_CONTEXT_FILE).exists():
        raise ConfigError(
            f"{folder / SECRET_CONTEXT_FILE}: the aggregator host must not hold the HE secret context "
            "(zones would be able to decrypt); keep only public.ctx there and give secret.ctx to the sites"
        )
    if not (folder / PUBLIC_CONTEXT_FILE).exists():
        raise ConfigError(f"{folder / PUBLIC_CONTEXT_FILE} is missing: run `fedshard keys init` (or set he.keys)")


def check_same_parties(config_path: Path, config: FederationConfig, run_dir: Path) -> None:
    """Refuse to resume a run that grew (``aggregator reconfigure``) with a config that lacks
    its new zones or sites (they would be refused as strangers); ``config_path`` is the
    config the run last ran with (none yet: nothing to compare)."""
    from fedshard.config import load_federation
    from fedshard.config.changes import membership_digest

    if not config_path.exists():
        return
    ran = load_federation(config_path)
    if membership_digest(ran) != membership_digest(config):
        zones = sorted({z.name for z in ran.zones} ^ {z.name for z in config.zones})
        sites = sorted({s.id for s in ran.sites} ^ {s.id for s in config.sites})
        differ = ", ".join([*(f"zone {z}" for z in zones), *(f"site {s}" for s in sites)]) or "zones or sites"
        raise ConfigError(
            f"{run_dir} ran with other parties than --config lists ({differ}); resume it with the config "
            f"it grew to (its federation.yaml lists them)"
        )


AGGREGATOR_PORT_HINT = (
    "another aggregator, or another program, listens there (`fedshard aggregator status` shows an aggregator; "
    "`ss -ltnp` shows any program)"
)


def check_ports_free(listeners: Iterable[tuple[str, str]], hint: str = AGGREGATOR_PORT_HINT) -> None:
    """Refuse, before any child starts, a port this host must listen on that is taken.

    ``listeners`` are (what, ``host:port``) pairs. A child started on a taken port would die
    at once. Worse, the wait for its port would reach the other process and carry on as if
    the child had started. Only "address in use" is refused here; any other bind error is
    left to the child, which reports it.

    Raises
    ------
    DeployError
        One line: the port, what needs it, and ``hint``: what usually holds it.
    """
    for what, address in listeners:
        host, port = address.rsplit(":", 1)
        host = host.strip("[]")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a closed socket's TIME_WAIT is free
            try:
                probe.bind((host, int(port)))
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    continue
                raise DeployError(f"port {port} on {host} ({what}) is in use: {hint}") from None
