"""The coordinator asks nodes that connect mid-run who they are: once for a node that answers
and may not join, a few times (JOIN_QUERIES) for one that never answers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedshard.config import load_federation
from fedshard.coordinator.coordinator import JOIN_QUERIES, Coordinator
from fedshard.protocol.messages import SiteInfo

ROOT = Path(__file__).resolve().parents[3]


class Gateway:
    """Two connected nodes: ``stranger`` answers as a site the config does not list, ``mute`` never answers."""

    def __init__(self) -> None:
        self.asked: list[list[str]] = []

    def nodes(self) -> list[str]:
        return ["mute", "stranger"]

    def send(self, kind: Any, messages: dict[str, Any], timeout: float) -> dict[str, Any]:
        self.asked.append(sorted(messages))
        info = SiteInfo(
            site_id="not-in-config",
            jurisdiction="EU",
            num_examples=1,
            plan_digest="p",
            plan_json="{}",
            genesis_version="0" * 64,
            version="0" * 64,
            applied_round=0,
        )
        return {"stranger": info} if "stranger" in messages else {}


def test_nodes_that_may_not_join_are_not_asked_every_round() -> None:
    gateway = Gateway()
    coordinator = Coordinator(load_federation(ROOT / "configs" / "demo.yaml"), gateway, {}, {})  # type: ignore[arg-type]
    for _ in range(JOIN_QUERIES + 2):
        assert coordinator._join() == []
    assert gateway.asked == [["mute", "stranger"]] + [["mute"]] * (JOIN_QUERIES - 1)
