"""Writing key and certificate files: once, atomically, with exact permissions (the PKI and key provisioning)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Sequence
from contextlib import suppress
from pathlib import Path

from fedshard._fs import fsync_dir, fsync_fd
from fedshard.errors import PkiError

__all__ = ["CERT_MODE", "KEY_MODE", "loose_key", "refuse_existing", "write_files"]

KEY_MODE = 0o600
CERT_MODE = 0o644


def loose_key(paths: Iterable[Path]) -> str | None:
    """The first of ``paths`` (private keys) that other users may read or write, as one line
    saying how to mend it; None when every one is private to its owner (or not POSIX)."""
    if os.name != "posix":
        return None
    for path in paths:
        mode = path.stat().st_mode & 0o777
        if mode & 0o077:
            return f"key file {path} is accessible to other users (mode {mode:o}): chmod 600 {path}"
    return None


def refuse_existing(paths: Iterable[Path], force: bool) -> None:
    """Raise :class:`PkiError` (pass --force) if any of ``paths`` exists, unless ``force``."""
    if force:
        return
    for path in paths:
        if path.exists():
            raise PkiError(f"{path} already exists: pass --force to overwrite it")


def write_files(files: Sequence[tuple[Path, bytes, int]], force: bool) -> None:
    """Write each ``(path, data, mode)`` atomically; without ``force`` never replace an existing file.

    Each file is complete under a temporary name (mode already set, fsynced)
    before it appears under its own, so a crash never leaves half a key behind.
    """
    refuse_existing((path for path, _, _ in files), force)
    for path, data, mode in files:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        except OSError as exc:
            raise PkiError(f"cannot write {path}: {exc.strerror or exc}") from None
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "wb") as fh:
                os.fchmod(fh.fileno(), mode)  # exact mode, whatever the umask
                fh.write(data)
                fh.flush()
                fsync_fd(fh.fileno())
            if force:
                os.replace(tmp, path)
            else:
                _link_new(tmp, path)
            fsync_dir(path.parent)
        except FileExistsError:
            raise PkiError(f"{path} already exists: pass --force to overwrite it") from None
        except OSError as exc:
            raise PkiError(f"cannot write {path}: {exc.strerror or exc}") from None
        finally:
            with suppress(OSError):
                tmp.unlink(missing_ok=True)


def _link_new(tmp: Path, path: Path) -> None:
    # link, unlike rename, fails if the file appeared meanwhile: theirs stays.
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise
    except OSError:  # a filesystem without hard links
        if path.exists():
            raise FileExistsError(path) from None
        os.replace(tmp, path)
