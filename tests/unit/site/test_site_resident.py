"""The record that a site's held model is its store's (:class:`fedshard.site._resident.HeldState`)."""

from __future__ import annotations

from fedshard.site._apply import ModelState
from fedshard.site._resident import HeldState


class _Store:
    """A model store reduced to its fingerprint (what HeldState asks of it), counting the looks."""

    def __init__(self) -> None:
        self.token = 0
        self.looks = 0

    def fingerprint(self) -> object:
        self.looks += 1
        return self.token


def test_a_store_changed_while_the_record_was_out_is_read_again_at_the_next_message() -> None:
    """Putting the held values back records the same record without looking at the store; the next
    message's look compares it with the store then, so a change made meanwhile (during training) is seen."""
    store = _Store()
    held = HeldState(lambda: store)  # type: ignore[arg-type, return-value]
    state = ModelState("v1", "g", 0)
    held.hold(state)
    record = held.release()  # a task is about to use the held values
    store.token = 1  # the store is written behind the site's back meanwhile
    looks = store.looks
    held.restore(record)
    assert store.looks == looks  # no look at the store to put the record back
    assert held.current(held.release()) is None  # the next message reads the store again
    store.token = 2
    held.hold(state)
    record = held.release()
    held.restore(record)  # nothing changed meanwhile: the next message keeps the held model
    again = held.current(held.release())
    assert again is not None and again.version == "v1"
