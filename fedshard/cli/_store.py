"""``fedshard store …`` (tier, stats, keygen), ``fedshard verify --store`` and ``fedshard keys rotate``.

The store's key-encryption key (KEK) comes from ``--key-file FILE``, else from
``$FEDSHARD_STORE_KEK`` (64 hex digits), else from the file ``$FEDSHARD_STORE_KEK_FILE``.
A key rotation takes the new KEK from ``--new-key-file FILE`` or ``$FEDSHARD_STORE_NEW_KEK``.
``fedshard store keygen --out FILE`` makes a new KEK file (mode 600); keep it outside
the store's folder (a key file inside it is refused).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from fedshard.crypto.at_rest import KEK_ENV, KEK_FILE_ENV
from fedshard.store.quantize import ColdFormat

if TYPE_CHECKING:
    from fedshard.store.sealed_store import SealedShardStore

__all__ = ["store_app", "verify_store"]

store_app = typer.Typer(no_args_is_help=True, help="The site's encrypted shard store: tiering, statistics, keys.")
console = Console()

StoreOpt = Annotated[Path, typer.Option("--store", help="The shard store's folder")]
KeyFileOpt = Annotated[
    Path | None,
    typer.Option("--key-file", help=f"The store's key-encryption key file (default: ${KEK_ENV} or ${KEK_FILE_ENV})"),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of text")]


def _mb(n: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n} B"


def _open(store: Path, key_file: Path | None) -> SealedShardStore:
    from fedshard.crypto.at_rest import load_kek
    from fedshard.store.sealed_store import SealedShardStore

    return SealedShardStore.open(store, load_kek(key_file, store_root=store))


@store_app.command("tier")
def store_tier(
    store: StoreOpt,
    older_than: Annotated[
        str, typer.Option("--older-than", help="Move shards not read or written for this long: 90d, 12h, 2w, ...")
    ],
    fmt: Annotated[ColdFormat, typer.Option("--format", help="Cold format (error bounds: see `store stats`)")] = (
        ColdFormat.INT8
    ),
    key_file: KeyFileOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Move cold shards to the low-precision cold tier (reads dequantise; a new write makes them hot again)."""
    from fedshard.store.tiering import parse_age

    age = parse_age(older_than)
    with _open(store, key_file) as opened:
        report = opened.tier(age, fmt)
    if as_json:
        print(json.dumps(report.to_dict(), indent=2))
        return
    console.print(
        f"moved {len(report.moved)} shard(s) to the cold tier ({report.format}): "
        f"{_mb(report.bytes_before)} → {_mb(report.bytes_after)}",
        highlight=False,
        soft_wrap=True,
    )
    if report.skipped:
        console.print(
            f"kept {len(report.skipped)} shard(s) hot: not finite float32/float64 values",
            highlight=False,
            soft_wrap=True,
        )
    if report.damaged:
        console.print(
            f"[red]left {len(report.damaged)} damaged shard(s) as they are ({report.damaged[0]}, ...): "
            f"run `fedshard verify --store {store}`[/]",
            highlight=False,
            soft_wrap=True,
        )


@store_app.command("stats")
def store_stats(store: StoreOpt, key_file: KeyFileOpt = None, as_json: JsonOpt = False) -> None:
    """Shards and bytes per tier, and the measured quantisation error per cold format.

    Without a key the catalog is read without being authenticated (the counts could be forged).
    """
    from fedshard.store.catalog import CATALOG, Catalog
    from fedshard.store.local_dir import LocalDirBackend
    from fedshard.store.tiering import store_stats as compute

    if key_file is not None or KEK_ENV in os.environ or os.environ.get(KEK_FILE_ENV):
        with _open(store, key_file) as opened:
            stats, authenticated = opened.stats(), True
    else:
        from fedshard.errors import StoreError

        raw = LocalDirBackend(store).read(CATALOG)
        if raw is None:
            raise StoreError(f"no shard store at {store} (no catalog there)")
        stats, authenticated = compute(Catalog.read_unauthenticated(raw).entries.values()), False
    if as_json:
        print(json.dumps({**stats.to_dict(), "authenticated": authenticated}, indent=2))
        return
    tiers = Table(title=f"shard store {store}")
    for column in ("tier", "shards", "stored", "full precision", "saved"):
        tiers.add_column(column, justify="left" if column == "tier" else "right", overflow="fold")
    for name, usage in stats.tiers.items():
        saved = f"{1 - usage.stored_bytes / usage.logical_bytes:.0%}" if name == "cold" and usage.logical_bytes else "—"
        tiers.add_row(name, str(usage.shards), _mb(usage.stored_bytes), _mb(usage.logical_bytes), saved)
    console.print(tiers)
    if stats.formats:
        errors = Table(title="quantisation error of the cold tier (measured when tiered)")
        for column in ("format", "shards", "values", "max |error|", "rms error", "relative rms", "bound per value"):
            errors.add_column(
                column, justify="left" if column in ("format", "bound per value") else "right", overflow="fold"
            )
        for name, err in stats.formats.items():
            errors.add_row(
                name,
                str(err.shards),
                f"{err.values:,}",
                f"{err.max_abs:.3g}",
                f"{err.rms:.3g}",
                f"{err.relative_rms:.2%}",
                err.bound,
            )
        console.print(errors)
    if not authenticated:
        console.print(f"[yellow]catalog not authenticated (no key given: --key-file or ${KEK_ENV})[/]")


@store_app.command("keygen")
def store_keygen(
    out: Annotated[Path, typer.Option("--out", help="Key file to create (mode 600), outside any store")],
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file")] = False,
) -> None:
    """Create a new random key-encryption key file for a shard store (or as a rotation target)."""
    from fedshard.crypto.at_rest import generate_kek_file

    kek = generate_kek_file(out, force=force)
    console.print(
        f"key-encryption key {kek.kek_id} in {out} (mode 600); keep it away from the store",
        highlight=False,
        soft_wrap=True,
    )


def verify_store(
    store: StoreOpt,
    version: Annotated[
        str | None,
        typer.Option(
            "--version",
            help="The model version this site should hold: its own entry in summary.json's sites (a site in a "
            "residency group holds its group's version, not the federation's model_version)",
        ),
    ] = None,
    key_file: KeyFileOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Check every shard of a store, and its Merkle root against the recorded model version.

    Lists what is wrong and exits 1 if anything is.
    """
    from fedshard.store.verify import check_store

    with _open(store, key_file) as opened:
        report = check_store(opened, version)
    if as_json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        head = f"store {store}: {report.shards} shards"
        if report.model_version is not None:
            head += f", model version {report.model_version[:16]}…, root {(report.root or '')[:16]}…"
        console.print(head, highlight=False, soft_wrap=True)
        for problem in report.problems:
            console.print(f"[red]✗[/] {problem.message}", highlight=False, soft_wrap=True)
        for note in report.notes:
            console.print(f"note: {note}", highlight=False, soft_wrap=True)
        console.print(
            "[green]all shards verified[/]" if report.ok else f"[red]{len(report.problems)} problem(s)[/]",
            highlight=False,
            soft_wrap=True,
        )
    if not report.ok:
        # SystemExit, not typer.Exit: `main` runs the app with standalone_mode=False, which
        # would turn typer.Exit(1) into a return value and exit 0.
        raise SystemExit(1)
