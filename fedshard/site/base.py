"""A site's frozen base, sealed in its own store and streamed through training (``store.base``).

With ``store.base`` set to a cold format (``int8``, ``fp8``, ``int4``), the first time a
site's process builds its model it seals the model's frozen tensors (see
:func:`~fedshard.task.frozen_state`) into ``<state_dir>/base``, a
:class:`~fedshard.store.sealed_store.SealedShardStore` under the site's key: ``Linear``
and ``Embedding`` weights in the cold format, everything else at full precision
(:func:`~fedshard.store.streamed.seal_base`). It then attaches the store to the model
(:class:`~fedshard.store.streamed.StreamedBase`): those weights leave the module, and
every forward and backward takes them dequantised a few layers ahead of the computation,
from their cold codes read once and held in memory (``store.base_codes: memory``) or
read and decrypted from the store each time (``store``). The base store is separate from the model store
(``<state_dir>/shards``), whose commits replace the federated shards: the base is
written once and only read after.

The base store also records the BLAKE3 digest of every frozen tensor as the task built
it (what the genesis version binds, :meth:`~fedshard.site._model.HeldModel.frozen_digests`).
A later process that builds a different base (the task or its options changed) is
refused with one line instead of training on a stale base; a changed ``store.base``
format reseals the store from the freshly built base.

The base's shards are never released: they are not in the model's shard plan.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from fedshard.errors import StoreError

if TYPE_CHECKING:
    import torch

    from fedshard.crypto.at_rest import Kek
    from fedshard.store.sealed_store import SealedShardStore
    from fedshard.store.streamed import StreamedBase

__all__ = ["BASE_DIR", "SealedBase"]

BASE_DIR = "base"
"""The base store's folder in a site's state folder."""

_DIGESTS = "frozen_digests"  # meta key: the built base's digests, committed with the sealed base
_log = logging.getLogger(__name__)


class SealedBase:
    """Seals a site's frozen base once and streams it into each model the site builds.

    Parameters
    ----------
    root:
        The base store's folder (``<state_dir>/base``) or an fsspec URL.
    kek:
        The site's key-encryption key (the model store's).
    fmt:
        The cold format of the streamed weights: ``int8``, ``fp8`` or ``int4``.
    tile:
        The federation's shard tile.
    lookahead:
        Weights the stream fetches ahead of the one in use.
    codes:
        Where a fetch takes a weight's codes from: ``memory`` or ``store``
        (:class:`~fedshard.store.streamed.Codes`).
    """

    def __init__(
        self, root: str | Path, kek: Kek, fmt: str, tile: tuple[int, int], lookahead: int = 2, *, codes: str = "memory"
    ) -> None:
        from fedshard.store.quantize import ColdFormat
        from fedshard.store.streamed import Codes

        self.root = root
        self.codes = Codes(codes)
        self.kek = kek
        self.format = ColdFormat(fmt)
        self.tile = tile
        self.lookahead = max(lookahead, 1)
        self._store: SealedShardStore | None = None
        self.streamed: StreamedBase | None = None

    def attach(self, module: torch.nn.Module, digests: Mapping[str, str]) -> StreamedBase:
        """Stream ``module``'s frozen base from the store, sealing it there first if needed.

        ``digests``: the built base's ``"frozen:<name>"`` digests. The module's streamed
        weights are dropped from it (they are garbage once the caller lets go of them).

        Raises
        ------
        StoreError
            The store holds another base than the one built, or the module has no frozen tensors.
        """
        from fedshard.store.sealed_store import SealedShardStore
        from fedshard.store.streamed import BASE_META, StreamedBase, seal_base

        self.close()
        store = SealedShardStore.open(self.root, self.kek, create=True)
        try:
            sealed = store.get_meta(BASE_META)
            stored = store.get_meta(_DIGESTS)
            if sealed is not None and stored is not None and dict(stored) != dict(digests):
                raise StoreError(
                    f"the base store {store.location} holds another frozen base than the task builds (the task or "
                    "its options changed); delete that folder to seal the new base, or restore the task"
                )
            if sealed is None or stored is None or sealed.get("format") != self.format.value:
                if sealed is not None:
                    _log.info("resealing the base in %s as %s (was %s)", store.location, self.format, sealed["format"])
                with store.batch():
                    seal_base(module, store, self.format, tile=self.tile)
                    store.set_meta(_DIGESTS, dict(digests))
            self.streamed = StreamedBase(module, store, lookahead=self.lookahead, codes=self.codes)
        except BaseException:
            store.close()
            raise
        self._store = store
        return self.streamed

    def close(self) -> None:
        """Stop streaming and close the store (a later :meth:`attach` reopens it)."""
        if self.streamed is not None:
            self.streamed.close()
            self.streamed = None
        if self._store is not None:
            self._store.close()
            self._store = None
