"""A :class:`~fedshard.runtime.channels.SiteGateway` over Flower's Grid."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from pydantic import BaseModel, ValidationError

from fedshard.errors import RoundError
from fedshard.runtime.flower.records import REPLIES, clean_reason, pack, unpack
from fedshard.runtime.messages import MessageKind, SiteFailure

if TYPE_CHECKING:
    from flwr.serverapp import Grid

__all__ = ["FlowerSiteGateway"]


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
    """

    def __init__(self, grid: Grid, min_nodes: int, wait_s: float = 120.0) -> None:
        self.grid = grid
        self.min_nodes = min_nodes
        self.wait_s = wait_s

    def nodes(self) -> list[str]:
        """Connected node ids (waits until ``min_nodes`` are connected)."""
        deadline = time.monotonic() + self.wait_s
        while True:
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
        """Send one message per node; replies keyed by node id."""
        from flwr.app import Message

        out_messages = [
            Message(content=pack(msg), dst_node_id=int(node), message_type=kind.value) for node, msg in messages.items()
        ]
        results: dict[str, BaseModel | SiteFailure] = {
            node: SiteFailure(reason=f"no reply within {timeout:.0f}s") for node in messages
        }
        for reply in self.grid.send_and_receive(out_messages, timeout=timeout):
            node = str(reply.metadata.src_node_id)
            if reply.has_error():
                results[node] = SiteFailure(reason=clean_reason(reply.error.reason or "unknown error"))
                continue
            try:
                results[node] = unpack(reply, REPLIES[kind])
            except (KeyError, TypeError, ValidationError) as exc:
                results[node] = SiteFailure(reason=f"malformed reply: {exc}")
        return results
