"""FlowerSiteGateway over a fake Grid: replies matched to sites by the message they answer."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator

import pytest
from flwr.app import Error, Message
from flwr.supercore.task_identity import TaskIdentity

from fedshard.protocol.messages import MessageKind, QueryRequest, SiteFailure, SiteInfo
from fedshard.transports.flower.grid import FlowerSiteGateway
from fedshard.transports.flower.records import pack

SUPERLINK_NODE_ID = 1  # the node id of replies the SuperLink writes itself


@pytest.fixture(autouse=True)
def _task_identity() -> Iterator[None]:
    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 3, 7, SUPERLINK_NODE_ID
    yield
    TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved


def _info(site: str) -> SiteInfo:
    return SiteInfo(
        site_id=site, jurisdiction="EU", num_examples=10, plan_digest="p", genesis_version="g", plan_json="{}"
    )


class FakeGrid:
    """Answers node 11 with a SiteInfo on the first pull; node 12 with the SuperLink's
    'node unavailable' error on the second; node 13 never."""

    def __init__(self) -> None:
        self.sent: dict[str, Message] = {}
        self.pulls = 0

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        ids = []
        for msg in messages:
            mid = uuid.uuid4().hex
            msg.metadata.__dict__["_message_id"] = mid
            self.sent[mid] = msg
            ids.append(mid)
        return ids

    def pull_messages(self, ids: Iterable[str]) -> list[Message]:
        self.pulls += 1
        out = []
        for mid in ids:
            msg = self.sent[mid]
            if msg.metadata.dst_node_id == 11 and self.pulls == 1:
                out.append(Message(content=pack(_info("site-a")), reply_to=msg))
            elif msg.metadata.dst_node_id == 12 and self.pulls == 2:
                out.append(Message(Error(code=0, reason="Error: Node Unavailable"), reply_to=msg))
        return out


def test_replies_and_superlink_errors_reach_the_right_site() -> None:
    grid = FakeGrid()
    gateway = FlowerSiteGateway(grid, min_nodes=3, poll_s=0.001)  # type: ignore[arg-type]
    query = QueryRequest()
    replies = gateway.send(MessageKind.QUERY, {"11": query, "12": query, "13": query}, timeout=0.5)
    assert set(replies) == {"11", "12", "13"}
    assert isinstance(replies["11"], SiteInfo) and replies["11"].site_id == "site-a"
    assert isinstance(replies["12"], SiteFailure) and "Node Unavailable" in replies["12"].reason
    assert isinstance(replies["13"], SiteFailure) and "no reply within" in replies["13"].reason
    assert grid.pulls >= 3  # kept polling for node 13 until the timeout
