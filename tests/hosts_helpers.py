"""A federation spread over namespaced hosts (:mod:`tests.netns`): the README's "On separate
hosts" blocks, or any shell text, run on the host they name, from one folder every host sees
(as if each had its copy of ``deploy/hosts/`` and its keys), with this checkout's ``.venv``
on ``PATH``. Used by ``make test-hosts`` (``tests/hosts/``) and ``bench/wan.py``."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from tests.netns import Hosts
from tests.readme_walk import blocks

ROOT = Path(__file__).resolve().parents[1]
HOSTS_CONFIGS = ROOT / "deploy" / "hosts"
ZONE_HOSTS = {"eu-central": "zone-eu-central", "us-east": "zone-us-east", "sg-central": "zone-sg-central"}
SITES = ("charite-berlin", "ap-hp-paris", "mayo-rochester", "sgh-singapore")
CLOUD, HOSPITAL = "1gbit", "100mbit"


def readme_steps() -> dict[int, str]:
    """The README's "On separate hosts" blocks by their number: 1 keys, 2 a zone (``ZONE``),
    3 the aggregator, 4 a site (``SITE_ID``), 5 the aggregator's status."""
    return {b.index: b.text for b in blocks() if b.heading == "On separate hosts"}


def links(cloud: str | None = CLOUD, hospital: str | None = HOSPITAL) -> dict[str, str | None]:
    """Every host of ``deploy/hosts/`` → its link's rate: the aggregator and the zones on
    ``cloud``, each hospital on ``hospital`` (None: unshaped)."""
    return {"aggregator": cloud, **dict.fromkeys(ZONE_HOSTS.values(), cloud), **dict.fromkeys(SITES, hospital)}


def copy_configs(folder: Path, edit: Callable[[dict[str, Any]], None] | None = None) -> Path:
    """``deploy/hosts/`` copied to ``folder/deploy/hosts`` (``edit`` may change the federation
    config, as plain data; a site it drops loses its file, a site's own cap follows a private
    budget's absence), and ``folder/.venv`` linked to this checkout's. Returns ``folder``."""
    target = folder / "deploy" / "hosts"
    shutil.copytree(HOSTS_CONFIGS, target)
    (folder / ".venv").symlink_to(ROOT / ".venv")
    if edit is not None:
        data = yaml.safe_load((target / "federation.yaml").read_text())
        edit(data)
        (target / "federation.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
        kept = {s["id"] for s in data["sites"]}
        for file in (target / "sites").glob("*.yaml"):
            if file.stem not in kept:
                file.unlink()
            elif not data.get("privacy"):
                site = yaml.safe_load(file.read_text())
                site["site"].pop("cap", None)  # no DP mechanism: no cap either
                file.write_text(yaml.safe_dump(site, sort_keys=False))
    return folder


class Hosted:
    """Processes on ``hosts`` run from ``folder``; logs under ``folder/logs``. :meth:`stop`
    ends every process started (SIGTERM to its group, SIGKILL after ``grace``)."""

    def __init__(self, hosts: Hosts, folder: Path) -> None:
        self.hosts = hosts
        self.folder = folder
        self.logs = folder / "logs"
        self.logs.mkdir(exist_ok=True)
        self.started: dict[str, subprocess.Popen[bytes]] = {}

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment of every command: this checkout's ``.venv`` first on ``PATH``, Flower offline."""
        env = dict(os.environ, FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1", GRPC_VERBOSITY="ERROR")
        env["PATH"] = f"{self.folder / '.venv' / 'bin'}:{env['PATH']}"
        env.update(extra or {})
        return env

    def _argv(self, text: str, host: str | None) -> list[str]:
        argv = ["bash", "-e", "-c", text]
        return argv if host is None else self.hosts[host].command(argv)

    def run(
        self, text: str, host: str | None = None, env: Mapping[str, str] | None = None, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        """Run ``text`` with bash on ``host`` (None: the machine itself) and wait for it."""
        return subprocess.run(
            self._argv(text, host), cwd=self.folder, env=self.env(env), capture_output=True, text=True, timeout=timeout
        )

    def start(self, name: str, text: str, host: str, env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
        """Start ``text`` on ``host`` in the background, its output in ``logs/<name>.log``."""
        with (self.logs / f"{name}.log").open("ab") as log:
            proc = subprocess.Popen(
                self._argv(text, host),
                cwd=self.folder,
                env=self.env(env),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.started[name] = proc
        return proc

    def log(self, name: str) -> str:
        """What process ``name`` printed so far."""
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def wait_for(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        """Wait until ``predicate`` holds; fail with every log's tail if it does not in ``timeout`` or
        a process started here exits with an error first."""
        deadline = time.monotonic() + timeout
        while not predicate():
            failed = [n for n, p in self.started.items() if p.poll() not in (None, 0)]
            if failed or time.monotonic() > deadline:
                raise AssertionError(
                    f"waiting for {what}: {'exited: ' + ', '.join(failed) if failed else 'timed out'}\n{self.tails()}"
                )
            time.sleep(0.5)

    def tails(self, lines: int = 15) -> str:
        """The last ``lines`` of every log."""
        return "\n".join(f"--- {n}\n" + "\n".join(self.log(n).splitlines()[-lines:]) for n in self.started)

    def summary(self) -> dict[str, Any]:
        """The newest run's ``summary.json`` on the aggregator's host."""
        runs = sorted((self.folder / "runs" / "aggregator").glob("run-*/summary.json"))
        assert runs, f"no summary under {self.folder / 'runs' / 'aggregator'}\n{self.tails()}"
        return json.loads(runs[-1].read_text())  # type: ignore[no-any-return]

    def stop(self, grace: float = 20.0) -> None:
        """End every process started here."""
        for proc in self.started.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self.started.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def start_zones(hosted: Hosted, zones: Mapping[str, str]) -> None:
    """Step 2 on each zone's host (``zones``: zone → host); waits until every one listens."""
    for zone, host in zones.items():
        hosted.start(host, readme_steps()[2], host, {"ZONE": zone})
    hosted.wait_for(lambda: all("listening on" in hosted.log(h) for h in zones.values()), 120, "the zones")


def start_sites(hosted: Hosted, sites: tuple[str, ...]) -> None:
    """Step 4 on each site's host."""
    for site in sites:
        hosted.start(site, readme_steps()[4], site, {"SITE_ID": site})


def make_keys(hosted: Hosted) -> None:
    """Step 1 on the machine itself."""
    made = hosted.run(readme_steps()[1])
    assert made.returncode == 0, made.stderr
