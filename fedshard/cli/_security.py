"""``fedshard pki …`` (the federation's certificates) and ``fedshard audit verify``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from fedshard.errors import FedshardError

__all__ = ["audit_app", "pki_app"]

pki_app = typer.Typer(no_args_is_help=True, help="The federation PKI: CA, zone and site certificates.")
audit_app = typer.Typer(no_args_is_help=True, help="Zone audit logs (append-only, hash-chained, signed).")
console = Console()

Force = Annotated[bool, typer.Option("--force", help="Overwrite existing files")]


@pki_app.command("init")
def pki_init(
    out: Annotated[Path, typer.Option("--out", help="Folder for ca.pem and ca.key (keep ca.key offline)")],
    name: Annotated[str, typer.Option("--name", help="CA common name")] = "fedshard federation CA",
    force: Force = False,
) -> None:
    """Create the federation's certificate authority."""
    from fedshard.crypto.pki import init_ca

    paths = init_ca(out, name, force=force)
    console.print(f"CA certificate {paths.cert}\nCA key         {paths.key} (mode 600)", highlight=False)


@pki_app.command("issue-zone")
def pki_issue_zone(
    ca: Annotated[Path, typer.Option("--ca", help="Folder holding ca.pem and ca.key")],
    zone: Annotated[str, typer.Option("--zone", help="Zone name, e.g. eu-central")],
    region: Annotated[str, typer.Option("--region", help="The zone's region, e.g. EU")],
    out: Annotated[Path, typer.Option("--out", help="Folder for the zone's certificate and key")],
    host: Annotated[list[str] | None, typer.Option("--host", help="DNS name or IP the zone serves on")] = None,
    force: Force = False,
) -> None:
    """Issue a zone's server certificate (its region recorded in it)."""
    from fedshard.crypto.pki import issue_zone

    hosts = tuple(host) if host else ("localhost", "127.0.0.1")
    paths = issue_zone(ca, zone, region, out, hosts=hosts, force=force)
    console.print(f"zone {zone} ({region}): {paths.cert}, key {paths.key}", highlight=False)


@pki_app.command("issue-site")
def pki_issue_site(
    ca: Annotated[Path, typer.Option("--ca", help="Folder holding ca.pem and ca.key")],
    site: Annotated[str, typer.Option("--site", help="Site id")],
    jurisdiction: Annotated[str, typer.Option("--jurisdiction", help="The site's jurisdiction, e.g. EU")],
    out: Annotated[Path, typer.Option("--out", help="Folder for the site's certificate and key")],
    force: Force = False,
) -> None:
    """Issue a site's client certificate; zones read the site's jurisdiction from it."""
    from fedshard.crypto.pki import issue_site

    paths = issue_site(ca, site, jurisdiction, out, force=force)
    console.print(f"site {site} ({jurisdiction}): {paths.cert}, key {paths.key}", highlight=False)


@pki_app.command("issue-coordinator")
def pki_issue_coordinator(
    ca: Annotated[Path, typer.Option("--ca", help="Folder holding ca.pem and ca.key")],
    region: Annotated[str, typer.Option("--region", help="The region the coordinator runs in, e.g. EU")],
    out: Annotated[Path, typer.Option("--out", help="Folder for the coordinator's certificate and key")],
    name: Annotated[str, typer.Option("--name", help="The certificate's common name")] = "coordinator",
    force: Force = False,
) -> None:
    """Issue the coordinator's client certificate: the only one zones let open, close or abort a round."""
    from fedshard.crypto.pki import issue_coordinator

    paths = issue_coordinator(ca, region, out, name=name, force=force)
    console.print(f"coordinator {name} ({region}): {paths.cert}, key {paths.key}", highlight=False)


@audit_app.command("verify")
def audit_verify(
    log: Annotated[Path, typer.Option("--log", help="A zone's audit log (JSON lines)")],
    cert: Annotated[
        Path | None, typer.Option("--cert", help="The zone's certificate: its key must have signed the head")
    ] = None,
    ca: Annotated[
        Path | None, typer.Option("--ca", help="The federation CA: the head must be signed by a zone it issued")
    ] = None,
    head: Annotated[
        str | None, typer.Option("--head", help="Chain head recorded elsewhere, to detect a cut tail")
    ] = None,
    allow_adopted: Annotated[
        bool,
        typer.Option("--allow-adopted", help="Accept lines the zone adopted unsigned on restart, once checked"),
    ] = False,
    zone: Annotated[
        str | None, typer.Option("--zone", help="The zone whose log this must be (its records and its signer)")
    ] = None,
) -> None:
    """Check the audit log's hash chain and the zone's signed head (``audit.head.json`` beside it).

    Exit 2 with one line naming the first bad record: an altered, removed or moved
    line, lines appended after the signed head, a cut tail, or a bad signature.
    With --cert or --ca the log must be signed, by a zone certificate naming the zone
    (and region) the log's records name; --zone says which zone that must be.
    """
    from fedshard.audit import HeadVerifier, verify_audit_log

    verifier = HeadVerifier.from_files(cert, ca) if cert is not None or ca is not None else None
    verdict = verify_audit_log(log, expected_head=head, verifier=verifier, allow_adopted=allow_adopted, zone=zone)
    if not verdict.ok:
        raise FedshardError(f"audit log {log} fails verification: {verdict.reason}")
    summary = f"audit log {log}: {verdict.lines} lines, chain intact, head {verdict.head}"
    signed = verdict.signed
    if signed is None:
        console.print(
            f"{summary}; NOT signed (the zone ran without a key): records appended to it "
            "or cut from its end cannot be told from the zone's",
            highlight=False,
        )
        return
    by = f"signed by zone {signed.zone} (fingerprint {signed.fingerprint[:16]}…) at line {signed.lines}"
    if not signed.trusted:
        by += "; certificate NOT checked: pass --cert or --ca to trust the signature"
    console.print(f"{summary}, {by}", highlight=False)
    for a in verdict.adopted:
        console.print(
            f"accepted: lines {a.first}-{a.last} were unsigned ({a.cause}), adopted by the zone at line {a.at}",
            highlight=False,
        )
