"""The README's command blocks as a new user pastes them, after ``make demo``, in a fresh
folder: its ``configs/`` and ``.venv`` are this checkout's, everything a block writes
(``runs/``, ``keys/``) is the walk's own.

Every ```` ```bash ```` block of the README is in :data:`PLAN`: the suite runs the quick
ones (``make test``); ``make test-readme`` runs every block, in the README's order, and
prints each block's wall time (the issue's fresh-clone walk-through). A block added to
the README without a line here fails the suite, so the README cannot drift from what runs.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAKEFILE = ROOT / "Makefile"
VENV = ROOT / ".venv"

SLOW_ENV = "FEDSHARD_README_SLOW"
"""Set (``make test-readme``): the walk runs every block, the slow ones too."""


class How(StrEnum):
    """How the suite treats a README block."""

    SUITE = "suite"  # run as pasted by `make test`
    SLOW = "slow"  # run as pasted by `make test-readme` only
    MAKE = "make"  # `make` targets: the walk runs `make demo`'s recipe first; `make test` is the suite itself
    CONTAINERS = "containers"  # docker commands: `make test-containers` runs them (tests/containers/)
    HOSTS = "hosts"  # each on its own host: `make test-hosts` runs them (tests/hosts/)


PLAN: dict[str, tuple[How, str]] = {
    "fedshard #1": (How.MAKE, "make demo and make test: the walk starts with make demo's recipe"),
    "What the demo does #1": (How.SLOW, "the Flower engine starts Ray: about a minute"),
    "See a run: report and metrics #1": (How.SUITE, ""),
    "Privacy budgets #1": (How.SUITE, ""),
    "Tuning privately #1": (How.SUITE, ""),
    "Thousands of sites, and growing a running federation #1": (How.SUITE, ""),
    "Homomorphic encryption #1": (How.SUITE, ""),
    "Fine-tune a large model (LoRA over a frozen base) #1": (How.SLOW, "pretrains its base first: about 3 minutes"),
    "Fine-tune your own Hugging Face model #1": (How.SLOW, "3 rounds of a 22.7 M-parameter BERT: about 3 minutes"),
    "Run across machines #1": (How.SLOW, "a deployment of 5 rounds: about 2 minutes"),
    "Run across machines #2": (How.SLOW, "upgrades the keys the block before wrote"),
    "On separate hosts #1": (How.HOSTS, "the machine keeping the CA: make test-hosts runs it"),
    "On separate hosts #2": (How.HOSTS, "each zone's host: make test-hosts runs it on three"),
    "On separate hosts #3": (How.HOSTS, "the aggregator's host: make test-hosts runs it"),
    "On separate hosts #4": (How.HOSTS, "each hospital's host: make test-hosts runs it on four"),
    "On separate hosts #5": (How.HOSTS, "the aggregator's host after the run: make test-hosts runs it"),
    "Growing a deployed federation #1": (How.SLOW, "a deployment of 20 rounds that grows: about 2 minutes"),
    "Run in containers #1": (How.CONTAINERS, "docker: make test-containers builds the image and runs this federation"),
    "Development #1": (How.MAKE, "the developer's make targets: make test is this suite"),
}
"""Each bash block of the README (``heading #n``: its n-th block under that heading) → how the
suite runs it, and why not in ``make test`` where it does not."""

BLOCK_TIMEOUT_S = {How.SUITE: 300.0, How.SLOW: 2400.0, How.MAKE: 300.0, How.CONTAINERS: 900.0, How.HOSTS: 900.0}


@dataclass(frozen=True)
class Block:
    """A fenced ``bash`` block of the README."""

    heading: str
    index: int  # its place among its heading's bash blocks, from 1
    line: int  # where its fence opens in README.md
    text: str

    @property
    def key(self) -> str:
        """``heading #index``, as :data:`PLAN` names it."""
        return f"{self.heading} #{self.index}"

    @property
    def how(self) -> How:
        """How the suite runs it (KeyError: the block is not planned)."""
        return PLAN[self.key][0]


def blocks(readme: Path = README) -> list[Block]:
    """The README's ``bash`` blocks, in order."""
    found: list[Block] = []
    heading, counts = "", dict[str, int]()
    lines = readme.read_text().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            if line.strip() == "```bash":
                counts[heading] = counts.get(heading, 0) + 1
                found.append(Block(heading, counts[heading], i + 1, "\n".join(lines[i + 1 : end]) + "\n"))
            i = end + 1
            continue
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        i += 1
    return found


def demo_recipe(makefile: Path = MAKEFILE) -> str:
    """What ``make demo`` runs once ``.venv`` is installed (its recipe, ``$(BIN)`` spelled out)."""
    lines = makefile.read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("demo:"))
    recipe = [ln.strip() for ln in lines[start + 1 :] if ln.startswith("\t")][:1]
    return "\n".join(recipe).replace("$(BIN)", ".venv/bin") + "\n"


def commands(text: str) -> str:
    """``text`` without its comments (what a shell runs)."""
    return "\n".join(re.sub(r"(^|\s)#.*$", "", ln) for ln in text.splitlines())


@dataclass
class Ran:
    """What one block did: its exit status and output, its wall time, the run folders it made."""

    block: str
    seconds: float
    proc: subprocess.CompletedProcess[str]
    runs: list[Path] = field(default_factory=list)  # new folders under runs/, oldest first


class Walk:
    """A fresh folder where blocks run one after the other, as in one terminal."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copytree(ROOT / "configs", folder / "configs")
        (folder / ".venv").symlink_to(VENV)
        self.ran: dict[str, Ran] = {}

    def _runs(self) -> set[Path]:
        runs = self.folder / "runs"
        return {p for p in runs.iterdir() if p.is_dir()} if runs.is_dir() else set()

    def run(self, key: str, text: str, how: How) -> Ran:
        """Run ``text`` with bash (``-e``: a failing command fails the block) in the walk's folder."""
        env = dict(os.environ)
        env.update(FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1", COLUMNS="80")
        before = self._runs()
        started = time.monotonic()
        child = subprocess.Popen(
            ["bash", "-e", "-c", text],
            cwd=self.folder,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # the block's background jobs in its own group, stopped below
        )
        try:
            out, err = child.communicate(timeout=BLOCK_TIMEOUT_S[how])
        except subprocess.TimeoutExpired:
            _stop_group(child.pid)
            out, err = child.communicate()
            err += f"\n(the walk stopped the block after {BLOCK_TIMEOUT_S[how]:.0f} s)"
        _stop_group(child.pid)  # whatever a failed block left running
        proc = subprocess.CompletedProcess(child.args, child.returncode, out, err)
        made = sorted(self._runs() - before, key=lambda p: (p.stat().st_mtime, p.name))
        self.ran[key] = Ran(key, time.monotonic() - started, proc, made)
        return self.ran[key]

    def demo(self) -> Ran:
        """``make demo``'s recipe."""
        return self.run("make demo", demo_recipe(), How.MAKE)


def _stop_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def walk(folder: Path, *, slow: bool) -> Walk:
    """Run ``make demo``'s recipe, then the README's blocks in order: the quick ones, or
    (``slow``) every block. A block that fails stops the walk (what follows may need it)."""
    done = Walk(folder)
    if done.demo().proc.returncode != 0:
        return done
    for block in blocks():
        how = block.how
        if how in (How.MAKE, How.CONTAINERS, How.HOSTS) or (how is How.SLOW and not slow):
            continue
        if done.run(block.key, block.text, how).proc.returncode != 0:
            break
    return done


def timings(done: Walk) -> str:
    """One line per block run: its wall time, exit status and key."""
    return "\n".join(f"{r.seconds:8.1f} s  rc {r.proc.returncode}  {r.block}" for r in done.ran.values())
