"""On-prem and zone-side shard storage.

* :class:`LocalShardStore`: named ``.npz`` snapshots (what the Site and zones use today).
* :class:`ShardStore` (protocol) and :class:`SealedShardStore`: the site's encrypted
  shard store, on a :class:`Backend` (a local folder by default, or any fsspec URL),
  with hot/cold tiering (:mod:`~fedshard.store.quantize`, :mod:`~fedshard.store.tiering`),
  resumable key rotation (:mod:`~fedshard.store.rotation`), a prefetching layer-by-layer
  loader (:mod:`~fedshard.store.prefetch`), whole-store checks (:mod:`~fedshard.store.verify`)
  and a frozen base streamed from the store into training (:mod:`~fedshard.store.streamed`).

Only :class:`LocalShardStore` is imported eagerly: every Flower message starts a fresh
ClientApp process that imports this package, and the sealed store pulls in
cryptography; the other names load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedshard._surface import lazy_surface
from fedshard.store._local import LocalShardStore

if TYPE_CHECKING:
    from fedshard.store._backend import Backend, ObjectStat
    from fedshard.store._fsspec_backend import FsspecBackend
    from fedshard.store._protocol import ShardStat, ShardStore, Tier
    from fedshard.store.local_dir import LocalDirBackend
    from fedshard.store.location import backend_for
    from fedshard.store.model_io import LoadReport, ModelRecord, load_module, record_model, write_tensors
    from fedshard.store.prefetch import Layer, PrefetchLoader, layers_of
    from fedshard.store.quantize import ColdFormat
    from fedshard.store.rotation import RotationReport, rotate_keys
    from fedshard.store.sealed_store import SealedShardStore
    from fedshard.store.streamed import Codes, StreamedBase, seal_base
    from fedshard.store.tiering import StoreStats, TierReport, parse_age
    from fedshard.store.verify import VerifyReport, check_store

__all__ = [
    "Backend",
    "Codes",
    "ColdFormat",
    "FsspecBackend",
    "Layer",
    "LoadReport",
    "LocalDirBackend",
    "LocalShardStore",
    "ModelRecord",
    "ObjectStat",
    "PrefetchLoader",
    "RotationReport",
    "SealedShardStore",
    "ShardStat",
    "ShardStore",
    "StoreStats",
    "StreamedBase",
    "Tier",
    "TierReport",
    "VerifyReport",
    "backend_for",
    "check_store",
    "layers_of",
    "load_module",
    "parse_age",
    "record_model",
    "rotate_keys",
    "seal_base",
    "write_tensors",
]

_HOME = {
    "Backend": "_backend",
    "ObjectStat": "_backend",
    "backend_for": "location",
    "FsspecBackend": "_fsspec_backend",
    "LocalDirBackend": "local_dir",
    "LoadReport": "model_io",
    "ModelRecord": "model_io",
    "load_module": "model_io",
    "record_model": "model_io",
    "write_tensors": "model_io",
    "Layer": "prefetch",
    "PrefetchLoader": "prefetch",
    "layers_of": "prefetch",
    "ShardStat": "_protocol",
    "ShardStore": "_protocol",
    "Tier": "_protocol",
    "ColdFormat": "quantize",
    "RotationReport": "rotation",
    "rotate_keys": "rotation",
    "SealedShardStore": "sealed_store",
    "Codes": "streamed",
    "StreamedBase": "streamed",
    "seal_base": "streamed",
    "StoreStats": "tiering",
    "TierReport": "tiering",
    "parse_age": "tiering",
    "VerifyReport": "verify",
    "check_store": "verify",
}


__getattr__ = lazy_surface(__name__, _HOME)
