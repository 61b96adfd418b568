"""Picking a store's backend from where it lives (a local folder or an fsspec URL)."""

from __future__ import annotations

from pathlib import Path

from fedshard.store._backend import Backend

__all__ = ["backend_for"]


def backend_for(location: str | Path | Backend) -> Backend:
    """The backend for ``location``: a :class:`Backend` as is, a URL (``scheme://…``) through
    fsspec, anything else a local folder (the default backend)."""
    if isinstance(location, Backend):
        return location
    if isinstance(location, str) and "://" in location:
        from fedshard.store._fsspec_backend import FsspecBackend

        return FsspecBackend(location)
    from fedshard.store.local_dir import LocalDirBackend

    return LocalDirBackend(Path(location))
