"""Flower's simulation engine hands messages to its actors in one pass per tick, not one per node.

Flower 1.42's simulation engine feeds its actors from a thread
(``flwr.server.superlink.fleet.vce.vce_api.add_messages_to_queue``) that, every 0.1 s,
asks the link state for each node's next message:
``InMemoryLinkState.get_message_ins(node_id, limit=1)`` walks every stored message and
checks each one (time to live, federation membership) on every call. That is nodes ×
messages checks per tick, under the state's lock, which the ServerApp's pushes and
pulls wait for too: at 1000 sites a tick takes seconds and the engine's round time
grows with the square of the number of sites (measured: ``bench/scale.py``; plain
Flower's own simulation pays it as well).

:func:`install` replaces that thread's function with one that, per tick, checks every
stored message once (Flower's own ``_check_stored_messages``, so expired messages and
messages of nodes that left are deleted as before) and delivers the first undelivered
message of each node, as ``limit=1`` per node did; what a node receives, and in which
order, is unchanged. It relies on these internals of Flower 1.42, checked by
:func:`problem` before anything is replaced (any difference leaves Flower's function in
place, with one log line):

* ``vce_api.add_messages_to_queue(state, queue, nodes_mapping, f_stop)``, looked up by
  ``run_api`` when it starts its threads;
* ``InMemoryLinkState``: ``lock`` (re-entrant), ``message_ins_store`` (message id →
  message, in the order stored), ``_check_stored_messages(ids)``;
* a message's ``metadata.dst_node_id`` and ``metadata.delivered_at`` (``""`` until
  delivered; set to ``flwr.supercore.date.now().isoformat()``).
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Iterable
from queue import Queue
from types import SimpleNamespace
from typing import Any

from fedshard.transports.flower.compat._release import release_problem

__all__ = ["install", "problem"]

log = logging.getLogger(__name__)

_TICK_S = 0.1
"""How often the engine looks for messages to deliver (Flower's own interval)."""

_installed = threading.Lock()


def problem() -> str | None:
    """Why the one-pass delivery cannot replace Flower's on the installed release; None when it can."""
    try:
        from flwr.server.superlink.fleet.vce import vce_api
        from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState
    except ImportError as exc:
        return f"Flower's simulation engine did not import ({exc})"
    wrong = release_problem("the one-pass delivery")
    if wrong is not None:
        return wrong
    stock = getattr(vce_api, "add_messages_to_queue", None)
    if stock is None or list(inspect.signature(stock).parameters) != ["state", "queue", "nodes_mapping", "f_stop"]:
        return "vce_api.add_messages_to_queue is not the function it was"
    try:  # by behaviour: a state built as the engine builds it keeps its messages in a dict under an RLock
        state = InMemoryLinkState(SimpleNamespace(), SimpleNamespace())  # type: ignore[arg-type]
        keeps = isinstance(state.message_ins_store, dict) and isinstance(state.lock, type(threading.RLock()))
    except (AttributeError, TypeError, ValueError):
        keeps = False
    if not keeps:
        return "InMemoryLinkState no longer keeps message_ins_store and a re-entrant lock"
    if list(inspect.signature(InMemoryLinkState._check_stored_messages).parameters)[:2] != ["self", "message_ids"]:
        return "InMemoryLinkState._check_stored_messages is not the method it was"
    return None


def install() -> bool:
    """Replace the engine's delivery thread function (once per process); whether it is replaced."""
    from flwr.server.superlink.fleet.vce import vce_api

    with _installed:
        if getattr(vce_api.add_messages_to_queue, "__module__", "") == __name__:
            return True
        why = problem()
        if why is not None:
            log.info("Flower's simulation engine delivers messages its own way (%s)", why)
            return False
        stock = vce_api.add_messages_to_queue

        def add_messages_to_queue(state: Any, queue: Queue[Any], nodes_mapping: Any, f_stop: threading.Event) -> None:
            from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState

            if not isinstance(state, InMemoryLinkState):  # another state: Flower's own loop
                stock(state, queue, nodes_mapping, f_stop)
                return
            nodes = set(nodes_mapping.keys())
            while not f_stop.is_set():
                for message in deliverable(state, nodes):
                    queue.put(message)
                f_stop.wait(_TICK_S)

        add_messages_to_queue.__module__ = __name__
        vce_api.add_messages_to_queue = add_messages_to_queue
        return True


def deliverable(state: Any, nodes: Iterable[int]) -> list[Any]:
    """The first undelivered message of each of ``nodes`` in ``state`` (an ``InMemoryLinkState``),
    marked delivered, in the order they were stored; every stored message checked once."""
    from flwr.supercore.date import now

    wanted = set(nodes)
    batch: list[Any] = []
    with state.lock:
        ids = list(state.message_ins_store.keys())
        state._check_stored_messages(set(ids))  # expired or orphaned messages go, as in Flower's scan
        served: set[int] = set()
        for msg_id in ids:
            message = state.message_ins_store.get(msg_id)
            if message is None:
                continue
            metadata = message.metadata
            node = metadata.dst_node_id
            if node in served or node not in wanted or metadata.delivered_at != "":
                continue
            served.add(node)
            batch.append(message)
        delivered_at = now().isoformat()
        for message in batch:
            message.metadata.delivered_at = delivered_at
    return batch
