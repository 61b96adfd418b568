"""bench/store.py still runs (--quick, writing to a scratch file, never to BENCHMARKS.md)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.slow


def _section(path: Path) -> str:
    match = re.search(r"<!-- bench:store -->.*?<!-- /bench:store -->", path.read_text(), re.DOTALL)
    return match.group(0) if match else ""


def test_store_benchmark_runs_in_quick_mode(tmp_path: Path) -> None:
    out = tmp_path / "BENCH.md"
    before = _section(ROOT / "BENCHMARKS.md")
    proc = subprocess.run(
        [sys.executable, "bench/store.py", "--quick", "--output", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    section = _section(out)
    assert section and "| warm read, one 256x256 fp32 tile" in section
    for measure in ("cold read, int4", "key rotation", "cold tier fp8: bytes, error", "safetensors load_model"):
        assert measure in section
    assert "**Interpretation.**" in section
    assert _section(ROOT / "BENCHMARKS.md") == before
