"""Where a site keeps its model between messages: its on-prem shard store.

Every Flower message starts a fresh ClientApp process, so the site's model (parameter
shards, server-optimiser state, model version) lives here between messages.

* :class:`SealedModelStore` (default): a :class:`~fedshard.store.SealedShardStore` in
  ``<state_dir>/shards``: every shard AES-256-GCM-sealed under its own data key, the
  data keys wrapped by the site's key-encryption key (a key file kept away from the
  data), every read verified; the model is read back layer by layer through the
  prefetching loader; each save is one atomic commit.
* :class:`SnapshotModelStore`: one plaintext ``.npz`` snapshot (``store.encrypt: false``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from fedshard.store import LocalShardStore

if TYPE_CHECKING:
    from fedshard.crypto.at_rest import Kek
    from fedshard.sharding import ShardPlan

__all__ = ["ModelStore", "SealedModelStore", "SnapshotModelStore", "site_kek"]

_META = "site"  # the store metadata key of the site's model state
_SNAPSHOT = "current"


class ModelStore(Protocol):
    """A site's model state: shards and small arrays by id, plus JSON metadata."""

    def exists(self) -> bool:
        """Whether a model was saved."""
        ...

    def load(self, plan: ShardPlan | None = None) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """``(meta, arrays)``; ``plan`` (when known) lets the store load the model layer by layer."""
        ...

    def save(self, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> None:
        """Replace the saved state atomically."""
        ...


class SnapshotModelStore:
    """The state as one plaintext ``.npz`` snapshot in ``state_dir``."""

    def __init__(self, state_dir: Path) -> None:
        self._store = LocalShardStore(state_dir)

    def exists(self) -> bool:
        """Whether a snapshot exists."""
        return self._store.exists(_SNAPSHOT)

    def load(self, plan: ShardPlan | None = None) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """The snapshot's metadata and arrays."""
        return self._store.load(_SNAPSHOT)

    def save(self, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> None:
        """Write the snapshot (temporary file, then rename)."""
        self._store.save(_SNAPSHOT, arrays, meta)


class SealedModelStore:
    """The state in an encrypted shard store at ``root``, sealed under ``kek``.

    Parameters
    ----------
    root:
        The store's folder (``<state_dir>/shards``) or an fsspec URL.
    kek:
        The site's key-encryption key (see :func:`site_kek`).
    lookahead:
        Layers the loader decrypts ahead of the one being assembled.
    """

    def __init__(self, root: str | Path, kek: Kek, lookahead: int = 2) -> None:
        self.root = root
        self.kek = kek
        self.lookahead = lookahead

    def exists(self) -> bool:
        """Whether the store holds a saved model."""
        from fedshard.store.catalog import CATALOG
        from fedshard.store.location import backend_for

        return backend_for(self.root).read(CATALOG) is not None

    def load(self, plan: ShardPlan | None = None) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """Metadata and arrays; the plan's shards through the prefetching loader, layer by layer."""
        from fedshard.sharding import ShardPlan
        from fedshard.store.prefetch import PrefetchLoader
        from fedshard.store.sealed_store import SealedShardStore

        store = SealedShardStore.open(self.root, self.kek)
        try:
            meta = dict(store.get_meta(_META) or {})
            plan = plan or ShardPlan.from_json(meta["plan"])
            tensors: dict[str, np.ndarray] = {}
            for _, layer in PrefetchLoader(store.get, plan, lookahead=self.lookahead):
                tensors.update(layer)
            arrays = plan.split(tensors)
            extra = [sid for sid in store.list() if sid not in arrays]
            arrays.update(store.get_many(extra))
        finally:
            store.close()
        return meta, arrays

    def save(self, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> None:
        """Write every array and the metadata in one commit; drop arrays no longer saved.

        The commit also records the plan, the model version and the Merkle root of the
        parameter shards, which ``fedshard verify --store`` checks the shards against.
        """
        from fedshard.sharding import ShardPlan
        from fedshard.store.model_io import record_model
        from fedshard.store.sealed_store import SealedShardStore

        store = SealedShardStore.open(self.root, self.kek, create=True)
        try:
            with store.batch():
                store.put_many(arrays)
                for sid in store.list():
                    if sid not in arrays:
                        store.delete(sid)
                store.set_meta(_META, dict(meta))
                record_model(store, ShardPlan.from_json(meta["plan"]), str(meta["version"]))
        finally:
            store.close()


def site_kek(key_file: Path, *, create: bool) -> Kek:
    """The site's key-encryption key from ``key_file`` (created, mode 600, when ``create`` and missing)."""
    from fedshard.crypto.at_rest import generate_kek_file, load_kek

    if create and not key_file.exists():
        key_file.parent.mkdir(parents=True, exist_ok=True)
        return generate_kek_file(key_file)
    return load_kek(key_file)
