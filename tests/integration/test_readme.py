"""The README pastes: every bash block is planned (:data:`tests.readme_walk.PLAN`), names only
files the checkout ships, no placeholders and no author's run; the quick blocks run as pasted
after ``make demo`` (``make test``), and every block does under ``make test-readme``."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.readme_walk import PLAN, ROOT, SLOW_ENV, How, Ran, Walk, blocks, commands, timings, walk

PLACEHOLDER = re.compile(r"\b(?:FILE|DIR|RUN_DIR|KEK|NAME|SITE|PORT|HOST|ADDR|N)\b|<[a-z_-]+>")
"""What the synopsis uses for "put yours here": a block to paste has none."""


def test_every_block_is_planned_names_what_ships_and_has_no_placeholder() -> None:
    found = blocks()
    keys = [b.key for b in found]
    assert sorted(keys) == sorted(PLAN), "a README bash block was added, moved or removed: update readme_walk.PLAN"
    for block in found:
        text = commands(block.text)
        where = f"README.md line {block.line} ({block.key})"
        assert not PLACEHOLDER.search(text), f"{where}: a placeholder: {PLACEHOLDER.search(text)}"
        assert not re.search(r"runs/\d{8}", text), f"{where}: names one author's run"
        bare = [ln for ln in text.splitlines() if re.match(r"\s*fedshard\b", ln)]
        assert not bare or 'export PATH="$PWD/.venv/bin:$PATH"' in text, f"{where}: `fedshard` is not on PATH"
        for path in re.findall(r"\bconfigs/[\w./$-]+", text):
            matches = list(ROOT.glob(re.sub(r"\$\w+", "*", path)))
            assert matches, f"{where}: {path} is not shipped"


@pytest.mark.slow
def test_the_quick_blocks_run_as_pasted(readme_walk: Walk) -> None:
    """make demo's recipe, then each quick block in order, in one fresh folder: exit 0 each."""
    suite = [b.key for b in blocks() if b.how is How.SUITE]
    assert list(readme_walk.ran) == ["make demo", *suite], timings(readme_walk)
    for ran in readme_walk.ran.values():
        assert ran.proc.returncode == 0, f"{ran.block}:\n{ran.proc.stdout[-2000:]}\n{ran.proc.stderr[-2000:]}"
    metrics = readme_walk.ran["See a run: report and metrics #1"].runs[-1]
    assert (readme_walk.ran["make demo"].runs[0] / "report" / "report.html").is_file()  # the newest run's report
    # the metrics run's last values outlive it: a scrape after the 6-second run still finds them
    kept = (metrics / "metrics.prom").read_text()
    assert "fedshard_round 20.0" in kept and 'fedshard_zone_pushes_total{zone="eu-central"}' in kept
    grown = readme_walk.ran["Thousands of sites, and growing a running federation #1"]
    assert "zone uk-south added" in " ".join(grown.proc.stdout.split())  # the change was taken, not refused


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get(SLOW_ENV), reason=f"every block, slow ones too: make test-readme ({SLOW_ENV}=1)")
def test_every_block_runs_as_pasted(tmp_path: Path) -> None:
    """The fresh-clone walk-through: make demo's recipe and every block in the README's order."""
    done = walk(tmp_path / "walk", slow=True)
    print("\nREADME walk-through (wall time per block):\n" + timings(done))
    failed: list[Ran] = [r for r in done.ran.values() if r.proc.returncode != 0]
    assert not failed, f"{failed[0].block}:\n{failed[0].proc.stdout[-3000:]}\n{failed[0].proc.stderr[-3000:]}"
    assert len(done.ran) == 1 + sum(1 for b in blocks() if b.how not in (How.MAKE, How.CONTAINERS, How.HOSTS))
