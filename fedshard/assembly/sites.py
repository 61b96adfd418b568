"""Assembling a site from the federation config (simulation) or from its own config file (deployment)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from fedshard.assembly._connectors import tls_connector
from fedshard.config import BudgetConfig, FederationConfig, LayerPolicy
from fedshard.errors import ConfigError, PrivacyError
from fedshard.protocol.channels import ZoneConnector
from fedshard.site.model_store import ModelStore, SnapshotModelStore
from fedshard.site.privacy import SitePrivacy
from fedshard.site.routes import CLASSES_FILE, ModelSource, RouteSource, SiteRouting, read_classes, write_classes
from fedshard.site.site import Site
from fedshard.site.terms import PrivacyTerms
from fedshard.task import Partition, build_initial_model, load_task

if TYPE_CHECKING:
    import torch

    from fedshard.assembly.routing import FederationRouting
    from fedshard.config.loader import DeployedSite
    from fedshard.crypto.he import HeCodec
    from fedshard.crypto.tls import TlsFiles
    from fedshard.privacy.events import DPEvent
    from fedshard.privacy.ledger import LedgerKey
    from fedshard.site.base import SealedBase
    from fedshard.site.ledger_anchor import AnchorStore

__all__ = [
    "LEDGER_ANCHOR_FILE",
    "SIGNING_KEY_FILE",
    "STORE_KEYS_DIR",
    "check_privacy",
    "deployed_site",
    "he_keys",
    "load_deployed",
    "load_site_keys",
    "make_deployed_site",
    "make_site",
    "site_ledger_events",
    "site_model",
]

STORE_KEYS_DIR = "store-keys"
"""Beside ``state_root`` (never inside a site's folder): each simulated site's store key, ``<site>.kek``."""
SIGNING_KEY_FILE = "signing.key"
"""A site's manifest-signing key, in its state folder (public key beside it, ``.pub``)."""
LEDGER_ANCHOR_FILE = "ledger.anchor"
"""A deployed site's ledger anchor, in its state folder, when its store is not encrypted."""


def load_site_keys(folder: str | Path) -> dict[str, bytes]:
    """Sites' manifest-signing public keys from ``<site id>.pub`` files (hex) in ``folder``."""
    from fedshard.crypto.signing import load_public_key, public_key_bytes

    folder = Path(folder)
    if not folder.is_dir():
        raise ConfigError(f"site key folder {folder} does not exist")
    return {p.name[: -len(".pub")]: public_key_bytes(load_public_key(p.read_bytes())) for p in folder.glob("*.pub")}


def make_site(
    config: FederationConfig,
    site_id: str,
    state_root: str | Path,
    routing: FederationRouting | None = None,
    *,
    connect: ZoneConnector | None = None,
    endpoints: Mapping[str, str] | None = None,
) -> Site:
    """The :class:`Site` for ``site_id``, keeping its state under ``state_root/site_id``.

    ``config`` is the site's own config: its privacy terms and its zones come from it. The
    site routes by ``routing`` when given (shared by the sites of one process);
    otherwise it classifies its shards with its own model, once, and keeps the result
    in its state folder. It signs its manifests with ``state_root/site_id/signing.key``
    when that file exists. It reaches the zones through ``connect`` (default: gRPC in
    plain text, for loopback), at ``endpoints`` (default: the config's; a simulation's
    host, which started the zones on free ports, gives their real endpoints, possibly a
    mapping that grows as zones are added).
    """
    state_dir = Path(state_root) / site_id
    he_dir = he_keys(config) if config.residency.encrypting else None
    kek_file = Path(state_root).parent / STORE_KEYS_DIR / f"{site_id}.kek"
    store = _model_store(config, state_dir, kek_file, create_key=True)
    ledger = (
        _ledger_guard(store, kek_file, kek_file.with_suffix(".ledger-anchor"), create_key=True)
        if config.privacy.enabled
        else None
    )
    return _site(
        config,
        site_id,
        state_dir,
        state_dir / SIGNING_KEY_FILE,
        he_dir,
        None,
        store,
        routing=routing,
        connect=connect,
        ledger=ledger,
        endpoints=endpoints,
    )


def make_deployed_site(site_config: Path, *, site_id: str = "", jurisdiction: str = "") -> Site:
    """The :class:`Site` a deployed SuperNode runs, from the site's own config file.

    The federation config, state folder and keys (TLS certificate for the zones,
    manifest-signing key, HE secret context) all come from that file and the bundle
    it names; ``site_id`` and ``jurisdiction`` (from the SuperNode's node config), when
    given, must agree with it. The site's privacy terms (mechanisms; its budget: the copy's,
    the copy's cap and its own file's cap, the stricter wins) and the zones it pushes to
    come from those files; a coordinator's plan may only tighten them.
    """
    return deployed_site(load_deployed(site_config, site_id, jurisdiction))


def load_deployed(site_config: Path, site_id: str, jurisdiction: str) -> DeployedSite:
    """A deployed site's configs and key bundle, checked against the SuperNode's ``site_id`` and ``jurisdiction``."""
    from fedshard.config import load_deployed_site

    loaded = load_deployed_site(site_config)
    local = loaded.local
    assert local.deployment is not None  # load_deployed_site checked it
    me = local.site
    for given, own, what in ((site_id, me.id, "site id"), (jurisdiction, me.jurisdiction, "jurisdiction")):
        if given and given != own:
            raise ConfigError(f"{site_config}: the SuperNode was started as {what} {given!r} but the file says {own!r}")
    return loaded


def deployed_site(loaded: DeployedSite) -> Site:
    from fedshard.config.layout import SiteBundle

    local, config, _ = loaded  # the copy lists the site (checked); its budget and cap are in config
    assert local.deployment is not None  # load_deployed_site checked it
    me = local.site
    floating = next((z for z in config.zones if z.endpoint.endswith(":0")), None)
    if floating is not None:
        raise ConfigError(
            f"{local.deployment.federation}: zone {floating.name}'s endpoint {floating.endpoint} has port 0; a "
            "deployed site dials only the endpoints of its own copy of the config: give the port the zone listens on"
        )
    bundle = SiteBundle(local.deployment.keys)
    tls = bundle.tls if local.deployment.tls else None
    he_dir = bundle.he if config.residency.encrypting else None
    store = _model_store(config, me.state_dir, bundle.store_kek, create_key=False)
    ledger = (
        _ledger_guard(store, bundle.store_kek, me.state_dir / LEDGER_ANCHOR_FILE, create_key=False)
        if config.privacy.enabled
        else None
    )
    return _site(config, me.id, me.state_dir, bundle.signing_key, he_dir, tls, store, cap=me.cap, ledger=ledger)


def _model_store(config: FederationConfig, state_dir: Path, kek_file: Path, *, create_key: bool) -> ModelStore:
    """The site's model store: encrypted under the key in ``kek_file`` unless ``store.encrypt`` is off."""
    if not config.store.encrypt:
        return SnapshotModelStore(state_dir)
    from fedshard.site.model_store import SealedModelStore, site_kek

    return SealedModelStore(state_dir / "shards", site_kek(kek_file, create=create_key), config.store.lookahead)


def _ledger_guard(
    store: ModelStore, kek_file: Path, anchor_file: Path, *, create_key: bool
) -> tuple[LedgerKey, AnchorStore]:
    """The key that authenticates the site's privacy ledger (from its store key) and where
    the ledger's head is anchored: the sealed store's catalog, or ``anchor_file`` when the
    store is not encrypted. Every site of a federation with DP on has both."""
    from fedshard.site.ledger_anchor import CatalogAnchor, FileAnchor
    from fedshard.site.model_store import SealedModelStore, site_kek
    from fedshard.site.privacy import ledger_key

    if isinstance(store, SealedModelStore):
        return ledger_key(store.kek), CatalogAnchor(store.root, store.kek, store.kept)
    key = ledger_key(site_kek(kek_file, create=create_key))
    return key, FileAnchor(anchor_file, key)


def _site(
    config: FederationConfig,
    site_id: str,
    state_dir: Path,
    signing_key_file: Path,
    he_dir: Path | None,
    tls: TlsFiles | None,
    store: ModelStore,
    *,
    routing: FederationRouting | None = None,
    cap: BudgetConfig | None = None,
    connect: ZoneConnector | None = None,
    ledger: tuple[LedgerKey, AnchorStore] | None = None,
    endpoints: Mapping[str, str] | None = None,
) -> Site:
    site = config.site(site_id)
    task = load_task(config.task.target, dict(config.task.options))  # one per site: a task may hold state
    partition = Partition(config.partition_of(site_id), config.num_partitions, config.federation.seed)
    signing_key = None
    if signing_key_file.exists():
        from fedshard.crypto.signing import load_signing_key

        signing_key = load_signing_key(signing_key_file)
    he = None
    if he_dir is not None:
        value_range, max_sites, scheme = config.he.value_range, config.he.max_sites, config.he.scheme

        def he() -> HeCodec:
            from fedshard.crypto.he import SECRET_CONTEXT_FILE, HeCodec, load_context

            context = load_context(he_dir / SECRET_CONTEXT_FILE, secret=True, scheme=scheme)
            return HeCodec(context, value_range, max_sites)

    return Site(
        site.id,
        site.jurisdiction,
        task,
        partition,
        tile=config.sharding.tile,
        seed=config.federation.seed,
        state_dir=state_dir,
        connect=connect if connect is not None else tls_connector(tls, {z.name: z.region for z in config.zones}),
        privacy=SitePrivacy(
            site.id,
            state_dir,
            PrivacyTerms.of(config, site.id, cap=cap),
            key=ledger[0] if ledger is not None else None,
            anchor=ledger[1] if ledger is not None else None,
        ),
        dp_layers=config.privacy.layer_policy,
        routing=_route_source(config, site_id, state_dir, routing),
        signing_key=signing_key,
        he=he,
        store=store,
        base=_sealed_base(config, state_dir, store),
        endpoints=endpoints if endpoints is not None else {z.name: z.endpoint for z in config.zones},
    )


def _sealed_base(config: FederationConfig, state_dir: Path, store: ModelStore) -> SealedBase | None:
    """Where the site seals and streams its frozen base (``store.base``), or None to keep it resident."""
    if config.store.base == "resident":
        return None
    from fedshard.site.base import BASE_DIR, SealedBase
    from fedshard.site.model_store import SealedModelStore

    assert isinstance(store, SealedModelStore)  # StoreConfig refuses store.base without store.encrypt
    return SealedBase(
        state_dir / BASE_DIR,
        store.kek,
        config.store.base,
        config.sharding.tile,
        config.store.lookahead,
        codes=config.store.base_codes,
    )


def _route_source(
    config: FederationConfig, site_id: str, state_dir: Path, shared: FederationRouting | None
) -> RouteSource:
    """How the site gets its routes: from ``shared``, or from the classification of its own model
    (kept in its state folder under the plan and residency config's key)."""

    def routes(plan_digest: str, model: ModelSource) -> SiteRouting:
        from fedshard.assembly.routing import FederationRouting, classification_key, classify

        if shared is not None:
            return shared.site(site_id)
        key = classification_key(config, plan_digest)
        path = state_dir / CLASSES_FILE
        classes = read_classes(path, key)
        if classes is None:
            plan, module = model()
            classes = classify(config, plan, module)
            write_classes(path, key, classes)
        return FederationRouting(config, classes).site(site_id)

    return routes


def he_keys(config: FederationConfig) -> Path:
    """The folder of the federation's HE contexts (``he.keys``)."""
    if config.he.keys is None:
        raise ConfigError(
            "residency.encrypt names shard classes to encrypt but he.keys is empty; "
            "make the contexts with `fedshard keys he-init --out DIR` and set he.keys: DIR"
        )
    return config.he.keys


def check_privacy(config: FederationConfig) -> None:
    """Refuse, before anything runs, a site whose δ exceeds 1/(its number of records),
    and a model DP-SGD cannot train when its layers may not be replaced.

    Sites check these themselves too; checking here turns a refusal in round 1 into a
    one-line error when the config is loaded.
    """
    if not config.privacy.enabled:
        return
    task = load_task(config.task.target, dict(config.task.options))
    record = config.privacy.record_level
    if record.enabled and not record.fix_incompatible_layers:
        import torch

        try:
            with torch.random.fork_rng(devices=[]):  # the build's seed stays inside it
                build_initial_model(task, config.federation.seed, LayerPolicy.CHECK)
        except PrivacyError as exc:
            raise ConfigError(f"privacy.record_level: {exc}") from None
    for site in config.sites:
        budget = config.budget_of(site.id)
        assert budget is not None
        delta = min(budget.delta, site.cap.delta) if site.cap is not None else budget.delta
        partition = Partition(config.partition_of(site.id), config.num_partitions, config.federation.seed)
        records = task.load_data(partition).num_train
        if records and delta > 1.0 / records:
            raise ConfigError(
                f"site {site.id}: privacy δ={delta:g} is larger than 1/(its {records} records) = {1.0 / records:.3g}; "
                f"choose δ ≤ {1.0 / records:.3g}"
            )


def site_model(config: FederationConfig, state_dir: Path, kek_file: Path) -> tuple[torch.nn.Module, str]:
    """The model a site's state folder holds, built from ``config``'s task as every party builds
    it and filled from the site's store (decrypted under ``kek_file``, every shard verified);
    ``(module, the model version the store records)``.

    Raises
    ------
    StoreError
        The folder holds no model (the site never ran, or this is not its folder).
    """

    from fedshard.errors import StoreError
    from fedshard.site.model_store import stored_module

    store = _model_store(config, state_dir, kek_file, create_key=False)
    if not store.exists():
        raise StoreError(f"{state_dir}: holds no site model (has this site run a round?)")
    task = load_task(config.task.target, dict(config.task.options))

    def build() -> torch.nn.Module:
        return build_initial_model(task, config.federation.seed, config.privacy.layer_policy)

    module, meta = stored_module(build, config.sharding.tile, store)
    return module, str(meta.get("version", ""))


def site_ledger_events(config: FederationConfig, state_dir: Path, kek_file: Path) -> list[DPEvent]:
    """Every DP event a simulated site's ledger records, oldest first: read under the site's own
    ledger key (from its store key ``kek_file``), each row checked by its MAC chain.

    Raises
    ------
    StoreError
        The folder holds no ledger, or the ledger fails its checks (one line).
    """
    from fedshard.privacy.ledger import PrivacyLedger
    from fedshard.site.privacy import LEDGER_FILE

    store = _model_store(config, state_dir, kek_file, create_key=False)
    key, _ = _ledger_guard(store, kek_file, kek_file.with_suffix(".ledger-anchor"), create_key=False)
    with PrivacyLedger(state_dir / LEDGER_FILE, None, key=key) as ledger:
        return [entry.event for entry in ledger.entries()]
