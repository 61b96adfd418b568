"""A node is bound to one site id: it proves it with its site's signing key over a fresh
challenge (or, without keys, the first node per id is kept); every other claim is refused
in one line and the federation goes on."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedshard.config import FederationConfig
from fedshard.coordinator.binding import bind_nodes
from fedshard.coordinator.coordinator import Coordinator
from fedshard.coordinator.events import EventLog, replay
from fedshard.crypto.signing import public_key_bytes
from fedshard.errors import RefusalCode
from fedshard.protocol.binding import binding_payload, new_challenge, proves, with_proof
from fedshard.protocol.messages import MessageKind, QueryRequest, SiteInfo
from fedshard.sharding import ShardPlan

PLAN = ShardPlan.from_state_dict({"w": np.zeros((2, 2), "float32")}, (2, 2))
CONFIG = FederationConfig.model_validate(
    {
        "federation": {"name": "bind", "rounds": 1, "min_sites": 1},
        "task": {"target": "tests.toy_task:task"},
        "zones": [{"name": "z", "region": "EU"}],
        "sites": [{"id": "a", "jurisdiction": "EU"}, {"id": "b", "jurisdiction": "US"}],
    }
)
KEYS = {site: Ed25519PrivateKey.generate() for site in ("a", "b")}
PUBLIC = {site: public_key_bytes(key) for site, key in KEYS.items()}


def _info(site: str, jurisdiction: str = "", **update: Any) -> SiteInfo:
    info = SiteInfo(
        site_id=site,
        jurisdiction=jurisdiction or CONFIG.site(site).jurisdiction,
        num_examples=10,
        plan_digest=PLAN.digest,
        plan_json=PLAN.to_json(),
        genesis_version="g" * 64,
        version="g" * 64,
    )
    return info.model_copy(update=update)


def _proven(site: str, challenge: str, key: Ed25519PrivateKey | None = None, **update: Any) -> SiteInfo:
    return with_proof(_info(site, **update), challenge, key or KEYS[site])


def test_a_proof_binds_the_challenge_the_site_and_what_it_starts_from() -> None:
    challenge = new_challenge()
    info = _proven("a", challenge)
    assert proves(info, challenge, PUBLIC["a"])
    assert not proves(info, new_challenge(), PUBLIC["a"])  # replayed to another query
    assert not proves(info, challenge, PUBLIC["b"])  # another site's key
    for change in ({"site_id": "b"}, {"jurisdiction": "US"}, {"genesis_version": "h" * 64}, {"proof": "zz"}):
        assert not proves(info.model_copy(update=change), challenge, PUBLIC["a"])
    assert binding_payload(challenge, info).startswith(b"fedshard node binding v1\n")  # never a manifest's bytes
    assert with_proof(_info("a"), "", KEYS["a"]).proof == "" and with_proof(_info("a"), challenge, None).proof == ""


def test_every_false_claim_is_refused_with_its_code_and_the_honest_nodes_are_bound() -> None:
    nodes = ["n-a", "n-b", "x-replay", "x-nokey", "x-stranger", "x-eu-b", "x-dup", "x-plan", "x-count", "x-mute"]
    challenges = {n: new_challenge() for n in nodes}
    old = new_challenge()
    mallory = Ed25519PrivateKey.generate()
    replies: dict[str, Any] = {
        "n-a": _proven("a", challenges["n-a"]),
        "n-b": _proven("b", challenges["n-b"]),
        "x-replay": _proven("a", old),  # a proof captured from an earlier query
        "x-nokey": _proven("a", challenges["x-nokey"], mallory),  # signed, by another key
        "x-stranger": _proven("a", challenges["x-stranger"], site_id="$\\evil$"),
        "x-eu-b": _proven("b", challenges["x-eu-b"], jurisdiction="EU"),
        "x-dup": _proven("a", challenges["x-dup"]),  # holds a's key too: a's id is taken by n-a
        "x-plan": _proven("b", challenges["x-plan"], plan_json="{}"),
        "x-count": _proven("b", challenges["x-count"], num_examples=10**15),
        "x-mute": "no reply within 60s",
    }
    bound = bind_nodes(replies, challenges, CONFIG, PUBLIC)
    assert {n: i.site_id for n, i in bound.infos.items()} == {"n-a": "a", "n-b": "b"}
    codes = {r.node: r.code for r in bound.refused}
    assert codes == {
        "x-replay": RefusalCode.SIGNATURE,
        "x-nokey": RefusalCode.SIGNATURE,
        "x-stranger": RefusalCode.MEMBER,
        "x-eu-b": RefusalCode.IDENTITY,
        "x-dup": RefusalCode.DUPLICATE,
        "x-plan": RefusalCode.DUPLICATE,  # b's key, but b is bound (a plan or a count is checked after)
        "x-count": RefusalCode.DUPLICATE,
    }
    assert all("\n" not in r.reason for r in bound.refused) and bound.silent == {"x-mute": "no reply within 60s"}


def test_a_site_without_a_public_key_cannot_be_bound() -> None:
    challenge = new_challenge()
    bound = bind_nodes({"n": _proven("b", challenge)}, {"n": challenge}, CONFIG, {"a": PUBLIC["a"]})
    assert not bound.infos and bound.refused[0].code is RefusalCode.IDENTITY and "b.pub" in bound.refused[0].reason


def test_without_keys_the_first_node_per_site_id_is_kept() -> None:
    replies = {"n2": _info("a"), "n1": _info("a"), "n3": _info("b"), "n4": _info("a", plan_json="{}")}
    bound = bind_nodes(replies, {}, CONFIG, None)
    assert {n: i.site_id for n, i in bound.infos.items()} == {"n1": "a", "n3": "b"}
    assert {r.node: r.code for r in bound.refused} == {"n2": RefusalCode.DUPLICATE, "n4": RefusalCode.DUPLICATE}
    taken = bind_nodes({"n9": _info("b")}, {}, CONFIG, None, taken={"b": "n3"})
    assert taken.refused[0].code is RefusalCode.DUPLICATE and "node n3" in taken.refused[0].reason


def test_a_plan_that_is_not_its_digest_is_refused() -> None:
    bound = bind_nodes({"n": _info("a", plan_json=PLAN.to_json() + " ")}, {}, CONFIG, None)
    assert bound.refused[0].code is RefusalCode.PLAN


class TwoOfOneId:
    """Three nodes: site a, an impostor of a (no key), site b; only queries are answered."""

    def nodes(self) -> list[str]:
        return ["a-real", "a-fake", "b"]

    def send(self, kind: MessageKind, messages: dict[str, QueryRequest], timeout: float) -> dict[str, Any]:
        assert kind is MessageKind.QUERY
        challenges = {n: m.challenge for n, m in messages.items()}
        assert len(set(challenges.values())) == 3 and all(len(c) == 64 for c in challenges.values())
        return {
            "a-real": _proven("a", challenges["a-real"]),
            "a-fake": _info("a"),
            "b": _proven("b", challenges["b"]),
        }


def test_the_coordinator_binds_each_node_records_the_refusals_and_goes_on(tmp_path: Any) -> None:
    journal = EventLog(tmp_path / "events.jsonl")
    coordinator = Coordinator(CONFIG, TwoOfOneId(), {}, {}, journal=journal, site_keys=lambda: PUBLIC)  # type: ignore[arg-type]
    result = coordinator.discover()
    assert [s.site_id for s in result.sites] == ["a", "b"]
    assert result.refused_nodes == [
        {"node": "a-fake", "site_id": "a", "code": "signature", "reason": result.refused_nodes[0]["reason"]}
    ]
    journal.on_start(result.sites, 1, result.genesis_version)
    coordinator._journal_refusals(1)
    assert replay(journal.path).refused_nodes[0]["node"] == "a-fake"


@pytest.mark.parametrize("claimed", [-1, 0, 10**12])
def test_record_counts_within_bounds_are_taken(claimed: int) -> None:
    challenge = new_challenge()
    bound = bind_nodes({"n": _proven("a", challenge, num_examples=claimed)}, {"n": challenge}, CONFIG, PUBLIC)
    assert bool(bound.infos) == (claimed >= 0)
