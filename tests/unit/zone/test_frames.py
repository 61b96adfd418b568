"""The one frame assembler (push, forward and fetch all go through it): every refusal it
makes, its no-copy rule, and that any cut of a stream reassembles exactly."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedshard.crypto.he import ENCRYPTED_DTYPE
from fedshard.errors import FrameError, RefusalCode, ShardError
from fedshard.integrity import ciphertext_digest, shard_digest
from fedshard.zone.frames import Chunk, Declared, FrameAssembler, Header, shard_chunks

W = np.arange(12, dtype=np.float32).reshape(3, 4)  # 48 bytes
B = np.array([[0.5], [-1.5]], dtype=np.float32)  # 8 bytes


def declared(*, layout: bool = True, digests: bool = True) -> dict[str, Declared]:
    """What a header declares of W and B: with the plan's layout (push, forward) or sizes only (fetch)."""
    out = {}
    for sid, arr in (("w", W), ("b", B)):
        dtype, shape = (arr.dtype.str, arr.shape) if layout else (None, None)
        out[sid] = Declared(sid, arr.nbytes, shard_digest(arr) if digests else None, dtype, shape, Header.PLAN)
    return out


def stream(chunk_bytes: int | None = 20) -> list[Chunk]:
    return [*shard_chunks("w", W, chunk_bytes), *shard_chunks("b", B, chunk_bytes)]


def assemble(chunks: list[Chunk], *, layout: bool = True) -> dict[str, np.ndarray]:
    assembler = FrameAssembler(declared(layout=layout), source=Header.MANIFEST)
    out = {}
    for chunk in chunks:
        done = assembler.add(chunk)
        if done is not None:
            out[done[0]] = done[1]
    assembler.finish()
    return out


def test_a_chunked_stream_is_reassembled() -> None:
    out = assemble(stream(20))

    np.testing.assert_array_equal(out["w"], W)
    np.testing.assert_array_equal(out["b"], B)
    assert out["w"].dtype == np.float32 and out["w"].shape == (3, 4)


def test_without_a_declared_layout_the_first_chunk_labels_it() -> None:
    out = assemble(stream(7), layout=False)

    np.testing.assert_array_equal(out["w"], W)
    assert out["w"].shape == (3, 4)


def test_a_one_chunk_shard_is_kept_as_received() -> None:
    data = W.tobytes()
    assembler = FrameAssembler(declared(), source=Header.MANIFEST)

    done = assembler.add(Chunk("w", 0, data, "<f4", (3, 4)))

    assert done is not None
    assert np.shares_memory(done[1], np.frombuffer(data, np.uint8))


def test_a_larger_shard_is_assembled_in_one_buffer_of_its_size() -> None:
    assembler = FrameAssembler(declared(), source=Header.MANIFEST)
    chunks = list(shard_chunks("w", W, 16))

    results = [assembler.add(c) for c in chunks]

    assert results[:-1] == [None, None]
    values = results[-1][1]  # type: ignore[index]
    owner = values
    while isinstance(owner, np.ndarray | memoryview):
        owner = owner.base if isinstance(owner, np.ndarray) else owner.obj
    assert isinstance(owner, bytearray) and len(owner) == W.nbytes  # decoded in place: no copy at the end
    np.testing.assert_array_equal(values, W)


def test_a_zero_size_shard_completes_at_its_first_chunk() -> None:
    empty = np.zeros((0, 3), np.float32)
    assembler = FrameAssembler({"e": Declared("e", 0, shard_digest(empty), "<f4", (0, 3))}, source=Header.HEADER)

    done = assembler.add(next(shard_chunks("e", empty)))
    assembler.finish()

    assert done is not None and done[1].shape == (0, 3)


def _edit(index: int, **changes: object) -> Callable[[list[Chunk]], list[Chunk]]:
    def edit(chunks: list[Chunk]) -> list[Chunk]:
        chunks[index] = chunks[index]._replace(**changes)  # type: ignore[arg-type]
        return chunks

    return edit


def _tamper(chunks: list[Chunk]) -> list[Chunk]:
    data = bytearray(chunks[1].data)
    data[0] ^= 1
    chunks[1] = chunks[1]._replace(data=bytes(data))
    return chunks


REFUSALS = [
    pytest.param(lambda c: c[1:], RefusalCode.OFFSET, "shard w starts at offset 20, expected 0", id="first-offset"),
    pytest.param(_edit(1, offset=24), RefusalCode.OFFSET, "shard w: chunk at offset 24, expected 20", id="gap"),
    pytest.param(lambda c: [c[0], c[0], *c[1:]], RefusalCode.OFFSET, "chunk at offset 0, expected 20", id="repeat"),
    pytest.param(
        _edit(2, data=bytes(12)), RefusalCode.SHAPE, "shard w: more than the plan's 48 bytes", id="more-bytes"
    ),
    pytest.param(lambda c: [*c[:2], *c[3:]], RefusalCode.TRUNCATED, "shard w ended after 40 bytes", id="cut"),
    pytest.param(lambda c: c[:2], RefusalCode.TRUNCATED, "shard w is incomplete", id="stream-ends"),
    pytest.param(
        lambda c: c[:3], RefusalCode.MISSING, "1 shard\\(s\\) of the manifest never arrived, e.g. b", id="missing"
    ),
    pytest.param(lambda c: [*c, c[3]], RefusalCode.DUPLICATE, "shard b sent twice", id="twice"),
    pytest.param(
        lambda c: [*c[:3], c[3]._replace(shard_id="x")], RefusalCode.UNKNOWN_SHARD, "x is not listed", id="unlisted"
    ),
    pytest.param(_tamper, RefusalCode.DIGEST, "shard w: digest does not match the manifest", id="digest"),
    pytest.param(_edit(0, dtype="<f8"), RefusalCode.DTYPE, "shard w has dtype <f8, the plan says <f4", id="dtype"),
    pytest.param(_edit(0, dtype=""), RefusalCode.DTYPE, "shard w has dtype \\?", id="no-dtype"),
    pytest.param(_edit(0, dtype="f4,f4"), RefusalCode.DTYPE, "shard w has dtype f4,f4", id="structured"),
    pytest.param(_edit(0, dtype="not-a-dtype"), RefusalCode.DTYPE, "has dtype not-a-dtype", id="garbage-dtype"),
    pytest.param(
        _edit(0, shape=(4, 3)), RefusalCode.SHAPE, "shard w has shape \\(4, 3\\), the plan says \\(3, 4\\)", id="shape"
    ),
]


@pytest.mark.parametrize(("edit", "code", "match"), REFUSALS)
def test_each_break_of_the_header_is_refused_with_its_code(
    edit: Callable[[list[Chunk]], list[Chunk]], code: RefusalCode, match: str
) -> None:
    with pytest.raises(FrameError, match=match) as info:
        assemble(edit(stream(20)))

    assert info.value.code is code
    assert "\n" not in str(info.value)


SIZE_ONLY_REFUSALS = [
    pytest.param(
        _edit(0, dtype=">f4"), RefusalCode.DTYPE, "shard w has dtype >f4, not a little-endian", id="big-endian"
    ),
    pytest.param(_edit(0, dtype="|O"), RefusalCode.DTYPE, "not a little-endian number type", id="object"),
    pytest.param(
        _edit(0, shape=(4, 4)), RefusalCode.SHAPE, "shape \\(4, 4\\) make 64 bytes, the plan says 48", id="size"
    ),
    pytest.param(_edit(0, dtype="<f8"), RefusalCode.SHAPE, "dtype <f8 and shape \\(3, 4\\) make 96 bytes", id="wider"),
    pytest.param(_edit(0, dtype="<i4"), RefusalCode.DIGEST, "shard w: digest does not match", id="reinterpreted"),
]


@pytest.mark.parametrize(("edit", "code", "match"), SIZE_ONLY_REFUSALS)
def test_without_a_declared_layout_the_labels_must_fit_the_size_and_digest(
    edit: Callable[[list[Chunk]], list[Chunk]], code: RefusalCode, match: str
) -> None:
    with pytest.raises(FrameError, match=match) as info:
        assemble(edit(stream(20)), layout=False)

    assert info.value.code is code


@settings(max_examples=60, deadline=None)
@given(cuts=st.lists(st.integers(min_value=1, max_value=48), min_size=1, max_size=12))
def test_any_cut_of_the_stream_reassembles_exactly(cuts: list[int]) -> None:
    chunks: list[Chunk] = []
    for sid, arr in (("w", W), ("b", B)):
        raw = arr.tobytes()
        offset, i = 0, 0
        while offset < len(raw):
            size = cuts[i % len(cuts)]
            labels = (arr.dtype.str, arr.shape) if offset == 0 else ("", ())
            chunks.append(Chunk(sid, offset, raw[offset : offset + size], *labels))
            offset, i = offset + size, i + 1

    out = assemble(chunks)

    np.testing.assert_array_equal(out["w"], W)
    np.testing.assert_array_equal(out["b"], B)


# ciphertext ------------------------------------------------------------------------------------

BLOB = bytes(range(256)) * 3  # stands for ciphertext: the assembler never parses it


def ciphertext_declared() -> dict[str, Declared]:
    return {"c": Declared("c", len(BLOB), ciphertext_digest(BLOB), declared_by=Header.MANIFEST, encrypted=True)}


def test_a_one_chunk_ciphertext_is_the_bytes_received() -> None:
    assembler = FrameAssembler(ciphertext_declared(), source=Header.MANIFEST)

    (chunk,) = shard_chunks("c", BLOB, encrypted=True)
    done = assembler.add(chunk)

    assert chunk.dtype == ENCRYPTED_DTYPE and chunk.shape == ()
    assert done is not None and done[1] is BLOB


def test_a_chunked_ciphertext_is_joined_once_into_bytes() -> None:
    assembler = FrameAssembler(ciphertext_declared(), source=Header.MANIFEST)

    results = [assembler.add(c) for c in shard_chunks("c", BLOB, 100, encrypted=True)]
    assembler.finish()

    assert results[:-1] == [None] * 7
    assert results[-1] == ("c", BLOB) and type(results[-1][1]) is bytes  # type: ignore[index]


@pytest.mark.parametrize(("dtype", "shape"), [("|u1", (1, len(BLOB))), ("<f4", ()), ("", ())])
def test_a_ciphertext_labelled_otherwise_is_refused(dtype: str, shape: tuple[int, ...]) -> None:
    assembler = FrameAssembler(ciphertext_declared(), source=Header.MANIFEST)

    with pytest.raises(FrameError, match=f"shard c has dtype .*, the manifest says {ENCRYPTED_DTYPE}") as info:
        assembler.add(Chunk("c", 0, BLOB, dtype, shape))

    assert info.value.code is RefusalCode.DTYPE


def test_a_ciphertext_with_a_shape_is_refused() -> None:
    assembler = FrameAssembler(ciphertext_declared(), source=Header.MANIFEST)

    with pytest.raises(FrameError, match=r"shard c is ciphertext, which has no shape; got \(1, 768\)") as info:
        assembler.add(Chunk("c", 0, BLOB, ENCRYPTED_DTYPE, (1, len(BLOB))))

    assert info.value.code is RefusalCode.SHAPE


def test_a_tampered_ciphertext_is_refused_on_its_digest() -> None:
    assembler = FrameAssembler(ciphertext_declared(), source=Header.MANIFEST)

    with pytest.raises(FrameError, match="shard c: digest does not match the manifest") as info:
        assembler.add(Chunk("c", 0, BLOB[:-1] + b"\x00", ENCRYPTED_DTYPE))

    assert info.value.code is RefusalCode.DIGEST


def test_a_clear_shard_sent_as_ciphertext_is_refused_by_its_label() -> None:
    with pytest.raises(FrameError, match="shard w has dtype he, the plan says <f4") as info:
        assemble([Chunk("w", 0, W.tobytes(), ENCRYPTED_DTYPE), *shard_chunks("b", B)])

    assert info.value.code is RefusalCode.DTYPE


def test_chunks_are_cut_as_the_header_says_the_shard_is() -> None:
    with pytest.raises(ShardError, match="ciphertext bytes for a shard its header lists in clear"):
        list(shard_chunks("c", BLOB))
    with pytest.raises(ShardError, match="listed as encrypted but holds float32 values"):
        list(shard_chunks("w", W, encrypted=True))
    as_array = np.frombuffer(BLOB, np.uint8).reshape(1, -1)  # how ciphertexts travelled before they were bytes
    with pytest.raises(ShardError, match="listed as encrypted but holds uint8 values, not ciphertext bytes"):
        list(shard_chunks("c", as_array, encrypted=True))
    pieces = list(shard_chunks("c", BLOB, 100, encrypted=True))
    assert b"".join(bytes(c.data) for c in pieces) == BLOB
    assert [(c.offset, c.dtype, c.shape) for c in pieces[:2]] == [(0, ENCRYPTED_DTYPE, ()), (100, "", ())]
