"""Flower's deployment engine, driven from fedshard: command lines for the SuperLink and
SuperNodes, the ``flwr`` CLI's connection file, and the few ``flwr`` calls we need
(register a SuperNode's key, list SuperNodes, submit, inspect and stop a run).

Flower 1.42 serves the Fleet, Control and Runtime APIs of a SuperLink on one port.
Every ``flwr`` call runs the CLI as a subprocess against ``$FLWR_HOME/config.toml``
(the connection named :data:`CONNECTION`), with ``--format json``, except the two the
aggregator polls (SuperNodes, run status): those go through one in-process Control API
client where the installed Flower allows
(:mod:`fedshard.transports.flower.compat.control`).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from fedshard.errors import DeployError
from fedshard.transports.flower.compat.control import ControlClient, open_control

__all__ = [
    "CONNECTION",
    "FlowerCli",
    "console_script",
    "NodeStatus",
    "flower_env",
    "superlink_command",
    "supernode_command",
    "write_connection",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

CONNECTION = "fedshard"
"""Name of the SuperLink connection fedshard writes into ``$FLWR_HOME/config.toml``."""


SUPEREXEC_POLL = "FLWR_SUPEREXEC_TASK_POLL_INTERVAL"
"""How often Flower's SuperExec asks for a task to launch (a supported setting; 0.01–60 s)."""


def console_script(name: str) -> str:
    """A console script installed beside the running Python (the virtualenv's ``bin``)."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


def flower_env(flwr_home: Path | None = None, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for Flower processes: offline (no telemetry, no update check), the SuperExec
    polling every 0.1 s (unless set), our
    virtualenv's ``bin`` first on ``PATH`` (the SuperLink starts ``flower-superexec``
    from there), and ``FLWR_HOME`` when given."""
    env = dict(os.environ if base is None else base)
    env["FLWR_TELEMETRY_ENABLED"] = "0"
    env["FLWR_DISABLE_UPDATE_CHECK"] = "1"
    env.setdefault(SUPEREXEC_POLL, "0.1")  # Flower's default, 1 s, delays every run's start by up to 1 s
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    if flwr_home is not None:
        env["FLWR_HOME"] = str(flwr_home)
    return env


def write_connection(flwr_home: Path, address: str, root_certificates: Path | None) -> Path:
    """Write ``$FLWR_HOME/config.toml`` with one connection, :data:`CONNECTION`, as the default.

    ``root_certificates`` None means plain text (``insecure = true``).
    """
    flwr_home.mkdir(parents=True, exist_ok=True)
    lines = [
        "[superlink]",
        f'default = "{CONNECTION}"',
        "",
        f"[superlink.{CONNECTION}]",
        f'address = "{address}"',
    ]
    if root_certificates is None:
        lines.append("insecure = true")
    else:
        lines.append(f'root-certificates = "{root_certificates}"')
    path = flwr_home / "config.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def superlink_command(
    *,
    listen: str,
    port: int,
    database: Path,
    log_file: Path | None = None,
    tls: tuple[Path, Path, Path] | None,
) -> list[str]:
    """``flower-superlink`` with SuperNode authentication and TLS (``tls`` = cert, key, CA), or
    ``--insecure`` when ``tls`` is None; never installs app dependencies at run time."""
    cmd = [
        console_script("flower-superlink"),
        "--host",
        listen,
        "--port",
        str(port),
        "--database",
        str(database),
        "--disable-runtime-dependency-installation",
    ]
    if log_file is not None:
        cmd += ["--log-file", str(log_file)]
    if tls is None:
        return [*cmd, "--insecure"]
    cert, key, ca = tls
    return [
        *cmd,
        "--ssl-certfile",
        str(cert),
        "--ssl-keyfile",
        str(key),
        "--ssl-ca-certfile",
        str(ca),
        "--enable-supernode-auth",
    ]


def supernode_command(
    *,
    superlink: str,
    port: int,
    node_config: Mapping[str, str],
    root_certificates: Path | None,
    auth_key: Path | None,
) -> list[str]:
    """``flower-supernode`` for one site: TLS root and authentication key, or ``--insecure``."""
    pairs = " ".join(f"{k}={json.dumps(str(v))}" for k, v in node_config.items())
    cmd = [console_script("flower-supernode"), "--superlink", superlink, "--port", str(port), "--node-config", pairs]
    if root_certificates is None:
        return [*cmd, "--insecure"]
    cmd += ["--root-certificates", str(root_certificates)]
    if auth_key is not None:
        cmd += ["--auth-supernode-private-key", str(auth_key)]
    return cmd


@dataclass(frozen=True)
class NodeStatus:
    """A SuperNode as the SuperLink knows it."""

    node_id: str
    status: str  # "registered", "online", "offline", "unregistered"

    @property
    def online(self) -> bool:
        """Whether it is connected now."""
        return self.status == "online"


class FlowerCli:
    """The ``flwr`` CLI against one SuperLink, through ``$FLWR_HOME/config.toml``.

    Parameters
    ----------
    flwr_home:
        Folder holding ``config.toml`` (:func:`write_connection`) and installed apps.
    timeout:
        Seconds one ``flwr`` call may take.
    """

    def __init__(self, flwr_home: Path, timeout: float = 60.0) -> None:
        self.flwr_home = flwr_home
        self.timeout = timeout
        self.env = flower_env(flwr_home)
        self._control: ControlClient | None = None
        self._control_tried = False

    def _in_process(self) -> ControlClient | None:
        """The in-process Control API client for the two polled queries (opened on first use,
        once the connection file exists); None where Flower's internals differ (the CLI then)."""
        if not self._control_tried:
            self._control_tried = True
            self._control = open_control(self.flwr_home, CONNECTION)
        return self._control

    def _ask(self, query: Callable[[ControlClient], T], fallback: Callable[[], T]) -> T:
        """``query`` on the in-process client; ``fallback`` (the CLI, which names any error in
        one line) where there is none or it failed (it is then dropped for this host's life)."""
        control = self._in_process()
        if control is not None:
            try:
                return query(control)
            except Exception as exc:
                log.info("in-process SuperLink query failed (%s); asking through the flwr CLI", exc)
                control.close()
                self._control = None
        return fallback()

    def close(self) -> None:
        """Close the in-process client, if one was opened."""
        if self._control is not None:
            self._control.close()
            self._control = None

    def call(self, args: Sequence[str]) -> dict[str, Any]:
        """Run ``flwr ARGS --format json``; the parsed reply, or :class:`DeployError` with Flower's message."""
        cmd = [console_script("flwr"), *args, "--format", "json"]
        try:
            done = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=self.timeout, check=False)
        except subprocess.TimeoutExpired:
            raise DeployError(f"`flwr {' '.join(args)}` did not answer within {self.timeout:.0f}s") from None
        reply = _last_json(done.stdout)
        if reply is None or not reply.get("success", False):
            output = (done.stderr or done.stdout).strip().splitlines()
            message = str((reply or {}).get("error-message") or (output[-1] if output else "no output"))
            raise DeployError(f"`flwr {' '.join(args[:2])}` failed: {message.strip()}")
        return reply

    def register(self, public_key: Path) -> str | None:
        """Register a SuperNode's public key; its node id, or None when it was registered before."""
        try:
            return str(self.call(["supernode", "register", str(public_key), CONNECTION])["node-id"])
        except DeployError as exc:
            if "already in use" in str(exc):
                return None
            raise

    def nodes(self) -> list[NodeStatus]:
        """Every SuperNode the SuperLink knows."""

        def cli() -> list[NodeStatus]:
            reply = self.call(["supernode", "list", CONNECTION])
            return [NodeStatus(str(n["node-id"]), str(n.get("status", ""))) for n in reply.get("nodes", [])]

        return self._ask(lambda c: [NodeStatus(i, status) for i, status in c.node_statuses()], cli)

    def submit(self, app_dir: Path, run_config: Path) -> str:
        """Submit the app in ``app_dir`` as a new run with the overrides in ``run_config`` (TOML); its run id."""
        return str(self.call(["run", str(app_dir), CONNECTION, "--run-config", str(run_config)])["run-id"])

    def run_status(self, run_id: str) -> str:
        """The run's status as Flower reports it (e.g. ``running``, ``finished:completed``)."""

        def cli() -> str:
            reply = self.call(["list", CONNECTION, "--run-id", run_id])
            runs = reply.get("runs", [])
            return str(runs[0].get("status", "")) if runs else ""

        return self._ask(lambda c: c.run_status(run_id), cli)

    def stop(self, run_id: str) -> None:
        """Ask the SuperLink to stop a run."""
        self.call(["stop", run_id, CONNECTION])


def _last_json(text: str) -> dict[str, Any] | None:
    """The JSON object a ``flwr … --format json`` call printed (after any log lines)."""
    start = text.find("{")
    while start != -1:
        try:
            value = json.loads(text[start:])
        except json.JSONDecodeError:
            start = text.find("{", start + 1)
            continue
        return value if isinstance(value, dict) else None
    return None
