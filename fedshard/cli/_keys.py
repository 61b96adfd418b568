"""``fedshard keys …``: every key a federation has, in one command group: provisioning it
(``init``, ``init --add``), re-issuing certificates of an earlier release (``upgrade``), the
HE contexts (``he-init``) and rotating a shard store's key-encryption key (``rotate``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from fedshard.cli._store import KeyFileOpt, StoreOpt
from fedshard.crypto.at_rest import NEW_KEK_ENV
from fedshard.errors import FedshardError

__all__ = ["keys_app"]

keys_app = typer.Typer(
    no_args_is_help=True, help="Keys: provision a federation, HE contexts, rotate a shard store's key."
)
console = Console()

ConfigOpt = Annotated[Path, typer.Option("--config", "-c", help="The aggregator's config (federation + deployment)")]
Force = Annotated[bool, typer.Option("--force", help="Overwrite existing files")]


@keys_app.command("init")
def keys_init(
    config: ConfigOpt,
    out: Annotated[
        Path | None, typer.Option("--out", help="Folder for every key (default: the config's deployment.keys)")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite existing key files")] = False,
    add: Annotated[
        bool,
        typer.Option("--add", help="Only the zones and sites that have no keys yet, from the existing CA"),
    ] = False,
) -> None:
    """Provision a whole federation: CA, SuperLink and zone certificates, per-site bundles
    (client certificate, SuperNode key, signing key, HE secret context). With --add,
    keys for the zones and sites a grown config adds, issued by the existing CA."""
    from fedshard.config import load_federation
    from fedshard.deploy.keys import provision

    cfg = load_federation(config)
    target = out if out is not None else (cfg.deployment.keys if cfg.deployment else Path("keys"))
    if add and force:
        raise FedshardError("--add keeps every existing key; it cannot be combined with --force")
    report = provision(cfg, target, force=force, add=add)
    layout = report.layout
    if cfg.deployment is not None and target.resolve() != cfg.deployment.keys:
        console.print(
            f"[yellow]note:[/] the config's deployment.keys is {escape(str(cfg.deployment.keys))}; point it here"
        )
    console.print(f"wrote {len(report.files)} files under {layout.root}", highlight=False)
    if add:
        return
    console.print(f"  {layout.ca_dir}/ca.key      the CA's key: move it offline", highlight=False)
    console.print(f"  {layout.aggregator.root}/  stays on the aggregator host", highlight=False)
    console.print(f"  {layout.root / 'sites'}/<site>/  hand each site its own folder, nothing else", highlight=False)


@keys_app.command("upgrade")
def keys_upgrade(
    keys: Annotated[Path, typer.Option("--keys", help="The folder `fedshard keys init --out` wrote (with ca/ca.key)")],
) -> None:
    """Re-issue the certificates of an earlier release: each then names its role (site, zone,
    coordinator, SuperLink) and a zone's its identity, so that parties dialling it can check it.

    Every party keeps its key pair; only certificate files change, one line each. Restart the
    zones and the SuperLink on their new certificates; hand each site its new
    ``sites/<id>/<id>.pem`` when convenient (zones still accept the old one). Running it
    again changes nothing.
    """
    from fedshard.deploy.keys import upgrade

    for done in upgrade(keys):
        state = "re-issued" if done.changed else "current  "
        console.print(f"{state} {done.path}: {done.holder}", highlight=False)


@keys_app.command("he-init")
def keys_he_init(
    out: Annotated[Path, typer.Option("--out", help="Folder for secret.ctx (sites) and public.ctx (zones)")],
    scheme: Annotated[
        str, typer.Option("--scheme", help="bfv (exact sums, 2.0× float32 bytes) or ckks (4.0×): he.scheme")
    ] = "bfv",
    force: Force = False,
) -> None:
    """Make the federation's homomorphic contexts: the secret one goes to every site, the public
    one (no secret key) to the zones. Point the config's he.keys at the folder."""
    from fedshard.crypto.he import he_init

    secret, public = he_init(out, scheme=scheme, force=force)
    console.print(
        f"secret context {secret} (mode 600: sites only)\npublic context {public} (zones: it cannot decrypt)",
        highlight=False,
    )


@keys_app.command("rotate")
def keys_rotate(
    store: StoreOpt,
    key_file: KeyFileOpt = None,
    new_key_file: Annotated[
        Path | None,
        typer.Option(
            "--new-key-file", help=f"The new key-encryption key (default: ${NEW_KEK_ENV}); see `store keygen`"
        ),
    ] = None,
) -> None:
    """Re-wrap every data key of a shard store under a new key-encryption key (no shard is re-encrypted).

    Resumes an interrupted rotation when run again with the same keys. Afterwards the old
    key no longer opens the store.
    """
    from fedshard.crypto.at_rest import load_kek
    from fedshard.store.local_dir import LocalDirBackend
    from fedshard.store.rotation import rotate_keys

    old = load_kek(key_file, store_root=store)
    new = load_kek(new_key_file, env=NEW_KEK_ENV, store_root=store)
    report = rotate_keys(LocalDirBackend(store), old, new)
    if report.keys == 0:
        done = "finished the interrupted rotation, which had committed" if report.resumed else "nothing to do"
        console.print(
            f"the store is already sealed under key {report.new_kek}: {done}", highlight=False, soft_wrap=True
        )
    else:
        resumed = " (resumed an interrupted rotation)" if report.resumed else ""
        console.print(
            f"re-wrapped {report.keys:,} data keys under key {report.new_kek} (was {report.old_kek}) "
            f"in {report.seconds:.3f} s{resumed}",
            highlight=False,
            soft_wrap=True,
        )
    console.print(
        f"key {report.old_kek} no longer opens this store: destroy it and its copies", highlight=False, soft_wrap=True
    )
