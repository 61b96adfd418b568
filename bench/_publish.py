"""Publishing a benchmark's results (not a benchmark itself): the one helper every bench script ends with.

:func:`publish` takes what a benchmark measured, already put into words and a table, and

* prints the table (rich when installed, plain text otherwise) and the interpretation;
* writes the benchmark's section of ``BENCHMARKS.md`` (or ``--output FILE``), delimited by
  ``<!-- bench:NAME -->`` … ``<!-- /bench:NAME -->``: a header (command, machine, date,
  runs), the notes, the table and the interpretation; rerunning a benchmark replaces only
  its own section, and ``--quick`` writes nothing unless ``--output`` says where;
* with ``--json``, prints the benchmark's headline figures as one JSON object on the last
  line of stdout (numbers as plain JSON numbers; a figure that could not be measured is
  ``null``).

:func:`add_output_args` gives every benchmark the same ``--quick``, ``--output`` and
``--json`` options.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import enum
import json
import math
import os
import platform
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "BENCHMARKS_MD",
    "MD_HEADER",
    "REPO",
    "add_output_args",
    "command_line",
    "headline_json",
    "machine_description",
    "machine_line",
    "markdown_table",
    "output_path",
    "print_table",
    "publish",
    "section_header",
    "write_section",
]

REPO = Path(__file__).resolve().parent.parent
BENCHMARKS_MD = REPO / "BENCHMARKS.md"
MD_HEADER = (
    "# fedshard benchmarks\n\n"
    "Every number below was produced by the command shown in its section, on the machine "
    "described there; rerunning a benchmark replaces only its own section.\n"
)


# machine ----------------------------------------------------------------------------------
def machine_description() -> dict[str, str]:
    """CPU model, cores, RAM, OS and the versions that matter for these benchmarks."""
    cpu = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import psutil

        ram = f"{psutil.virtual_memory().total / 2**30:.1f} GiB"
    except ImportError:  # pragma: no cover
        ram = f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.1f} GiB"
    import google.protobuf
    import grpc
    from google.protobuf.internal import api_implementation

    return {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "ram": ram,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "numpy": np.__version__,
        "grpcio": grpc.__version__,
        "protobuf": f"{google.protobuf.__version__} ({api_implementation.Type()})",
    }


def machine_line(desc: dict[str, str] | None = None) -> str:
    """The machine of ``desc`` (this one by default) in one line."""
    d = desc or machine_description()
    return (
        f"{d['cpu']}, {d['cores']} cores, {d['ram']} RAM, {d['os']}; Python {d['python']}, "
        f"numpy {d['numpy']}, grpcio {d['grpcio']}, protobuf {d['protobuf']}"
    )


# tables ------------------------------------------------------------------------------------
def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """Print a table (rich if available)."""
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # pragma: no cover
        print(f"\n{title}")
        widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(headers)]
        print("  ".join(str(h).ljust(w) for h, w in zip(headers, widths, strict=True)))
        for r in rows:
            print("  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)))
        return
    table = Table(title=title)
    for i, h in enumerate(headers):
        table.add_column(h, justify="left" if i == 0 else "right")
    for r in rows:
        table.add_row(*[str(c) for c in r])
    Console(width=200).print(table)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub markdown table; a ``|`` inside a cell (``|x|``) is escaped so that it does not end the cell."""
    align = "|".join("---" if i == 0 else "---:" for i in range(len(headers)))
    out = ["| " + " | ".join(headers) + " |", f"|{align}|"]
    out += ["| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |" for r in rows]
    return "\n".join(out)


# sections of BENCHMARKS.md --------------------------------------------------------------------
def command_line() -> str:
    """The command that ran this benchmark, as typed from the repository root."""
    script = Path(sys.argv[0]).resolve()
    try:
        script_s = str(script.relative_to(REPO))
    except ValueError:
        script_s = str(script)
    return " ".join([".venv/bin/python", script_s, *sys.argv[1:]])


def section_header(title: str, runs: str, desc: dict[str, str] | None = None) -> str:
    """The first lines of a section: title, command, machine, date and what was repeated."""
    now = _dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    return (
        f"## {title}\n\n"
        f"- Command: `{command_line()}` (from the repository root)\n"
        f"- Machine: {machine_line(desc)}\n"
        f"- Date: {now}\n"
        f"- Runs: {runs}\n"
    )


def write_section(name: str, body: str, path: Path | None = None) -> Path:
    """Put ``body`` into ``name``'s section of ``path`` (BENCHMARKS.md), replacing the old one."""
    path = path or BENCHMARKS_MD
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    block = f"{start}\n{body.strip()}\n{end}"
    text = path.read_text() if path.exists() else MD_HEADER
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.DOTALL)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text)
    return path


# options and the one publishing call ----------------------------------------------------------
class _Smoke(argparse.Action):
    """``--smoke``: ``--quick`` (nothing written without ``--output``), at the smallest size that still
    runs every code path of the benchmark; what the test suite runs (its figures mean nothing)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=False, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, *_: Any) -> None:
        namespace.smoke = namespace.quick = True


def add_output_args(parser: argparse.ArgumentParser) -> None:
    """``--quick``, ``--smoke``, ``--output`` and ``--json``: the common command-line options of the benchmarks."""
    parser.add_argument("--quick", action="store_true", help="small sizes (seconds to a few minutes)")
    parser.add_argument(
        "--smoke",
        action=_Smoke,
        help="--quick at the smallest size that runs every code path: the test suite's check of the plumbing",
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=None,
        help="markdown file to write the section into (default: BENCHMARKS.md; with --quick, nothing "
        "is written unless --output is given, so a smoke test never replaces real results)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the headline figures as one JSON object on the last line of stdout",
    )


def output_path(args: argparse.Namespace) -> Path | None:
    """Where ``args`` say the section goes: ``--output``, else BENCHMARKS.md unless ``--quick``."""
    if args.output is not None:
        return Path(args.output)
    return None if args.quick else BENCHMARKS_MD


def _plain(value: Any) -> Any:
    """``value`` as plain JSON data: numpy scalars as numbers, non-finite floats as ``None``."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, enum.Enum):
        return _plain(value.value)
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TypeError(f"headline figure {value!r} is not a number, string, list or mapping")


def headline_json(headline: Mapping[str, Any]) -> str:
    """``headline`` as one line of JSON (see :func:`_plain`)."""
    return json.dumps(_plain(headline), allow_nan=False, ensure_ascii=False)


def publish(
    args: argparse.Namespace,
    name: str,
    title: str,
    runs: str,
    desc: dict[str, str] | None,
    notes: Sequence[str],
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    interpretation: str,
    *,
    headline: Mapping[str, Any] | None = None,
    console_title: str | None = None,
) -> None:
    """Show a benchmark's results, write its section where ``args`` say, and print its ``--json`` line.

    Parameters
    ----------
    name, title:
        The section's id in BENCHMARKS.md and its heading.
    runs, desc:
        What was repeated, and the machine (this one when ``None``), for the section's header.
    notes, headers, rows, interpretation:
        The section's body: notes (markdown lines), the results table, the interpretation.
    headline:
        The benchmark's headline figures, printed as one JSON object on the last line of
        stdout with ``--json``.
    console_title:
        With it, the table is printed under this title, then the interpretation, before
        anything is written.
    """
    if console_title is not None:
        print_table(console_title, headers, rows)
        print("\n" + interpretation)
    out = output_path(args)
    if out is not None:
        body = "\n".join(
            [
                section_header(title, runs, desc),
                *notes,
                "",
                markdown_table(headers, rows),
                "",
                f"**Interpretation.** {interpretation}",
            ]
        )
        write_section(name, body, out)
        print(f"\nwrote section '{name}' of {out}")
    if getattr(args, "json", False):
        sys.stdout.flush()
        print(headline_json(headline or {}), flush=True)
