"""The one-pass delivery of Flower's simulation engine (fedshard/transports/flower/compat/delivery.py):
each node gets its first undelivered message per tick, in the order stored, and every
stored message is checked once per tick (Flower's scan checked each once per node)."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

from fedshard.transports.flower.compat import delivery


class FakeState:
    """The attributes of ``InMemoryLinkState`` the delivery reads."""

    def __init__(self, messages: list[tuple[str, int]]) -> None:
        self.lock = threading.RLock()
        self.message_ins_store: dict[str, Any] = {
            mid: SimpleNamespace(id=mid, metadata=SimpleNamespace(dst_node_id=node, delivered_at=""))
            for mid, node in messages
        }
        self.checked: list[set[str]] = []

    def _check_stored_messages(self, message_ids: set[str]) -> None:
        self.checked.append(set(message_ids))
        self.message_ins_store.pop("expired", None)  # as Flower deletes an expired message


def test_each_node_gets_its_first_undelivered_message_per_tick() -> None:
    state = FakeState([("a1", 1), ("expired", 2), ("b1", 2), ("a2", 1), ("c1", 3), ("b2", 2)])
    first = delivery.deliverable(state, [1, 2])  # node 3 is not one of the engine's nodes
    assert [m.id for m in first] == ["a1", "b1"]
    assert all(m.metadata.delivered_at for m in first)
    assert state.checked == [{"a1", "expired", "b1", "a2", "c1", "b2"}]  # every message, once
    assert [m.id for m in delivery.deliverable(state, [1, 2])] == ["a2", "b2"]
    assert delivery.deliverable(state, [1, 2]) == []
    assert state.message_ins_store["c1"].metadata.delivered_at == ""


def test_the_installed_flower_is_the_one_the_delivery_was_written_for() -> None:
    from flwr.server.superlink.fleet.vce import vce_api

    assert delivery.problem() is None
    assert delivery.install() and delivery.install()  # once per process, idempotent
    assert vce_api.add_messages_to_queue.__module__ == delivery.__name__
