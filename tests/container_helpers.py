"""Docker for the container tests (``make test-containers``): the daemon, the local base image,
the package mirror a build installs from, and the image itself.

No image registry is reachable on the machines CI runs on, so the base is made from Debian's
packages (``deploy/test/container-base.sh``, ~2 min the first time), and pip inside a build
installs from this machine's package mirror (the ``file://`` indexes and find-links of its pip
config, served over HTTP to the build) when it has one, else from the public index.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASE_IMAGE = "local/bookworm-py:base"
IMAGE = "fedshard:test"
WORK = Path(os.environ.get("FEDSHARD_CONTAINER_WORK", "/tmp/fedshard-containers"))


def run(*cmd: str, timeout: float = 600, check: bool = True, **kwargs: object) -> subprocess.CompletedProcess[str]:
    """Run ``cmd``, its output captured as text; a failure raises with the output in the message."""
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)  # type: ignore[call-overload]
    if check and result.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} exited {result.returncode}:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
        )
    return result  # type: ignore[no-any-return]


def tools_missing() -> str | None:
    """Why containers cannot run here (None: docker, dockerd and docker-compose are installed)."""
    missing = [tool for tool in ("docker", "docker-compose") if shutil.which(tool) is None]
    if missing:
        return f"not installed: {', '.join(missing)} (Debian: apt-get install docker.io docker-compose debootstrap)"
    return None


@contextlib.contextmanager
def docker_daemon() -> Iterator[None]:
    """A running Docker daemon: the one that answers, or one started here and stopped after."""
    if run("docker", "info", check=False, timeout=30).returncode == 0:
        yield
        return
    WORK.mkdir(parents=True, exist_ok=True)
    log = (WORK / "dockerd.log").open("w")
    daemon = subprocess.Popen(["dockerd"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while run("docker", "info", check=False, timeout=30).returncode != 0:
            if daemon.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"dockerd did not start: {(WORK / 'dockerd.log').read_text()[-2000:]}")
            time.sleep(0.5)
        yield
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
        log.close()


def base_image() -> str:
    """The local Debian base with Python 3.11 and this machine's CA bundle (made once)."""
    if run("docker", "image", "inspect", BASE_IMAGE, check=False).returncode != 0:
        run("sh", str(ROOT / "deploy" / "test" / "container-base.sh"), timeout=900, env={**os.environ, "W": str(WORK)})
    return BASE_IMAGE


def _pip_config() -> dict[str, str]:
    out = run("python3", "-m", "pip", "config", "list", check=False).stdout
    values = {}
    for line in out.splitlines():
        key, _, value = line.partition("=")
        values[key.split(".", 1)[-1].strip()] = value.strip().strip("'")
    return values


@contextlib.contextmanager
def package_mirror() -> Iterator[list[str]]:
    """``docker build`` arguments that install from this machine's package mirror, served over HTTP
    on the host's loopback (the build runs on the host's network); none when pip has no local mirror."""
    config = _pip_config()
    local = [u.removeprefix("file://") for u in config.get("extra-index-url", "").split() if u.startswith("file://")]
    wheels = [p for p in config.get("find-links", "").split() if p.startswith("/")]
    if not local and not wheels:
        yield []
        return
    root = Path("/")
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        indexes = [f"{url}{p.rstrip('/')}/" for p in local]
        links = " ".join(f"--find-links {url}{p.rstrip('/')}/" for p in wheels)
        args = ["--network", "host", "--build-arg", "PIP_TRUSTED_HOST=127.0.0.1"]
        args += ["--build-arg", f"PIP_INDEX_URL={indexes[0] if indexes else 'https://pypi.org/simple/'}"]
        args += ["--build-arg", f"PIP_EXTRA_INDEX_URL={' '.join([*indexes[1:], 'https://pypi.org/simple/'])}"]
        if links:  # torch's CPU build lies among the find-links: asked for by its local version, never CUDA's
            args += ["--build-arg", f"TORCH_PIP={links}", "--build-arg", "TORCH=torch==2.13.0+cpu"]
        yield args
    finally:
        server.shutdown()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def build_image() -> str:
    """The fedshard image from this checkout, on the local base."""
    with package_mirror() as mirror:
        run("docker", "build", "-t", IMAGE, "--build-arg", f"BASE={base_image()}", *mirror, str(ROOT), timeout=1200)
    return IMAGE
