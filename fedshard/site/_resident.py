"""Whether the model a site holds is the one in its store, so a message can skip the refill.

A long-lived process (the in-process engine, a simulation actor) handles many messages
of a site; each used to refill the held model from the store, verifying every shard.
:class:`HeldState` records, after the site saved or read its store, the store's
fingerprint (:meth:`~fedshard.site.model_store.ModelStore.fingerprint`: every store
file's identity and stamp) and the model state at that point. While the fingerprint is
unchanged the held values are the stored ones; a store changed behind the site's back
(restored, edited, tampered with) changes it, and the next message reads and verifies
the store again. Whatever is about to change the held values first :meth:`~HeldState.release` s
the record; only a save, a read, or putting back the values a task was given
(:meth:`~HeldState.restore`) records it again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from fedshard.site._apply import ModelState
from fedshard.site.ledger_anchor import Anchor, AnchorStore
from fedshard.site.model_store import ModelStore

__all__ = ["RESIDENT_COPY_BYTES", "HeldState", "OwnWrites", "PendingSave"]

RESIDENT_COPY_BYTES = 64 << 20
"""Models up to this size are copied to be put back after a task used them; larger ones are
read from the store again by the next message (a copy of a large model costs its memory)."""

Record = tuple[object, ModelState]
"""(store fingerprint, model state) at the moment the held values were the store's."""


class HeldState:
    """The record that a site's held model is its store's (see the module docstring).

    ``store`` is asked for each time (a site's store may be replaced, e.g. by a test's wrapper).
    """

    def __init__(self, store: Callable[[], ModelStore]) -> None:
        self._store = store
        self._record: Record | None = None

    def hold(self, state: ModelState) -> None:
        """The held values are the store's now, at ``state``."""
        fingerprint = self._store().fingerprint()
        self._record = None if fingerprint is None else (fingerprint, _copy_state(state))

    def release(self) -> Record | None:
        """Forget the record (the held values are about to change); what it was."""
        record, self._record = self._record, None
        return record

    def current(self, record: Record | None) -> ModelState | None:
        """A copy of ``record``'s state if the store still matches it; else None."""
        if record is None or record[0] != self._store().fingerprint():
            return None
        return _copy_state(record[1])

    def restore(self, record: Record | None) -> None:
        """The held values were put back as they were at ``record``: record it again. Its fingerprint
        is the store's when it was taken, and whoever uses it next compares that with the store's
        then (:meth:`current`, :meth:`around`), so a store changed meanwhile is still read again;
        checking here too would only cost a look at every store file."""
        if record is not None:
            self._record = record

    def around(self, write: Callable[[], None]) -> None:
        """Run ``write``, the site's own change to its store's metadata: if the held model was the
        store's before, it still is after (the shards did not change)."""
        record = self._record
        held = record is not None and record[0] == self._store().fingerprint()
        write()
        if held and record is not None and self._record is record:
            self.hold(record[1])


class PendingSave:
    """A model a train message caught up to, not saved yet: the site's next ledger anchor write
    saves it in the same store commit (:class:`OwnWrites`), or :meth:`flush` does.

    A private round used to commit its store twice before it trained: the caught-up model, then
    the anchor of the round's reservation. Saving the model with the anchor makes it one commit;
    the model is still durable before anything derived from it is released, and a crash before
    that commit leaves the store at the model before (caught up again by the next message) and
    the ledger ahead of its anchor (allowed: nothing was released). The price: a commit that fails
    (a disk error) now fails after the reservation, whose cost then stays spent, as for any
    reservation that released nothing.

    ``save(state, anchor)`` saves the held model at ``state``, recording ``anchor`` too when given.
    """

    def __init__(self, save: Callable[[ModelState, Anchor | None], None]) -> None:
        self._save = save
        self._state: ModelState | None = None

    def put(self, state: ModelState) -> None:
        """The held model is at ``state``, ahead of the store: save it with the next anchor, or at :meth:`flush`."""
        self._state = state

    def drop(self) -> None:
        """Forget the pending model unsaved (the held model's record is released, so the next message
        reads the store again)."""
        self._state = None

    def flush(self, anchor: Anchor | None = None) -> bool:
        """Save the pending model (with ``anchor``); False if none was pending (then nothing is written)."""
        state, self._state = self._state, None
        if state is None:
            return False
        self._save(state, anchor)
        return True


class OwnWrites:
    """A site's ledger anchor, written into its own store's catalog through :meth:`HeldState.around`,
    or with the model of a :class:`PendingSave` when one is pending."""

    def __init__(self, inner: AnchorStore, held: HeldState, pending: PendingSave) -> None:
        self._inner = inner
        self._held = held
        self._pending = pending

    def read(self) -> Anchor | None:
        """See :class:`~fedshard.site.ledger_anchor.AnchorStore`."""
        return self._inner.read()

    def write(self, anchor: Anchor) -> None:
        """See :class:`~fedshard.site.ledger_anchor.AnchorStore`."""
        if not self._pending.flush(anchor):
            self.write_alone(anchor)

    def write_alone(self, anchor: Anchor) -> None:
        """Write ``anchor`` in a commit of its own."""
        self._held.around(lambda: self._inner.write(anchor))

    @property
    def inner(self) -> AnchorStore:
        """Where the anchor is kept."""
        return self._inner


def _copy_state(state: ModelState) -> ModelState:
    """A copy that applying rounds to cannot change (the optimiser's arrays are updated in place)."""
    return dataclasses.replace(state, optimizer={k: v.copy() for k, v in state.optimizer.items()})
