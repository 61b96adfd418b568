"""bench/site_overhead.py --quick --json: one JSON line last, and the goals it measures hold."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_site_overhead_quick_json(tmp_path: Path) -> None:
    out = tmp_path / "BENCH.md"
    before = (ROOT / "BENCHMARKS.md").read_bytes() if (ROOT / "BENCHMARKS.md").exists() else b""
    proc = subprocess.run(
        [sys.executable, "bench/site_overhead.py", "--quick", "--json", "--output", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    headline = json.loads(proc.stdout.strip().splitlines()[-1])
    assert headline["mode"] == "quick"
    assert headline["demo_message_s"] > 0 and headline["transformer_message_s"] > 0
    assert headline["model_builds_after_first"] == 0
    assert abs(headline["instruction_bytes_growth"]) < 16  # the train message does not grow with the round
    assert "<!-- bench:site_overhead -->" in out.read_text()
    assert ((ROOT / "BENCHMARKS.md").read_bytes() if (ROOT / "BENCHMARKS.md").exists() else b"") == before
