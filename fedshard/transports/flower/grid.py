"""A :class:`~fedshard.protocol.channels.SiteGateway` over Flower's Grid."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from pydantic import BaseModel, ValidationError

from fedshard.errors import RoundError
from fedshard.protocol.messages import MessageKind, SiteFailure
from fedshard.transports.flower.records import REPLIES, clean_reason, pack, unpack

if TYPE_CHECKING:
    from flwr.app import Message
    from flwr.serverapp import Grid

__all__ = ["ENGINE_STOPPED", "FlowerSiteGateway"]

ENGINE_STOPPED = "Flower's simulation engine stopped"
"""How the reason of a run that lost its simulation engine begins."""


class FlowerSiteGateway:
    """Sends fedshard control messages to SuperNodes through a Flower ``Grid``.

    Parameters
    ----------
    grid:
        The Grid the ServerApp's main function receives.
    min_nodes:
        How many nodes to wait for before the first message.
    wait_s:
        How long to wait for them.
    poll_s:
        First pause between pulls for replies (it grows to ``max_poll_s`` while none arrive).
    engine_alive:
        In a simulation, whether Flower's engine still runs: once it has stopped no reply
        can come, so every wait ends at once with a :class:`RoundError` instead of
        running to its timeout (a deployment's SuperLink outlives the ServerApp: None).
    """

    def __init__(
        self,
        grid: Grid,
        min_nodes: int,
        wait_s: float = 120.0,
        poll_s: float = 0.05,
        max_poll_s: float = 0.25,
        engine_alive: Callable[[], bool] | None = None,
    ) -> None:
        self.grid = grid
        self.min_nodes = min_nodes
        self.wait_s = wait_s
        self.poll_s = poll_s
        self.max_poll_s = max_poll_s
        self.engine_alive = engine_alive

    def _check_engine(self) -> None:
        if self.engine_alive is not None and not self.engine_alive():
            raise RoundError(f"{ENGINE_STOPPED}: no site can answer (see the log above for why)")

    def nodes(self) -> list[str]:
        """Connected node ids (waits until ``min_nodes`` are connected)."""
        deadline = time.monotonic() + self.wait_s
        while True:
            self._check_engine()
            ids = [str(n) for n in self.grid.get_node_ids()]
            if len(ids) >= self.min_nodes:
                return ids
            if time.monotonic() > deadline:
                raise RoundError(
                    f"only {len(ids)} site(s) connected after {self.wait_s:.0f}s, need {self.min_nodes}; "
                    "are the SuperNodes running and pointed at this SuperLink?"
                )
            time.sleep(0.1)

    def send(
        self, kind: MessageKind, messages: Mapping[str, BaseModel], timeout: float
    ) -> dict[str, BaseModel | SiteFailure]:
        """Send one message per node; replies keyed by node id.

        Pushes all messages, then pulls replies with a short, growing poll interval
        (Flower's ``send_and_receive`` sleeps 3 s between pulls, which would add up to
        3 s to every message of every round). Replies are matched to nodes by the id of
        the message they answer: an error reply the SuperLink writes itself (the node went
        offline) comes from the SuperLink's own node id, not the site's.
        """
        from flwr.app import Message

        out = {
            node: Message(content=pack(msg), dst_node_id=int(node), message_type=kind.value)
            for node, msg in messages.items()
        }
        results: dict[str, BaseModel | SiteFailure] = {
            node: SiteFailure(reason=f"no reply within {timeout:.0f}s") for node in messages
        }
        pushed = list(self.grid.push_messages(list(out.values())))
        node_of = {msg.metadata.message_id: node for node, msg in out.items()}
        node_of.update({mid: node for mid, node in zip(pushed, out, strict=False) if mid})
        pending = {mid for mid in pushed if mid}
        deadline = time.monotonic() + timeout
        pause = self.poll_s
        while pending and time.monotonic() < deadline:
            self._check_engine()
            replies = list(self.grid.pull_messages(pending))
            for reply in replies:
                answered = reply.metadata.reply_to_message_id
                pending.discard(answered)
                node = node_of.get(answered)
                if node is not None:
                    results[node] = self._read(kind, reply)
            if pending:
                time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
                pause = self.poll_s if replies else min(pause * 1.5, self.max_poll_s)
        return results

    @staticmethod
    def _read(kind: MessageKind, reply: Message) -> BaseModel | SiteFailure:
        if reply.has_error():
            return SiteFailure(reason=clean_reason(reply.error.reason or "unknown error"))
        try:
            return unpack(reply, REPLIES[kind])
        except (KeyError, TypeError, ValidationError) as exc:
            return SiteFailure(reason=f"malformed reply: {exc}")
