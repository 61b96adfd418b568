"""The command line follows the conventions Flower and FLARE users expect: --version, -h on
every command, listed choices, and the operator commands for a running federation."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from fedshard import __version__
from fedshard.cli.main import app

runner = CliRunner()


def test_version_and_short_help_on_every_level() -> None:
    said = runner.invoke(app, ["--version"])
    assert said.exit_code == 0 and said.stdout.strip() == f"fedshard {__version__}"
    for command in ([], ["simulate"], ["aggregator"], ["aggregator", "stop"], ["site", "up"], ["budget", "show"]):
        shown = runner.invoke(app, [*command, "-h"])
        assert shown.exit_code == 0 and "Usage: " in shown.stdout, command


@pytest.mark.parametrize(
    ("command", "choices"),
    [(["simulate"], ("inprocess|flower", "direct|grpc")), (["site", "up"], ("warm|flower",))],
)
def test_options_with_a_fixed_set_of_values_list_them(command: list[str], choices: tuple[str, ...]) -> None:
    shown = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "200"})
    assert all(f"[{c}]" in shown.stdout for c in choices), shown.stdout


def test_tables_at_80_columns_wrap_identifiers_and_never_cut_them() -> None:
    """Two tiles of one tensor differ only at the end of their ids (``fc1.weight#r0c0``): cut, they
    would look the same (the demo's routes: 15 ids were cut at 80 columns)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "COLUMNS": "80", "FLWR_TELEMETRY_ENABLED": "0"}
    args = ["route", "explain", "--config", "configs/demo.yaml", "--site", "charite-berlin"]
    shown = subprocess.run(
        [sys.executable, "-m", "fedshard.cli.main", *args], cwd=root, env=env, capture_output=True, text=True
    )
    assert shown.returncode == 0, shown.stderr
    assert "…" not in shown.stdout and max(len(line) for line in shown.stdout.splitlines()) <= 80
