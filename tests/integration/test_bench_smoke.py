"""The benchmarks still run (in --quick mode, writing to a scratch file, never to BENCHMARKS.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", ["zone_accumulate", "upload", "zone_memory", "dp_accuracy", "routing", "mtls", "he"])
def test_benchmark_runs_in_quick_mode(name: str, tmp_path: Path) -> None:
    out = tmp_path / "BENCH.md"
    before = (ROOT / "BENCHMARKS.md").read_bytes()
    proc = subprocess.run(
        [sys.executable, f"bench/{name}.py", "--quick", "--output", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    text = out.read_text()
    assert f"<!-- bench:{name} -->" in text and f"<!-- /bench:{name} -->" in text
    assert "| " in text  # a results table
    assert (ROOT / "BENCHMARKS.md").read_bytes() == before
