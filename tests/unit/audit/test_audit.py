"""Hash-chained, signed audit log: appends, verification, tamper detection, signed heads, reopening, threads."""

from __future__ import annotations

import hashlib
import itertools
import json
import threading
from pathlib import Path
from typing import Any

import pytest
import typer
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from typer.testing import CliRunner

from fedshard.audit import (
    GENESIS,
    Adoption,
    AuditLog,
    Decision,
    HeadSigner,
    HeadVerifier,
    record_hash,
    verify_audit_log,
)
from fedshard.cli._security import audit_app
from fedshard.crypto.identity import read_identity
from fedshard.crypto.pki import init_ca, issue_zone
from fedshard.errors import FedshardError, PkiError, StoreError


class FakeClock:
    def __init__(self) -> None:
        self._ticks = itertools.count()

    def __call__(self) -> float:
        return 1_700_000_000.25 + next(self._ticks)


def _write_log(path: Path, n: int = 5) -> str:
    with AuditLog(path, clock=FakeClock()) as log:
        for i in range(n):
            log.append(Decision.ACCEPTED if i % 2 == 0 else "refused", site="hospital-a", round=i, shards=[f"w#{i}"])
        return log.head


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def test_chain_verifies(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    head = _write_log(path)
    verdict = verify_audit_log(path)
    assert verdict.ok
    assert (verdict.lines, verdict.head, verdict.first_bad_line, verdict.reason) == (5, head, None, None)


def test_record_format_and_hash(tmp_path: Path) -> None:
    """Pins the on-disk format: key order, canonical JSON, hash = sha256(prev ‖ canonical body)."""
    path = tmp_path / "audit.jsonl"
    with AuditLog(path, clock=lambda: 12.5) as log:
        first = log.append("accepted", site="s1", zone="eu-1", detail={"b": 1, "a": "é"})
        second = log.append("forwarded", site="s1", to="eu-2")
    line = _lines(path)[0]
    assert line.startswith(b'{"seq":1,"time":12.5,"decision":"accepted","detail":{"a":"\\u00e9","b":1},"site":"s1"')
    assert line.endswith(b'"prev":"' + GENESIS.encode() + b'","hash":"' + first.hash.encode() + b'"}\n')
    body = json.loads(line)
    del body["hash"]
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    assert first.hash == hashlib.sha256(bytes.fromhex(GENESIS) + canonical).hexdigest()
    assert (second.seq, second.prev, second.decision) == (2, first.hash, "forwarded")
    assert dict(second.fields) == {"site": "s1", "to": "eu-2"}
    assert second.as_dict() == json.loads(_lines(path)[1])


def test_empty_log_is_valid(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    with AuditLog(path) as log:
        assert (log.head, log.lines) == (GENESIS, 0)
    assert path.read_bytes() == b""
    assert verify_audit_log(path).ok


def test_changed_line_is_detected(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    _write_log(path)
    lines = _lines(path)
    lines[2] = lines[2].replace(b'"site":"hospital-a"', b'"site":"hospital-b"')
    path.write_bytes(b"".join(lines))
    verdict = verify_audit_log(path)
    assert not verdict.ok
    assert verdict.first_bad_line == 3
    assert verdict.lines == 2
    assert verdict.reason is not None and "altered" in verdict.reason


def test_rewritten_line_with_fresh_hash_breaks_the_next_line(tmp_path: Path) -> None:
    """An editor who recomputes the changed line's hash still breaks the link to the next line."""
    path = tmp_path / "audit.jsonl"
    _write_log(path)
    lines = _lines(path)
    record = json.loads(lines[2])
    record["decision"] = "accepted" if record["decision"] != "accepted" else "refused"
    del record["hash"]
    canonical = json.dumps(record, sort_keys=True, separators=(",", ":")).encode()
    record["hash"] = hashlib.sha256(bytes.fromhex(record["prev"]) + canonical).hexdigest()
    lines[2] = json.dumps(record, separators=(",", ":")).encode() + b"\n"
    path.write_bytes(b"".join(lines))
    verdict = verify_audit_log(path)
    assert (verdict.ok, verdict.first_bad_line) == (False, 4)
    assert verdict.reason is not None and "does not follow" in verdict.reason


def test_removed_line_is_detected(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    _write_log(path)
    lines = _lines(path)
    del lines[2]
    path.write_bytes(b"".join(lines))
    verdict = verify_audit_log(path)
    assert (verdict.ok, verdict.first_bad_line) == (False, 3)
    assert verdict.reason is not None and "seq 4, expected 3" in verdict.reason


def test_removed_first_line_is_detected(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    _write_log(path)
    path.write_bytes(b"".join(_lines(path)[1:]))
    assert verify_audit_log(path).first_bad_line == 1


def test_reordered_lines_are_detected(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    _write_log(path)
    lines = _lines(path)
    lines[1], lines[3] = lines[3], lines[1]
    path.write_bytes(b"".join(lines))
    verdict = verify_audit_log(path)
    assert (verdict.ok, verdict.first_bad_line, verdict.lines) == (False, 2, 1)


def test_truncated_last_line_is_detected(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    _write_log(path)
    data = path.read_bytes()
    path.write_bytes(data[:-20])
    verdict = verify_audit_log(path)
    assert (verdict.ok, verdict.first_bad_line, verdict.lines) == (False, 5, 4)
    assert verdict.reason is not None and "truncated" in verdict.reason
    path.write_bytes(data[:-1])  # even just the newline missing: the append did not finish
    assert verify_audit_log(path).first_bad_line == 5


def test_broken_json_line_is_detected(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    _write_log(path)
    lines = _lines(path)
    lines[1] = b'{"seq":2,"time":NaN\n'
    path.write_bytes(b"".join(lines))
    verdict = verify_audit_log(path)
    assert (verdict.ok, verdict.first_bad_line) == (False, 2)
    assert verdict.reason is not None and "not valid JSON" in verdict.reason


def test_reformatted_line_is_detected(tmp_path: Path) -> None:
    """Same content, different bytes (spaces): the line is not what the zone wrote."""
    path = tmp_path / "audit.jsonl"
    _write_log(path)
    lines = _lines(path)
    lines[0] = json.dumps(json.loads(lines[0])).encode() + b"\n"
    path.write_bytes(b"".join(lines))
    verdict = verify_audit_log(path)
    assert verdict.first_bad_line == 1
    assert verdict.reason is not None and "canonical" in verdict.reason


def test_lines_removed_from_the_end_need_an_anchor(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    head = _write_log(path)
    path.write_bytes(b"".join(_lines(path)[:-1]))
    assert verify_audit_log(path).ok  # a shorter chain is still a chain...
    verdict = verify_audit_log(path, expected_head=head)  # ...but it lost the anchored head
    assert (verdict.ok, verdict.first_bad_line) == (False, 5)


def test_reopen_continues_the_chain(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    head = _write_log(path, 3)
    with AuditLog(path, clock=FakeClock()) as log:
        assert (log.lines, log.head) == (3, head)
        record = log.append(Decision.PUBLISHED, round=1)
    assert (record.seq, record.prev) == (4, head)
    verdict = verify_audit_log(path, expected_head=head)
    assert (verdict.ok, verdict.lines, verdict.head) == (True, 4, record.hash)


def test_reopen_refuses_a_broken_log_and_leaves_it_alone(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    _write_log(path)
    lines = _lines(path)
    del lines[1]
    broken = b"".join(lines)
    path.write_bytes(broken)
    with pytest.raises(StoreError, match=r"^audit log .* is broken: line 2 ") as info:
        AuditLog(path)
    assert "\n" not in str(info.value)
    assert path.read_bytes() == broken


def test_one_writer_at_a_time(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    with AuditLog(path) as log:
        with pytest.raises(StoreError, match="in use"):
            AuditLog(path)
        log.append("accepted")
    with AuditLog(path) as again:  # released on close
        assert again.lines == 1
    with pytest.raises(StoreError, match="closed"):
        again.append("accepted")


def test_concurrent_appends_stay_one_chain(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    threads, per_thread = 8, 60
    barrier = threading.Barrier(threads)
    with AuditLog(path, durable=False) as log:

        def work(worker: int) -> None:
            barrier.wait()
            for i in range(per_thread):
                log.append("accepted", worker=worker, i=i)

        pool = [threading.Thread(target=work, args=(w,)) for w in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        head = log.head
    verdict = verify_audit_log(path)
    assert (verdict.ok, verdict.lines, verdict.head) == (True, threads * per_thread, head)
    records = [json.loads(line) for line in _lines(path)]
    assert sorted((r["worker"], r["i"]) for r in records) == [(w, i) for w in range(threads) for i in range(per_thread)]


def test_bad_fields_append_nothing(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    with AuditLog(path) as log:
        with pytest.raises(ValueError, match="reserved"):
            log.append("accepted", seq=7)
        with pytest.raises(TypeError, match="'blob'"):
            log.append("accepted", blob=b"bytes")
        with pytest.raises(TypeError, match="'eps'"):
            log.append("accepted", eps=float("nan"))
        with pytest.raises(ValueError, match="non-empty"):
            log.append("")
        assert log.lines == 0
        log.append("accepted", ok=True)
    assert verify_audit_log(path).lines == 1


def test_missing_log_is_a_store_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="cannot read audit log"):
        verify_audit_log(tmp_path / "none.jsonl")


# -- the signed head ---------------------------------------------------------------------------------------


@pytest.fixture
def zone_keys(tmp_path: Path) -> dict[str, Any]:
    """A federation CA, zone eu-1 and a second zone eu-2 (another key), and a zone of a rogue CA."""
    ca = init_ca(tmp_path / "ca")
    eu1 = issue_zone(tmp_path / "ca", "eu-1", "EU", tmp_path / "zones")
    eu2 = issue_zone(tmp_path / "ca", "eu-2", "EU", tmp_path / "zones")
    init_ca(tmp_path / "rogue-ca")
    rogue = issue_zone(tmp_path / "rogue-ca", "eu-1", "EU", tmp_path / "rogue")
    return {"ca": ca.cert, "eu-1": eu1, "eu-2": eu2, "rogue": rogue}


def _signer(paths: Any) -> HeadSigner:
    return HeadSigner.from_files(paths.key, paths.cert)


def _trusting(zone_keys: dict[str, Any]) -> HeadVerifier:
    return HeadVerifier.from_files(zone_keys["eu-1"].cert, zone_keys["ca"])


def _write_signed(path: Path, zone_keys: dict[str, Any], n: int = 5) -> str:
    # the real clock: the head is checked against the certificate's validity when it was signed
    with AuditLog(path, signer=_signer(zone_keys["eu-1"])) as log:
        for i in range(n):
            log.append(Decision.REFUSED, site="hospital-a", round=i, reason="frame")
        return log.head


def _line(seq: int, when: float, decision: str, prev: str, fields: dict[str, Any]) -> tuple[bytes, str]:
    """A record line with a correct hash, in canonical form: what anyone can compute."""
    body = {"seq": seq, "time": when, "decision": decision, **fields, "prev": prev}
    digest = record_hash(body)
    order = ["seq", "time", "decision", *sorted(fields), "prev", "hash"]
    values = {**body, "hash": digest}
    text = ",".join(f"{json.dumps(k)}:{json.dumps(values[k], sort_keys=True, separators=(',', ':'))}" for k in order)
    return ("{" + text + "}\n").encode(), digest


def _forge_append(path: Path, **fields: Any) -> None:
    """Append a record with a correct hash chain, as anyone who can write the file could."""
    last = json.loads(_lines(path)[-1])
    line, _ = _line(last["seq"] + 1, last["time"] + 1, "accepted", last["hash"], fields)
    with path.open("ab") as fh:
        fh.write(line)


def test_signed_log_verifies_and_names_its_zone(tmp_path: Path, zone_keys: dict[str, Any]) -> None:
    path = tmp_path / "audit.jsonl"
    head = _write_signed(path, zone_keys)
    fingerprint = read_identity(zone_keys["eu-1"].cert.read_bytes(), zone_keys["ca"].read_bytes()).fingerprint
    verdict = verify_audit_log(path, verifier=_trusting(zone_keys))
    assert (verdict.ok, verdict.lines, verdict.head, verdict.adopted) == (True, 5, head, ())
    assert verdict.signed is not None
    assert (verdict.signed.zone, verdict.signed.fingerprint, verdict.signed.lines) == ("eu-1", fingerprint, 5)
    assert verdict.signed.trusted
    assert verdict.decisions == {"refused": 5}
    only_ca = verify_audit_log(path, verifier=HeadVerifier.from_files(ca=zone_keys["ca"]))
    assert only_ca.ok and only_ca.signed is not None and only_ca.signed.trusted
    untrusted = verify_audit_log(path)  # no anchor: the head file is checked against itself only
    assert untrusted.ok and untrusted.signed is not None and not untrusted.signed.trusted


def test_head_file_format(tmp_path: Path, zone_keys: dict[str, Any]) -> None:
    """Pins the head file: canonical JSON, the signature over the domain string and the named fields."""
    path = tmp_path / "audit.jsonl"
    head = _write_signed(path, zone_keys, 2)
    raw = (tmp_path / "audit.head.json").read_bytes()
    record = json.loads(raw)
    assert list(record) == sorted(record)
    assert set(record) == {"version", "lines", "head", "zone", "time", "fingerprint", "cert", "signature"}
    assert (record["version"], record["lines"], record["head"], record["zone"]) == (1, 2, head, "eu-1")
    assert record["cert"].encode() == zone_keys["eu-1"].cert.read_bytes()
    signed = {k: record[k] for k in ("version", "lines", "head", "zone", "time", "fingerprint")}
    payload = b"fedshard audit head v1\n" + json.dumps(signed, sort_keys=True, separators=(",", ":")).encode()
    public = x509.load_pem_x509_certificate(record["cert"].encode()).public_key()
    assert isinstance(public, ec.EllipticCurvePublicKey)
    public.verify(bytes.fromhex(record["signature"]), payload, ec.ECDSA(hashes.SHA256()))  # raises if not


def test_any_changed_byte_names_its_line(tmp_path: Path, zone_keys: dict[str, Any]) -> None:
    path = tmp_path / "audit.jsonl"
    _write_signed(path, zone_keys, 3)
    original = path.read_bytes()
    verifier = _trusting(zone_keys)
    starts = [0]
    for line in _lines(path):
        starts.append(starts[-1] + len(line))
    for offset in range(len(original)):
        changed = bytearray(original)
        changed[offset] ^= 0x01
        path.write_bytes(bytes(changed))
        line = next(i for i in range(3) if starts[i] <= offset < starts[i + 1]) + 1
        verdict = verify_audit_log(path, verifier=verifier)
        assert (verdict.ok, verdict.first_bad_line) == (False, line), (offset, verdict)
    path.write_bytes(original)
    assert verify_audit_log(path, verifier=_trusting(zone_keys)).ok


def test_record_appended_after_the_signed_head_is_detected(tmp_path: Path, zone_keys: dict[str, Any]) -> None:
    path = tmp_path / "audit.jsonl"
    _write_signed(path, zone_keys)
    _forge_append(path, site="hospital-a", round=9)
    assert verify_audit_log(path, verifier=None, expected_head=None).first_bad_line == 6  # even unanchored
    verdict = verify_audit_log(path, verifier=_trusting(zone_keys))
    assert (verdict.ok, verdict.first_bad_line, verdict.lines) == (False, 6, 6)
    assert verdict.reason == "line 6 was appended after the head the zone signed (line 5): not written by the zone"
    _forge_append(path, site="hospital-b")
    assert "lines 6-7 were appended" in str(verify_audit_log(path).reason)


def test_cut_tail_is_detected_through_the_signed_head(tmp_path: Path, zone_keys: dict[str, Any]) -> None:
    path = tmp_path / "audit.jsonl"
    _write_signed(path, zone_keys)
    path.write_bytes(b"".join(_lines(path)[:-2]))
    verdict = verify_audit_log(path, verifier=_trusting(zone_keys))
    assert (verdict.ok, verdict.first_bad_line) == (False, 4)
    assert verdict.reason is not None and "covers 5 lines but the log has 3: lines 4-5 were removed" in verdict.reason
    path.write_bytes(b"")
    assert verify_audit_log(path).first_bad_line == 1


def test_rewritten_chain_does_not_match_the_signed_head(tmp_path: Path, zone_keys: dict[str, Any]) -> None:
    """Someone rewrites a record and recomputes every hash after it: the chain holds, the signed head does not."""
    path = tmp_path / "audit.jsonl"
    _write_signed(path, zone_keys, 3)
    prev, out = GENESIS, b""
    for record in (json.loads(line) for line in _lines(path)):
        fields = {k: v for k, v in record.items() if k not in ("seq", "time", "decision", "prev", "hash")}
        if record["seq"] == 2:
            fields["site"] = "hospital-z"
        line, prev = _line(record["seq"], record["time"], record["decision"], prev, fields)
        out += line
    path.write_bytes(out)
    assert verify_audit_log(path, verifier=None).first_bad_line == 3  # the chain holds; the head names line 3
    verdict = verify_audit_log(path, verifier=_trusting(zone_keys))
    assert (verdict.ok, verdict.first_bad_line) == (False, 3)
    assert verdict.reason == "line 3 does not match the signed head: the log was rewritten up to there"


def test_head_signed_by_another_key_is_refused(tmp_path: Path, zone_keys: dict[str, Any]) -> None:
    path = tmp_path / "audit.jsonl"
    _write_signed(path, zone_keys)
    head_file = tmp_path / "audit.head.json"
    genuine = head_file.read_bytes()
    record = json.loads(genuine)

    # eu-2's key over a head that names eu-1's certificate: the signature does not verify
    forged = _signer(zone_keys["eu-2"]).sign(record["lines"], record["head"], record["time"])
    swapped = {**record, "signature": forged.signature}
    head_file.write_bytes(json.dumps(swapped, sort_keys=True).encode())
    verdict = verify_audit_log(path)
    assert not verdict.ok and "signature does not verify" in str(verdict.reason)

    # eu-2 signs as itself: fine on its own, refused when eu-1's certificate is pinned
    head_file.write_bytes(forged.to_json())
    assert verify_audit_log(path).ok
    pinned = verify_audit_log(path, verifier=_trusting(zone_keys))
    assert not pinned.ok and "not by the given one" in str(pinned.reason)

    # a zone certificate of another CA, even named eu-1: refused against the federation CA
    head_file.write_bytes(_signer(zone_keys["rogue"]).sign(5, record["head"], record["time"]).to_json())
    assert verify_audit_log(path).ok  # self-consistent...
    by_ca = verify_audit_log(path, verifier=HeadVerifier.from_files(ca=zone_keys["ca"]))
    assert not by_ca.ok and "not issued by the federation CA" in str(by_ca.reason)

    # a head whose line count was edited without re-signing
    head_file.write_bytes(genuine.replace(b'"lines":5', b'"lines":4'))
    assert "signature does not verify" in str(verify_audit_log(path).reason)
    head_file.write_bytes(b"{not json")
    assert "not valid JSON" in str(verify_audit_log(path).reason)


def test_unsigned_log_says_so(tmp_path: Path, zone_keys: dict[str, Any]) -> None:
    path = tmp_path / "audit.jsonl"
    _write_log(path)
    verdict = verify_audit_log(path)
    assert verdict.ok and verdict.signed is None
    anchored = verify_audit_log(path, verifier=_trusting(zone_keys))
    assert not anchored.ok and "not signed" in str(anchored.reason)


def test_reopen_keeps_signing_without_adopting(tmp_path: Path, zone_keys: dict[str, Any]) -> None:
    path = tmp_path / "audit.jsonl"
    _write_signed(path, zone_keys, 3)
    with AuditLog(path, signer=_signer(zone_keys["eu-1"])) as log:
        log.append(Decision.SERVED, site="hospital-a")
        assert log.counts() == {"refused": 3, "served": 1}
    verdict = verify_audit_log(path, verifier=_trusting(zone_keys))
    assert verdict.ok and verdict.signed is not None and verdict.signed.lines == 4 and verdict.adopted == ()


def test_reopen_adopts_unsigned_lines_and_verification_reports_them(tmp_path: Path, zone_keys: dict[str, Any]) -> None:
    path = tmp_path / "audit.jsonl"
    _write_signed(path, zone_keys, 3)
    _forge_append(path, site="forger")  # while the zone was down (or a crash before signing)
    with AuditLog(path, signer=_signer(zone_keys["eu-1"])) as log:
        assert log.lines == 5
    adopted = json.loads(_lines(path)[-1])
    assert (adopted["decision"], adopted["unsigned_from"], adopted["unsigned_to"]) == ("adopted", 4, 4)
    verdict = verify_audit_log(path, verifier=_trusting(zone_keys))
    assert (verdict.ok, verdict.first_bad_line) == (False, 4)
    assert "adopted them at line 5" in str(verdict.reason)
    accepted = verify_audit_log(path, verifier=_trusting(zone_keys), allow_adopted=True)
    assert accepted.ok and accepted.adopted == (Adoption(4, 4, 5, "after the signed head (line 3)"),)


def test_signing_an_unsigned_log_adopts_all_of_it(tmp_path: Path, zone_keys: dict[str, Any]) -> None:
    path = tmp_path / "audit.jsonl"
    _write_log(path, 2)  # written by a zone running --insecure
    AuditLog(path, signer=_signer(zone_keys["eu-1"])).close()
    verdict = verify_audit_log(path, verifier=_trusting(zone_keys), allow_adopted=True)
    assert verdict.ok and verdict.adopted == (Adoption(1, 2, 3, "no signed head"),)


def test_reopen_refuses_a_cut_or_resigned_log_and_leaves_it_alone(tmp_path: Path, zone_keys: dict[str, Any]) -> None:
    path = tmp_path / "audit.jsonl"
    _write_signed(path, zone_keys)
    head_file = tmp_path / "audit.head.json"
    path.write_bytes(b"".join(_lines(path)[:-1]))
    cut, head = path.read_bytes(), head_file.read_bytes()
    with pytest.raises(StoreError, match="line 5 was removed from its end; keep"):
        AuditLog(path, signer=_signer(zone_keys["eu-1"]))
    assert (path.read_bytes(), head_file.read_bytes()) == (cut, head)
    head_file.write_bytes(head.replace(b'"lines":5', b'"lines":4'))
    with pytest.raises(StoreError, match="signature does not verify"):
        AuditLog(path, signer=_signer(zone_keys["eu-1"]))
    head_file.write_bytes(_signer(zone_keys["eu-2"]).sign(4, json.loads(_lines(path)[-1])["hash"], 1.0).to_json())
    with pytest.raises(StoreError, match="signed by zone 'eu-2', not 'eu-1'"):
        AuditLog(path, signer=_signer(zone_keys["eu-1"]))


def test_signer_refuses_a_key_of_another_certificate(zone_keys: dict[str, Any]) -> None:
    with pytest.raises(PkiError, match="does not belong to the zone certificate"):
        HeadSigner.from_files(zone_keys["eu-2"].key, zone_keys["eu-1"].cert)


def test_concurrent_signed_appends_end_in_one_signed_head(tmp_path: Path, zone_keys: dict[str, Any]) -> None:
    path = tmp_path / "audit.jsonl"
    with AuditLog(path, durable=False, signer=_signer(zone_keys["eu-1"])) as log:

        def work(worker: int) -> None:
            for i in range(25):
                log.append("served", worker=worker, i=i)

        pool = [threading.Thread(target=work, args=(w,)) for w in range(4)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
    verdict = verify_audit_log(path, verifier=_trusting(zone_keys))
    assert verdict.ok and verdict.signed is not None and verdict.signed.lines == 100


# -- fedshard audit verify ---------------------------------------------------------------------------------


def _audit_verify(*args: str) -> tuple[int, str]:
    """``fedshard audit verify ARGS`` (typer's runner); exit 2 and the error line as ``main`` prints it."""
    app = typer.Typer()
    app.add_typer(audit_app, name="audit")
    result = CliRunner().invoke(app, ["audit", "verify", *args], env={"COLUMNS": "400"})
    if isinstance(result.exception, FedshardError):
        return 2, f"error: {result.exception}"
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def test_cli_reports_the_signer_or_the_first_bad_record(tmp_path: Path, zone_keys: dict[str, Any]) -> None:
    path = tmp_path / "audit.jsonl"
    head = _write_signed(path, zone_keys, 3)
    cert, ca = str(zone_keys["eu-1"].cert), str(zone_keys["ca"])
    fingerprint = read_identity(zone_keys["eu-1"].cert.read_bytes(), zone_keys["ca"].read_bytes()).fingerprint
    code, out = _audit_verify("--log", str(path), "--cert", cert, "--ca", ca)
    assert code == 0, out
    assert f"3 lines, chain intact, head {head}, signed by zone eu-1 (fingerprint {fingerprint[:16]}…) at line 3" in out
    code, out = _audit_verify("--log", str(path))
    assert code == 0 and "certificate NOT checked: pass --cert or --ca" in out
    _forge_append(path, site="x")
    code, out = _audit_verify("--log", str(path), "--ca", ca)
    assert code == 2 and "line 4 was appended after the head the zone signed (line 3)" in out


def test_cli_says_an_unsigned_log_is_unsigned(tmp_path: Path, zone_keys: dict[str, Any]) -> None:
    path = tmp_path / "audit.jsonl"
    _write_log(path, 2)
    code, out = _audit_verify("--log", str(path))
    assert code == 0 and "2 lines, chain intact" in out and "NOT signed (the zone ran without a key)" in out
    code, out = _audit_verify("--log", str(path), "--ca", str(zone_keys["ca"]))
    assert code == 2 and "the log is not signed: no head file" in out


def test_an_append_under_a_barrier_waits_for_it_and_sync_flushes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A zone called by a site whose flushes are deferred (the in-process engine's batches) leaves the
    fsync of that site's audit record to the barrier; ``sync`` (a zone's close) flushes whatever waits."""
    import os

    from fedshard._fs import Barrier, deferred_to, syncfs_supported

    if not syncfs_supported():
        pytest.skip("no syncfs here: every append is flushed as it is made")
    flushed: list[str] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (flushed.append(os.readlink(f"/proc/self/fd/{fd}")), real(fd))[1])
    log = AuditLog(tmp_path / "audit.jsonl")
    flushed.clear()
    barrier = Barrier.over([tmp_path])
    assert barrier is not None
    with deferred_to(barrier):
        log.append("accepted", site="a")
    assert flushed == []
    log.append("published", round=1)  # an append outside the barrier is flushed at once
    assert flushed == [str(tmp_path / "audit.jsonl")]
    with deferred_to(barrier):
        log.append("accepted", site="b")
    log.sync()
    assert flushed == [str(tmp_path / "audit.jsonl")] * 2
    barrier.close()
    log.close()
    with pytest.raises(StoreError):
        log.sync()
    lines = (tmp_path / "audit.jsonl").read_text().splitlines()
    assert [json.loads(line)["decision"] for line in lines] == ["accepted", "published", "accepted"]
