"""Where a site keeps its model between messages: its on-prem shard store.

The site's model (parameter shards, server-optimiser state, model version) lives here
between messages; the site holds the module itself in memory
(:class:`~fedshard.site._model.HeldModel`) and the store reads straight into the
module's tensors and writes straight from them: no intermediate copy of the model.

* :class:`SealedModelStore` (default): a :class:`~fedshard.store.SealedShardStore` in
  ``<state_dir>/shards``: every shard AES-256-GCM-sealed under its own data key, the
  data keys wrapped by the site's key-encryption key (a key file kept away from the
  data), every read verified; shards are decrypted layer by layer through the
  prefetching loader into the module; each save is one atomic commit.
* :class:`SnapshotModelStore`: one plaintext ``.npz`` snapshot (``store.encrypt: false``).

Both keep the same metadata (``version``, ``genesis``, ``applied_round``, ``plan`` as
canonical JSON, ``site_id``, ``rule``) and refuse a store written for another shard plan.
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from fedshard import faults
from fedshard._fs import file_stamp
from fedshard.errors import StoreError
from fedshard.site._model import HeldModel, ShardViews
from fedshard.store import LocalShardStore

if TYPE_CHECKING:
    import torch

    from fedshard.crypto.at_rest import Kek
    from fedshard.sharding import ShardPlan

__all__ = ["ModelStore", "SealedModelStore", "SnapshotModelStore", "site_kek", "stored_module"]

_META = "site"  # the store metadata key of the site's model state
_SNAPSHOT = "current"
_NPZ_META = "__meta__"  # the metadata entry of a LocalShardStore snapshot; shards are "s:<id>"


class ModelStore(Protocol):
    """A site's saved model: its plan's shards, extra arrays (optimiser state) and metadata."""

    def exists(self) -> bool:
        """Whether a model was saved."""
        ...

    def meta(self) -> dict[str, Any]:
        """The saved model's metadata, without reading its arrays."""
        ...

    def load_into(
        self, plan: ShardPlan, tensors: Mapping[str, np.ndarray]
    ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """Write the saved values into ``tensors`` (the module's, by name); ``(meta, extra arrays)``."""
        ...

    def save(
        self,
        plan: ShardPlan,
        shards: Mapping[str, np.ndarray],
        extras: Mapping[str, np.ndarray],
        meta: Mapping[str, Any],
    ) -> None:
        """Replace the saved model atomically: ``shards`` (every shard of ``plan``), ``extras``, ``meta``."""
        ...

    def load(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """Metadata and every array as a copy, shards by id (for tools and tests)."""
        ...

    def fingerprint(self) -> object | None:
        """A cheap token that changes whenever the saved model may have changed (None: unknown;
        then a site always reads the store again)."""
        ...


def _tree_token(root: Path) -> object | None:
    """:func:`fedshard._fs.file_stamp` of every file under ``root`` but the scratch folder and the
    advisory access times (a read may rewrite those)."""
    from fedshard.store.access import ACCESS

    tokens: list[tuple[str, int, int, int, int]] = []
    pending = [str(root)]
    try:
        while pending:
            with os.scandir(pending.pop()) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        if entry.name != ".tmp":
                            pending.append(entry.path)
                    elif entry.name != ACCESS:
                        st = entry.stat(follow_symlinks=False)
                        tokens.append((entry.path, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    except OSError:
        return None
    return frozenset(tokens)


def _check_plan(meta: Mapping[str, Any], plan: ShardPlan, where: object) -> None:
    """Refuse a store written for another shard plan (digest of the stored canonical JSON)."""
    stored = meta.get("plan")
    if not isinstance(stored, str):
        raise StoreError(f"the model store {where} records no shard plan; it was not written by a fedshard site")
    digest = hashlib.sha256(stored.encode()).hexdigest()
    if digest != plan.digest:
        raise StoreError(
            f"the model store {where} holds a model of shard plan {digest[:12]}…, this site's model has "
            f"{plan.digest[:12]}… (the task, its options or sharding.tile changed); use a new state folder"
        )


class SnapshotModelStore:
    """The state as one plaintext ``.npz`` snapshot in ``state_dir``."""

    def __init__(self, state_dir: Path) -> None:
        self._store = LocalShardStore(state_dir)
        self._path = Path(state_dir) / f"{_SNAPSHOT}.npz"

    def exists(self) -> bool:
        """Whether a snapshot exists."""
        return self._store.exists(_SNAPSHOT)

    @contextmanager
    def _open(self) -> Iterator[Any]:
        try:
            with np.load(self._path, allow_pickle=False) as data:
                yield data
        # RuntimeError: zipfile raises it (and NotImplementedError) for damaged header flags.
        except (OSError, ValueError, KeyError, RuntimeError, zipfile.BadZipFile, EOFError) as exc:
            raise StoreError(
                f"store file {self._path} is corrupt ({exc}); restore it from a backup or delete it"
            ) from None

    def meta(self) -> dict[str, Any]:
        """The snapshot's metadata."""
        with self._open() as data:
            meta: dict[str, Any] = json.loads(bytes(data[_NPZ_META]).decode())
        return meta

    def load_into(
        self, plan: ShardPlan, tensors: Mapping[str, np.ndarray]
    ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """Copy the snapshot's shards into ``tensors`` one at a time; ``(meta, extra arrays)``."""
        views = ShardViews(plan, tensors)
        extras: dict[str, np.ndarray] = {}
        seen = 0
        with self._open() as data:
            meta = json.loads(bytes(data[_NPZ_META]).decode())
            _check_plan(meta, plan, self._path)
            for name in data.files:
                if name == _NPZ_META:
                    continue
                sid, values = name[2:], data[name]
                if sid not in plan:
                    extras[sid] = values
                    continue
                if values.shape != plan.shard(sid).shape:
                    raise StoreError(f"store file {self._path}: shard {sid!r} has shape {values.shape}")
                views[sid] = values
                seen += 1
        if seen != len(plan):
            raise StoreError(f"store file {self._path} lacks {len(plan) - seen} shard(s) of the model")
        return meta, extras

    def save(
        self,
        plan: ShardPlan,
        shards: Mapping[str, np.ndarray],
        extras: Mapping[str, np.ndarray],
        meta: Mapping[str, Any],
    ) -> None:
        """Write the snapshot (temporary file, then rename)."""
        self._store.save(_SNAPSHOT, {**shards, **extras}, meta)

    def load(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """The snapshot's metadata and arrays."""
        return self._store.load(_SNAPSHOT)

    def fingerprint(self) -> object | None:
        """The snapshot file's identity and stamp (it is replaced by every save)."""
        return file_stamp(self._path)


class SealedModelStore:
    """The state in an encrypted shard store at ``root``, sealed under ``kek``.

    Parameters
    ----------
    root:
        The store's folder (``<state_dir>/shards``) or an fsspec URL.
    kek:
        The site's key-encryption key (see :func:`site_kek`).
    lookahead:
        Layers the loader decrypts ahead of the one being filled.
    """

    def __init__(self, root: str | Path, kek: Kek, lookahead: int = 2) -> None:
        from fedshard.store.kept import KeptStore

        self.root = root
        self.kek = kek
        self.lookahead = lookahead
        self.kept = KeptStore(root, kek)
        """The store, opened once and kept while its files are unchanged (the site's ledger anchor
        shares it: :class:`~fedshard.site.ledger_anchor.CatalogAnchor`)."""

    def exists(self) -> bool:
        """Whether the store holds a saved model.

        A store whose catalog records no model (a site killed while it saved its first
        one, between creating the store and committing the model) holds none: the site
        saves its genesis model into it again.
        """
        from fedshard.store.catalog import CATALOG
        from fedshard.store.location import backend_for

        if backend_for(self.root).read(CATALOG) is None:
            return False
        return bool(self.meta())

    def meta(self) -> dict[str, Any]:
        """The model's metadata (the store's catalog is authenticated; no shard is read)."""
        with self.kept.use() as store:
            return dict(store.get_meta(_META) or {})

    def load_into(
        self, plan: ShardPlan, tensors: Mapping[str, np.ndarray]
    ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """Decrypt and verify every shard straight into ``tensors``, layer by layer; ``(meta, extra arrays)``."""
        from fedshard.store.model_io import read_into

        faults.point("site.load.begin")
        with self.kept.use() as store:
            meta = dict(store.get_meta(_META) or {})
            _check_plan(meta, plan, self.root)
            read_into(store, plan, tensors, lookahead=self.lookahead)
            extras = store.get_many([sid for sid in store.list() if sid not in plan])
        faults.point("site.load.end")
        return meta, extras

    def save(
        self,
        plan: ShardPlan,
        shards: Mapping[str, np.ndarray],
        extras: Mapping[str, np.ndarray],
        meta: Mapping[str, Any],
        *,
        also: Mapping[str, Any] | None = None,
    ) -> None:
        """Write every shard, the extra arrays and the metadata in one commit; drop arrays no longer saved.

        Shards are sealed one at a time (a view of the module is copied only if it is
        not contiguous). The commit also records the plan, the model version and the
        Merkle root of the parameter shards, which ``fedshard verify --store`` checks, and
        ``also``: other catalog metadata by key, set in the same commit (the site's ledger
        anchor, :class:`~fedshard.site.ledger_anchor.CatalogAnchor`'s key).
        """
        from fedshard.store.model_io import record_model

        faults.point("site.save.begin")
        with self.kept.use(create=True) as store, store.batch():
            store.put_many(shards)
            store.put_many(extras)
            for sid in store.list():
                if sid not in plan and sid not in extras:
                    store.delete(sid)
            store.set_meta(_META, dict(meta))
            for key, value in (also or {}).items():
                store.set_meta(key, value)
            record_model(store, plan, str(meta["version"]))
        faults.point("site.save.end")

    def load(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """Metadata and every array, shards by id (for tools and tests)."""
        from fedshard.sharding import ShardPlan
        from fedshard.store.model_io import read_tensors

        with self.kept.use() as store:
            meta = dict(store.get_meta(_META) or {})
            plan = ShardPlan.from_json(meta["plan"])
            arrays = plan.split(read_tensors(store, self.lookahead))
            arrays.update(store.get_many([sid for sid in store.list() if sid not in arrays]))
        return meta, arrays

    def fingerprint(self) -> object | None:
        """Identity and stamp of every file the store's catalog names (a commit replaces the catalog;
        an altered blob changes its own stamp), from the kept store (:meth:`KeptStore.files_stamp
        <fedshard.store.kept.KeptStore.files_stamp>`); of every file under the folder when the store
        is not kept open (another kind of token: it never equals one taken while kept); None for a
        remote store."""
        if not isinstance(self.root, Path) and "://" in str(self.root):
            return None
        named = self.kept.files_stamp()
        return ("named", named) if named is not None else _tree_token(Path(self.root))


def site_kek(key_file: Path, *, create: bool) -> Kek:
    """The site's key-encryption key from ``key_file`` (created, mode 600, when ``create`` and missing)."""
    from fedshard.crypto.at_rest import generate_kek_file, load_kek

    if create and not key_file.exists():
        key_file.parent.mkdir(parents=True, exist_ok=True)
        return generate_kek_file(key_file)
    return load_kek(key_file)


def stored_module(
    build: Callable[[], torch.nn.Module], tile: tuple[int, int], store: ModelStore
) -> tuple[torch.nn.Module, dict[str, Any]]:
    """The model ``store`` holds: built by ``build`` (as the site builds it), its trained tensors
    decrypted and verified from the store's shards; ``(module, the store's metadata)``."""
    held = HeldModel(build, tile)
    meta, _ = store.load_into(held.plan, held.tensors())
    return held.module(), meta
