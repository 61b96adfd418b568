"""A sealed store kept open between uses while its files are as this process left them.

Opening a :class:`~fedshard.store.sealed_store.SealedShardStore` reads its catalog and key
table and authenticates both (the key table unwrapped with the KEK): a few hundred
microseconds, paid by a site several times a message (its ledger's anchor, the model it
saves, the metadata it reads). :class:`KeptStore` opens the store once and hands the same
object out again while the catalog and the current key table have the identity and stamps
(inode, size, modification and change times) they had when this process last opened or
committed them; any other change (another process's commit, a key rotation, a restored
backup, an edit) makes the next use open the store afresh, with every check an open makes.
A use that raised drops the kept store too. A store that is not a local folder is opened
at every use. (An edit in place that keeps a file's size within one tick of the file
system's clock, a few milliseconds, after this process's own write is seen at the next
fresh open: the same rule as the site's held model, :mod:`fedshard.site._resident`.)
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING

from fedshard._fs import file_stamp
from fedshard.errors import FedshardError

if TYPE_CHECKING:
    from fedshard.crypto.at_rest import Kek
    from fedshard.store.sealed_store import SealedShardStore

__all__ = ["KeptStore"]

Stamp = tuple[int, int, int, int, int]


class KeptStore:
    """The sealed store at ``root`` (a folder or an fsspec URL) under ``kek``, opened once and
    kept while its files are unchanged (see the module docstring). One process's handle: uses
    from several threads take turns."""

    def __init__(self, root: str | Path, kek: Kek) -> None:
        self.root = root
        self.kek = kek
        self._local = Path(root) if isinstance(root, Path) or "://" not in str(root) else None
        self._store: SealedShardStore | None = None
        self._stamp: tuple[Stamp, Stamp] | None = None
        self._lock = threading.RLock()

    @contextmanager
    def use(self, *, create: bool = False) -> Iterator[SealedShardStore]:
        """The open store for the block (``create``: an empty one if there is none); its access
        times are flushed at the end, as closing it would.

        Raises
        ------
        StoreError, StoreKeyError
            As :meth:`SealedShardStore.open <fedshard.store.sealed_store.SealedShardStore.open>`.
        """
        from fedshard.store.sealed_store import SealedShardStore

        with self._lock:
            store = self._store if self.is_open() else None
            if store is None:
                self._store = self._stamp = None
                store = SealedShardStore.open(self.root, self.kek, create=create)
            try:
                yield store
            except BaseException:
                self._store = self._stamp = None
                with suppress(OSError, FedshardError):  # the block's own error is the one to report
                    store.flush()
                raise
            store.flush()
            self._stamp = self._stamps(store)
            self._store = store if self._stamp is not None else None

    def is_open(self) -> bool:
        """Whether a use now would hand out the kept store (its files unchanged since)."""
        with self._lock:
            return self._store is not None and self._stamp is not None and self._stamp == self._stamps()

    def files_stamp(self) -> tuple[Stamp, ...] | None:
        """The stamps of every file the kept store reads (its catalog, key table and shard blobs), in
        the catalog's order, while it is kept (its catalog and key table as this process left them);
        None when it is not, or a file cannot be read. A few ``stat`` calls: what a site checks
        between messages to know that the model it holds is still the one its store holds."""
        with self._lock:
            store, kept = self._store, self._stamp
            if self._local is None or store is None or kept is None or self._stamps() != kept:
                return None
            blobs: list[Stamp] = []
            for name in store.blob_names():
                stamp = file_stamp(self._local / name)
                if stamp is None:
                    return None
                blobs.append(stamp)
            return (*kept, *blobs)

    def drop(self) -> None:
        """Forget the open store: the next use opens it afresh."""
        with self._lock:
            self._store = self._stamp = None

    def _stamps(self, store: SealedShardStore | None = None) -> tuple[Stamp, Stamp] | None:
        """The stamps of the catalog and of the key table it names (``store``'s generation, or
        the kept one's); None when they cannot be read or the store is not a local folder."""
        from fedshard.store.catalog import CATALOG, keys_name

        held = store if store is not None else self._store
        if self._local is None or held is None:
            return None
        catalog = file_stamp(self._local / CATALOG)
        keys = file_stamp(self._local / keys_name(held.generation))
        return None if catalog is None or keys is None else (catalog, keys)
