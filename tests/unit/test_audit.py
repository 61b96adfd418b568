"""Hash-chained audit log: appends, verification, tamper detection, reopening, threads."""

from __future__ import annotations

import hashlib
import itertools
import json
import threading
from pathlib import Path

import pytest

from fedshard.errors import StoreError
from fedshard.residency.audit import GENESIS, AuditLog, Decision, verify_audit_log


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
