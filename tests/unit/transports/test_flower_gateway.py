"""FlowerSiteGateway over a fake Grid: replies matched to sites by the message they answer."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
from flwr.app import Error, Message
from flwr.supercore.task_identity import TaskIdentity

from fedshard.coordinator.events import EventLog
from fedshard.errors import RoundError
from fedshard.protocol.messages import MessageKind, QueryRequest, SiteFailure, SiteInfo
from fedshard.simulate._flower import _engine_failed
from fedshard.transports.flower.grid import ENGINE_STOPPED, FlowerSiteGateway
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


def test_a_stopped_engine_ends_the_wait_for_replies_at_once() -> None:
    """Node 13 never answers: with the engine gone the gateway raises instead of polling to its timeout."""
    grid = FakeGrid()
    alive = iter([True, True])  # two pulls, then the engine has stopped
    gateway = FlowerSiteGateway(  # type: ignore[arg-type]
        grid, min_nodes=3, poll_s=0.001, engine_alive=lambda: next(alive, False)
    )
    with pytest.raises(RoundError, match=f"^{ENGINE_STOPPED}"):
        gateway.send(MessageKind.QUERY, {"11": QueryRequest(), "13": QueryRequest()}, timeout=3600)
    assert grid.pulls == 2


def test_a_stopped_engine_ends_the_wait_for_nodes() -> None:
    class NoNodes(FakeGrid):
        def get_node_ids(self) -> list[int]:
            return []

    gateway = FlowerSiteGateway(NoNodes(), min_nodes=3, wait_s=3600, engine_alive=lambda: False)  # type: ignore[arg-type]
    with pytest.raises(RoundError, match=f"^{ENGINE_STOPPED}"):
        gateway.nodes()


def test_a_run_that_lost_its_engine_before_its_sites_answered_is_retried(tmp_path: Path) -> None:
    events = EventLog(tmp_path / "events.jsonl")
    assert _engine_failed(events, 0)  # nothing logged: the engine never got the ServerApp going
    events.on_stop(f"{ENGINE_STOPPED}: no site can answer")
    assert _engine_failed(events, 0)
    offset = events.path.stat().st_size
    events.on_stop("only 1 site(s) connected after 5s, need 3")  # a real failure: not retried
    assert not _engine_failed(events, offset)
    offset = events.path.stat().st_size
    events.on_start([_info("site-a")], rounds=2, genesis_version="g")
    events.on_stop(f"{ENGINE_STOPPED}: no site can answer")  # lost mid-run: the run is not repeated
    assert not _engine_failed(events, offset)
