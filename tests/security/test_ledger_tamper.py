"""Issue 13, items 5 and 6: a site's privacy ledger cannot be silently deleted, rolled back or edited.

A real federation spends its budget (``simulate``); then each attack is played on a copy of
its state against real sites (assembled as the simulation assembles them, pushing to real
gRPC zones): the attacked site must release nothing and say why in one line, while an
honest site of the same federation still pushes. The crash-safety half (a SIGKILL between
reserve and commit counts as spent) is
``tests/integration/test_privacy_rounds.py::test_a_site_killed_between_reserve_and_commit_counts_the_round_as_spent``.
"""

from __future__ import annotations

import shutil
import struct
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from fedshard.assembly import STORE_KEYS_DIR, grpc_connector, make_site, running_zones
from fedshard.cli._budget import recover_ledger
from fedshard.config import FederationConfig
from fedshard.coordinator.coordinator import Coordinator
from fedshard.deploy.host_lock import SITE_LOCK_FILE, holding
from fedshard.errors import DeployError, StoreError
from fedshard.privacy.ledger import PrivacyLedger
from fedshard.protocol.channels import ZoneClient
from fedshard.protocol.messages import LedgerHeadReport, QueryRequest, TrainInstruction, TrainReport
from fedshard.protocol.rounds import RoundSpec
from fedshard.simulate.run import simulate
from fedshard.site.model_store import site_kek
from fedshard.site.privacy import LEDGER_FILE, ledger_key
from fedshard.site.site import Site
from fedshard.transports.inprocess import InProcessSiteGateway
from tests.toy_federations import dp_toy

SMALL, HONEST = "small", "big-a"


def _config() -> FederationConfig:
    return dp_toy("dp-tamper")


@pytest.fixture(scope="module")
def spent(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A federation after six rounds: ``small`` has spent its budget, the others have not."""
    root = tmp_path_factory.mktemp("spent")
    summary = simulate(_config(), root)
    small = next(s for s in summary["sites"] if s["id"] == SMALL)
    assert small["status"] == "exhausted" and small["epsilon_spent"] <= 3.0
    return root


@pytest.fixture
def root(spent: Path, tmp_path: Path) -> Path:
    """A copy of the spent federation's state, for one attack."""
    copy = tmp_path / "run"
    shutil.copytree(spent, copy)
    return copy


class Recorder:
    """Zone clients that remember every push a site made."""

    def __init__(self) -> None:
        self.pushes: list[str] = []

    def __call__(self, name: str, endpoint: str) -> ZoneClient:
        client = grpc_connector(name, endpoint)
        recorder = self

        class Recording:
            def __getattr__(self, attr: str) -> Any:
                if attr == "push":
                    recorder.pushes.append(name)
                return getattr(client, attr)

        return Recording()  # type: ignore[return-value]


class Federation:
    """Real sites on the copied state, and a real zone, driven round by round."""

    def __init__(self, root: Path, endpoints: Mapping[str, str]) -> None:
        self.root, self.config, self.endpoints = root, _config(), dict(endpoints)
        self.recorder = Recorder()
        self.round = 100
        self.sites: dict[str, Site] = {}

    def site(self, site_id: str) -> Site:
        """The site as a fresh process assembles it (its model and ledger read from disk)."""
        return make_site(self.config, site_id, self.root / "sites", connect=self.recorder)

    def train(self, site_id: str, ledger_head: LedgerHeadReport | None = None) -> TrainReport:
        """One round for ``site_id`` alone: open it at the zone, send the train instruction; then the site
        closes, as its process would stop (its ledger left in one file)."""
        site = self.site(site_id)
        try:
            return self._train(site, site_id, ledger_head)
        finally:
            site.close()

    def _train(self, site: Site, site_id: str, ledger_head: LedgerHeadReport | None) -> TrainReport:
        plan = Coordinator(self.config, InProcessSiteGateway({site_id: site}), {}, self.endpoints)._privacy_plan(
            site_id
        )
        info = site.query(QueryRequest())
        self.round += 1
        spec = RoundSpec(self.round, "t", info.plan_json, info.version, (site_id,))
        grpc_connector("z1", self.endpoints["z1"]).open_round(spec)
        before = len(self.recorder.pushes)
        report = site.train(
            TrainInstruction(
                round=self.round,
                token="t",
                base_version=info.version,
                missed=[],
                zones=self.endpoints,
                epochs=1,
                batch_size=10,
                learning_rate=0.05,
                seed=1,
                privacy=plan,
                ledger_head=ledger_head,
            )
        )
        if not report.ok:  # a refusal pushed nothing: not one frame reached a zone
            assert len(self.recorder.pushes) == before and not report.pushes
        else:
            assert len(self.recorder.pushes) > before and report.pushes
        return report


@pytest.fixture
def federation(root: Path) -> Iterator[Federation]:
    config = _config()
    with running_zones(config, root / "zones-again") as endpoints:
        yield Federation(root, endpoints)


def _ledger(root: Path, site_id: str) -> PrivacyLedger:
    key = ledger_key(site_kek(root / STORE_KEYS_DIR / f"{site_id}.kek", create=False))
    return PrivacyLedger(root / "sites" / site_id / LEDGER_FILE, None, key=key)


def _assert_refused(report: TrainReport, *words: str) -> None:
    assert not report.ok and not report.pushes
    assert "\n" not in report.reason
    for word in words:
        assert word in report.reason, report.reason
    assert report.privacy is not None and not report.privacy.can_afford_next
    assert report.privacy.note == report.reason


# -- 5: deleting the ledger ------------------------------------------------------------------


@pytest.mark.slow
def test_a_deleted_ledger_makes_the_site_refuse_and_recovery_carries_the_spend(federation: Federation) -> None:
    root = federation.root
    with _ledger(root, SMALL) as ledger:
        spent = ledger.status().spent
    (root / "sites" / SMALL / LEDGER_FILE).unlink()

    report = federation.train(SMALL)
    _assert_refused(report, "ledger.sqlite is missing", "fedshard budget recover", "ε spent")
    assert not (root / "sites" / SMALL / LEDGER_FILE).exists()  # refusing wrote no new ledger
    query = federation.site(SMALL).query(QueryRequest(privacy={SMALL: report_plan(federation, SMALL)}))
    assert query.privacy is not None and not query.privacy.can_afford_next  # the coordinator will not select it
    assert federation.train(HONEST).ok  # honest sites are unaffected

    # recovery starts a ledger carrying the anchored spend: ε does not go down, nothing more fits
    site_config = root / "small.yaml"
    site_config.write_text(f"site:\n  id: {SMALL}\n  jurisdiction: SG\n  state_dir: {root / 'sites' / SMALL}\n")
    # not while the site runs: it may be spending from the very ledger recovery moves aside
    before = sorted(p.name for p in (root / "sites" / SMALL).iterdir())
    refusal = r"^stop the site before recovering its ledger: .*site up"
    with (
        holding(root / "sites" / SMALL, lock_file=SITE_LOCK_FILE),  # what `fedshard site up` holds
        pytest.raises(DeployError, match=refusal) as refused,
    ):
        recover_ledger(site_config, root / STORE_KEYS_DIR / f"{SMALL}.kek")
    assert "\n" not in str(refused.value)
    assert sorted(p.name for p in (root / "sites" / SMALL).iterdir() if p.name != SITE_LOCK_FILE) == before
    line = recover_ledger(site_config, root / STORE_KEYS_DIR / f"{SMALL}.kek")  # `fedshard budget recover`
    assert "carrying" in line and "\n" not in line
    with _ledger(root, SMALL) as ledger:
        after = ledger.status().spent
    assert all(after[g] >= spent[g] - 1e-9 for g in spent)
    report = federation.train(SMALL)
    assert not report.ok and report.privacy is not None and report.privacy.status == "exhausted"


def report_plan(federation: Federation, site_id: str) -> Any:
    return Coordinator(federation.config, InProcessSiteGateway({}), {}, federation.endpoints)._privacy_plan(site_id)


# -- rolling the ledger back -----------------------------------------------------------------


@pytest.mark.slow
def test_a_rolled_back_ledger_is_refused(federation: Federation) -> None:
    ledger_file = federation.root / "sites" / HONEST / LEDGER_FILE
    backup = ledger_file.with_name("backup.sqlite")
    shutil.copy(ledger_file, backup)
    first = federation.train(HONEST)
    assert first.ok  # the honest site still had budget: it released a round
    shutil.copy(backup, ledger_file)  # ... and its ledger is put back to before it

    report = federation.train(HONEST)
    _assert_refused(report, "rolled back", "restore it from a backup")


@pytest.mark.slow
def test_rolling_back_the_ledger_and_its_store_together_is_caught_by_the_coordinators_head(
    federation: Federation,
) -> None:
    site_dir = federation.root / "sites" / HONEST
    backup = federation.root / "backup"
    shutil.copytree(site_dir, backup)
    first = federation.train(HONEST)
    assert first.ok and first.privacy is not None and first.privacy.ledger_head is not None
    shutil.rmtree(site_dir)
    shutil.copytree(backup, site_dir)  # ledger and sealed store (its anchor) both put back

    report = federation.train(HONEST, ledger_head=first.privacy.ledger_head)
    _assert_refused(report, "the coordinator last saw")
    assert federation.train(HONEST, ledger_head=None).ok  # (without the coordinator's head it could not tell)


# -- issue 32, item 11: the ledger and the sealed store deleted together ---------------------


@pytest.mark.slow
def test_a_site_wiped_with_its_store_is_refused_by_the_federations_ledger_book(federation: Federation) -> None:
    """The site's own checks have nothing left to compare with; the aggregator host's ledger book,
    kept across runs, still knows what it spent."""
    from fedshard.coordinator.ledger_book import LedgerBook
    from fedshard.protocol.messages import PrivacyStatus

    book_file = federation.root / "aggregator" / "ledger-heads.json"
    name = federation.config.federation.name

    def discover(site: Site) -> Any:
        gateway = InProcessSiteGateway({SMALL: site})
        book = LedgerBook(book_file, name)  # a new coordinator process reads the book again
        coordinator = Coordinator(federation.config, gateway, {}, federation.endpoints, ledger_book=book)
        try:
            return coordinator.discover().sites[0]
        finally:
            gateway.close()

    seen = federation.site(SMALL).query(QueryRequest(privacy={SMALL: report_plan(federation, SMALL)}))
    assert seen.privacy is not None and seen.privacy.epsilon_spent > 0
    LedgerBook(book_file, name).record({SMALL: seen.privacy})  # what a run's coordinator keeps of its reports
    shutil.rmtree(federation.root / "sites" / SMALL)  # its ledger, its sealed store and the anchor in it
    (federation.root / STORE_KEYS_DIR / f"{SMALL}.kek").unlink()  # even its store key

    after = discover(federation.site(SMALL))  # a new run: the wiped site comes back with nothing
    assert after.privacy is not None and after.privacy.status is PrivacyStatus.REFUSED
    assert not after.privacy.can_afford_next  # never selected
    assert "\n" not in after.privacy.note and "recorded" in after.privacy.note, after.privacy.note
    assert not (federation.root / "sites" / SMALL / LEDGER_FILE).exists()  # it started no new ledger


# -- 6: editing stored event values ------------------------------------------------------------


def _value_offsets(data: bytes, ledger: PrivacyLedger) -> list[int]:
    """Where the file stores the events' REAL values (SQLite: 8 bytes, big-endian IEEE 754)."""
    offsets: set[int] = set()
    for entry in ledger.entries():
        for value in (entry.event.noise_multiplier, entry.event.sample_rate, entry.delta, entry.epsilon_after):
            raw = struct.pack(">d", value)
            start = data.find(raw)
            while start >= 0:
                offsets.add(start)
                start = data.find(raw, start + 1)
    return sorted(offsets)


def test_every_single_bit_flip_in_stored_event_values_is_caught(spent: Path, tmp_path: Path) -> None:
    source = spent / "sites" / SMALL / LEDGER_FILE
    key = ledger_key(site_kek(spent / STORE_KEYS_DIR / f"{SMALL}.kek", create=False))
    with PrivacyLedger(source, None, key=key) as ledger:
        events = [e.event for e in ledger.entries() if e.round == max(x.round for x in ledger.entries())]
        data = source.read_bytes()
        offsets = _value_offsets(data, ledger)
    assert len(offsets) >= 12  # every event's values were found
    target = tmp_path / LEDGER_FILE
    tries = caught = 0
    for offset in offsets:
        for bit in range(64):
            flipped = bytearray(data)
            flipped[offset + bit // 8] ^= 1 << (bit % 8)
            target.write_bytes(bytes(flipped))
            tries += 1
            try:
                with PrivacyLedger(target, None, key=key) as opened:
                    opened.reserve(10_000, events)
            except StoreError:
                caught += 1
    assert tries >= 768
    assert caught == tries  # no flip passes: none lets another round fit


@pytest.mark.slow
def test_a_flipped_bit_end_to_end_makes_the_site_refuse(federation: Federation) -> None:
    ledger_file = federation.root / "sites" / SMALL / LEDGER_FILE
    with _ledger(federation.root, SMALL) as ledger:
        data = ledger_file.read_bytes()
        eps_offsets = [data.find(struct.pack(">d", e.epsilon_after)) for e in ledger.entries()]
    flipped = bytearray(data)
    offset = max(eps_offsets)
    flipped[offset + 1] ^= 0x10  # the last ε recorded, made smaller: the attack of the issue
    ledger_file.write_bytes(bytes(flipped))

    report = federation.train(SMALL)
    _assert_refused(report, "was edited", "fedshard budget recover")
    assert federation.train(HONEST).ok
