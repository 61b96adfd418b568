"""The Flower release fedshard's patches and internal calls were written against: one range
for all of them (the warm executor, the one-pass delivery, the ServerApp's waits). Each
checks :func:`release_problem` first and falls back to Flower's stock path with one line."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

__all__ = ["SUPPORTED", "release_problem"]

SUPPORTED = "1.42."
"""The Flower release line whose internals were read (``flwr==1.42.*`` in pyproject.toml)."""


def release_problem(what: str) -> str | None:
    """Why ``what`` (a patch, in a few words) cannot run on the installed Flower because of
    its release; None when the release is the supported one."""
    try:
        installed = version("flwr")
    except PackageNotFoundError:
        return "Flower (flwr) is not installed"
    if not installed.startswith(SUPPORTED):
        return f"flwr {installed} is installed; {what} was written against flwr {SUPPORTED}*"
    return None
