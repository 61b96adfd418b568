"""The privacy ledger's file: format version, schema and triggers, creation, checked opening.

See :mod:`fedshard.privacy.ledger` for the stability contract these tables keep.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
from collections.abc import Callable, Mapping
from contextlib import suppress
from pathlib import Path

from fedshard._fs import fsync_dir, fsync_fd
from fedshard.errors import StoreError
from fedshard.privacy.ledger.chain import Field

__all__ = ["DO_NOT_DELETE", "FORMAT_VERSION", "META_KEYS", "SCHEMA", "create", "open_checked", "refuse"]

FORMAT_VERSION = 2
"""Version of the ledger's file format; a reader refuses any other (1: before rows were authenticated)."""

_SQLITE_MAGIC = b"SQLite format 3\x00"
_TABLES = frozenset({"meta", "budgets", "events", "commits"})
DO_NOT_DELETE = "do not delete it: the privacy spent would be forgotten"

SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value NOT NULL);
CREATE TABLE budgets (
    pos INTEGER NOT NULL UNIQUE,
    epsilon REAL NOT NULL,
    delta REAL NOT NULL,
    set_at REAL NOT NULL,
    mac BLOB NOT NULL
);
CREATE TABLE events (
    seq INTEGER PRIMARY KEY,
    round INTEGER NOT NULL CHECK (round >= -1),
    mechanism TEXT NOT NULL,
    guarantee TEXT NOT NULL,
    noise_multiplier REAL NOT NULL,
    sample_rate REAL NOT NULL,
    steps INTEGER NOT NULL,
    delta REAL NOT NULL,
    epsilon_after REAL NOT NULL,
    created_at REAL NOT NULL,
    pos INTEGER NOT NULL UNIQUE,
    mac BLOB NOT NULL
);
CREATE INDEX events_by_round ON events (round);
CREATE TABLE commits (
    seq INTEGER PRIMARY KEY REFERENCES events (seq),
    committed_at REAL NOT NULL,
    pos INTEGER NOT NULL UNIQUE,
    mac BLOB NOT NULL
);
CREATE TRIGGER budgets_no_update BEFORE UPDATE ON budgets
    BEGIN SELECT RAISE(ABORT, 'a privacy budget can be lowered, never raised'); END;
CREATE TRIGGER budgets_no_delete BEFORE DELETE ON budgets
    BEGIN SELECT RAISE(ABORT, 'a privacy budget can be lowered, never raised'); END;
CREATE TRIGGER budgets_only_down BEFORE INSERT ON budgets
    WHEN NEW.epsilon > (SELECT min(epsilon) FROM budgets) OR NEW.delta > (SELECT min(delta) FROM budgets)
    BEGIN SELECT RAISE(ABORT, 'a privacy budget can be lowered, never raised'); END;
CREATE TRIGGER events_no_update BEFORE UPDATE ON events
    BEGIN SELECT RAISE(ABORT, 'privacy ledger events are append-only'); END;
CREATE TRIGGER events_no_delete BEFORE DELETE ON events
    BEGIN SELECT RAISE(ABORT, 'privacy ledger events are append-only'); END;
CREATE TRIGGER commits_no_update BEFORE UPDATE ON commits
    BEGIN SELECT RAISE(ABORT, 'privacy ledger commits are append-only'); END;
CREATE TRIGGER commits_no_delete BEFORE DELETE ON commits
    BEGIN SELECT RAISE(ABORT, 'privacy ledger commits are append-only'); END;
CREATE TRIGGER meta_no_update BEFORE UPDATE ON meta
    BEGIN SELECT RAISE(ABORT, 'privacy ledger meta rows never change'); END;
CREATE TRIGGER meta_no_delete BEFORE DELETE ON meta
    BEGIN SELECT RAISE(ABORT, 'privacy ledger meta rows are never deleted'); END;
"""

META_KEYS = ("format", "ledger_id", "key_id", "created_at", "accountant", "recovered_from")
"""The meta rows, in the order the chain's genesis MAC covers them."""


def refuse(path: Path, problem: str) -> StoreError:
    """The one-line error for a ledger file at ``path`` that cannot be used (``problem`` says why)."""
    problem = " ".join(problem.split())  # quick_check reports span lines; the CLI prints one
    return StoreError(f"privacy ledger {path} {problem}: check the path, or restore it from a backup; {DO_NOT_DELETE}")


def create(path: Path, meta: Mapping[str, Field], fill: Callable[[sqlite3.Connection], None]) -> None:
    """Build a complete ledger under a temporary name, then link it into place.

    ``meta`` holds the values of :data:`META_KEYS` but the format; ``fill`` writes the
    first rows (the budget, and the events a recovered ledger carries) in the same
    transaction, so a ledger path that exists is always a complete, authenticated ledger.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".new", dir=path.parent)
        os.close(fd)
    except OSError as exc:
        raise StoreError(f"cannot create privacy ledger {path}: {exc.strerror or exc}") from exc
    tmp = Path(tmp_name)
    try:
        conn = sqlite3.connect(tmp, isolation_level=None)
        try:
            # Nothing is synced while the file is built under its temporary name (SQLite synced
            # each of the schema's statements: 17 syncs a ledger); the file is fsync'd once,
            # complete, before it is linked into place, and opened with synchronous=FULL after.
            # Nor is a write-ahead log needed while nobody else can see the file (its files cost two
            # creations and two removals a ledger): the journal stays in memory until the file is
            # complete, which then switches to WAL (recorded in the file's header) for every later open.
            conn.execute("PRAGMA synchronous=OFF")
            conn.execute("PRAGMA journal_mode=MEMORY")
            conn.executescript(SCHEMA)
            conn.execute("BEGIN")
            values = {**meta, "format": FORMAT_VERSION}
            conn.executemany("INSERT INTO meta (key, value) VALUES (?, ?)", [(k, values[k]) for k in META_KEYS])
            fill(conn)
            conn.execute("COMMIT")
            if conn.execute("PRAGMA journal_mode=WAL").fetchone()[0] != "wal":
                raise sqlite3.OperationalError("the ledger's journal cannot be switched to WAL")
        finally:
            conn.close()  # checkpoints the WAL into the file and removes it
        with open(tmp, "rb+") as fh:
            fsync_fd(fh.fileno())
        try:
            # link, unlike rename, fails if another process created the ledger meanwhile:
            # theirs stays, ours is discarded.
            os.link(tmp, path)
        except FileExistsError:
            pass
        except OSError:  # a filesystem without hard links
            if not path.exists():
                os.replace(tmp, path)
        fsync_dir(path.parent)
    except (OSError, sqlite3.Error) as exc:
        raise StoreError(f"cannot create privacy ledger {path}: {exc}") from exc
    finally:
        for leftover in (tmp, Path(f"{tmp}-wal"), Path(f"{tmp}-shm")):
            with suppress(OSError):
                leftover.unlink(missing_ok=True)


def open_checked(path: Path) -> sqlite3.Connection:
    """Open an existing ledger after checking it; never modifies it."""
    try:
        with open(path, "rb") as fh:
            header = fh.read(len(_SQLITE_MAGIC))
    except OSError as exc:
        raise StoreError(f"cannot read privacy ledger {path}: {exc.strerror or exc}") from exc
    if header != _SQLITE_MAGIC:
        raise refuse(path, "is not an SQLite database (empty or overwritten)")
    try:
        conn = sqlite3.connect(path, isolation_level=None, timeout=30.0, check_same_thread=False)
    except sqlite3.Error as exc:
        raise refuse(path, f"cannot be opened ({exc})") from exc
    try:
        problems = [row[0] for row in conn.execute("PRAGMA quick_check")]
        if problems != ["ok"]:
            raise refuse(path, f"is corrupt ({problems[0] if problems else 'no quick_check result'})")
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "meta" not in tables:
            raise refuse(path, "is not a fedshard privacy ledger (tables missing)")
        found = conn.execute("SELECT value FROM meta WHERE key = 'format'").fetchone()
        version = found[0] if found else None
        if isinstance(version, int) and version > FORMAT_VERSION:
            raise StoreError(
                f"privacy ledger {path} has format {version}, newer than this fedshard reads "
                f"({FORMAT_VERSION}): upgrade fedshard; {DO_NOT_DELETE}"
            )
        if version == 1:
            raise StoreError(
                f"privacy ledger {path} has format 1, written before ledgers were authenticated: run "
                "`fedshard budget recover --site-config FILE` to carry its ε forward into a format-2 ledger; "
                f"{DO_NOT_DELETE}"
            )
        if version != FORMAT_VERSION:
            raise refuse(path, f"has an unknown format {version!r}")
        if not _TABLES.issubset(tables):
            raise refuse(path, "is not a fedshard privacy ledger (tables missing)")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA foreign_keys=ON")
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise refuse(path, f"is corrupt ({exc})") from exc
    except BaseException:
        conn.close()
        raise
    return conn
