"""Cold formats (round-trip error within the documented bound) and hot/cold tiering of a store."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fedshard.crypto.at_rest import Kek
from fedshard.errors import ConfigError
from fedshard.store import ColdFormat, SealedShardStore, Tier, parse_age
from fedshard.store._backend import Backend
from fedshard.store.quantize import (
    BLOCK,
    _fp8_values,
    decode,
    encodable,
    encode,
    encoded_nbytes,
    error_bound,
    fp8_codes,
)
from fedshard.store.sealed_store import blob_name

FORMATS = list(ColdFormat)

finite32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
arrays32 = hnp.arrays(np.float32, st.integers(1, 300), elements=finite32)
# values of very different magnitudes in one block: the case per-block scales must handle
mixed = hnp.arrays(
    np.float32,
    st.integers(1, 200),
    elements=st.one_of(
        st.floats(-(2.0**-100), 2.0**-100, width=32),
        st.floats(-1024, 1024, width=32),
        st.sampled_from([0.0, -0.0, 3e38, -3e38]),
    ),
)


@pytest.mark.parametrize("fmt", FORMATS)
@settings(max_examples=150, deadline=None)
@given(values=st.one_of(arrays32, mixed))
def test_round_trip_error_is_within_the_documented_bound(fmt: ColdFormat, values: np.ndarray) -> None:
    payload = encode(values, fmt)
    assert len(payload) == encoded_nbytes(values.size, fmt)
    decoded = decode(payload, fmt, values.size)
    assert decoded.dtype == np.float32 and decoded.shape == (values.size,)
    error = np.abs(decoded.astype(np.float64) - values.astype(np.float64).reshape(-1))
    bound = error_bound(values, fmt)
    worst = int(np.argmax(error - bound))
    assert (error <= bound).all(), f"value {values.reshape(-1)[worst]!r}: error {error[worst]} > bound {bound[worst]}"


@pytest.mark.parametrize(
    ("fmt", "step"),
    [(ColdFormat.INT8, 1 / 127), (ColdFormat.INT4, 1 / 7), (ColdFormat.FP8, None)],
)
def test_bound_is_the_documented_one_and_is_reached(fmt: ColdFormat, step: float | None) -> None:
    """On blocks with max |x| = 1 the bound is s/2 (int) or 2^-4·|x| + 2^-10·s (fp8), plus float32 rounding
    (2^-23·|x|), and errors come close to it."""
    rng = np.random.default_rng(1)
    values = rng.uniform(-1, 1, BLOCK * 500).astype(np.float32)
    values[::BLOCK] = 1.0  # every block's max |x| is 1
    error = np.abs(decode(encode(values, fmt), fmt, values.size) - values)
    bound = error_bound(values, fmt)
    if step is not None:
        np.testing.assert_allclose(bound, step / 2 + 2**-23 * np.abs(values), rtol=1e-6)
    else:
        s = 1 / 448
        np.testing.assert_allclose(bound, 2**-4 * np.abs(values) + 2**-10 * s, rtol=1e-5, atol=1e-12)
    assert (error <= bound).all() and (error / bound).max() > 0.9


def test_sizes_and_what_can_go_cold() -> None:
    assert encoded_nbytes(256 * 256, ColdFormat.INT8) == 65536 + 4096
    assert encoded_nbytes(256 * 256, ColdFormat.FP8) == 65536 + 4096
    assert encoded_nbytes(256 * 256, ColdFormat.INT4) == 32768 + 4096
    assert encodable(np.ones(3, np.float32)) and encodable(np.ones(3, np.float64))
    assert not encodable(np.array([1, np.nan], np.float32))
    assert not encodable(np.array([1e300]))  # beyond float32
    assert not encodable(np.ones(3, np.float16)) and not encodable(np.ones(3, np.int32))


def test_parse_age() -> None:
    assert parse_age("90d") == 90 * 86400
    assert parse_age("12h") == 43200 and parse_age("1.5m") == 90 and parse_age("2w") == 14 * 86400
    with pytest.raises(ConfigError, match=r"e\.g\. 90d"):
        parse_age("90 days")


@pytest.mark.parametrize("fmt", FORMATS)
def test_tiering_moves_cold_shards_and_writes_bring_them_back(
    backend: Backend, kek: Kek, clock: object, fmt: ColdFormat
) -> None:
    store = SealedShardStore.create(backend, kek, clock=clock)  # type: ignore[arg-type]
    rng = np.random.default_rng(0)
    old = {f"w{i}": rng.standard_normal((32, 48)).astype(np.float32) for i in range(3)}
    store.put_many({**old, "steps": np.array([3], np.int64)})
    clock.advance(100 * 86400)  # type: ignore[attr-defined]
    store.put("recent", np.ones((4, 4), np.float32))
    store.get("w2")  # a read keeps a shard hot
    clock.advance(10)  # type: ignore[attr-defined]

    report = store.tier(parse_age("90d"), fmt)

    assert sorted(report.moved) == ["w0", "w1"] and report.skipped == ["steps"]
    assert report.bytes_after < report.bytes_before
    for s in (store, SealedShardStore.open(backend, kek)):
        for sid in ("w0", "w1"):
            stat = s.stat(sid)
            assert stat.tier is Tier.COLD and stat.encoding == fmt.value and stat.version == 2
            got = s.get(sid)
            assert got.dtype == np.float32 and got.shape == (32, 48)
            assert (np.abs(got - old[sid]) <= error_bound(old[sid], fmt).reshape(32, 48)).all()
        assert s.stat("w2").tier is Tier.HOT and s.stat("recent").tier is Tier.HOT
    assert len(backend.list("blobs/")) == 5  # superseded hot blobs are gone

    stats = store.stats()
    assert stats.tiers["cold"].shards == 2 and stats.tiers["hot"].shards == 3
    assert stats.tiers["cold"].logical_bytes == 2 * 32 * 48 * 4
    assert stats.tiers["cold"].stored_bytes < stats.tiers["cold"].logical_bytes
    err = stats.formats[fmt.value]
    assert err.shards == 2 and err.values == 2 * 32 * 48
    worst = max(float(np.abs(store.get(sid) - old[sid]).max()) for sid in ("w0", "w1"))
    assert err.max_abs == pytest.approx(worst) and 0 < err.relative_rms < 0.2

    store.put("w0", old["w0"])  # written again: hot, full precision
    stat = store.stat("w0")
    assert stat.tier is Tier.HOT and stat.version == 3
    np.testing.assert_array_equal(store.get("w0"), old["w0"])
    assert store.tier(parse_age("90d"), fmt).moved == []  # w0 was just written


def test_cold_shards_keep_their_full_precision_digest(backend: Backend, kek: Kek, clock: object) -> None:
    store = SealedShardStore.create(backend, kek, clock=clock)  # type: ignore[arg-type]
    first = store.put("w", np.linspace(-1, 1, 300, dtype=np.float32))
    clock.advance(1000)  # type: ignore[attr-defined]
    store.tier(10, ColdFormat.INT4)
    cold = store.stat("w")
    assert cold.source_digest == first.digest and cold.digest != first.digest


def test_a_damaged_shard_does_not_stop_tiering(backend: Backend, kek: Kek, clock: object) -> None:
    store = SealedShardStore.create(backend, kek, clock=clock)  # type: ignore[arg-type]
    store.put_many({f"w{i}": np.full((8, 8), i, np.float32) for i in range(3)})
    name = blob_name("w1", 1)
    raw = backend.read(name)
    assert raw is not None
    backend.write(name, raw[:-1])
    clock.advance(1000)  # type: ignore[attr-defined]
    report = store.tier(10, ColdFormat.INT8)
    assert sorted(report.moved) == ["w0", "w2"] and report.damaged == ["w1"]
    assert backend.read(name) == raw[:-1]  # left as it was, for `fedshard verify` to report
    np.testing.assert_allclose(store.get("w2"), np.full((8, 8), 2, np.float32), rtol=1e-6)


def test_fp8_codes_are_torchs() -> None:
    """The NumPy E4M3 encoder gives torch's codes: random values, every code's value, and every tie."""
    import torch

    values = _fp8_values()[:127]
    midpoints = (values[:-1] + values[1:]) / 2  # ties: exactly between two codes
    rng = np.random.default_rng(2)
    samples = np.concatenate(
        [
            values,
            midpoints,
            -midpoints,
            rng.uniform(-448, 448, 20_000),
            rng.standard_normal(20_000) * 2.0 ** rng.integers(-12, 8, 20_000),
            [0.0, -0.0, 448.0, -448.0, 2.0**-9, 2.0**-10, 3 * 2.0**-11],
        ]
    ).astype(np.float32)
    want = torch.from_numpy(samples).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    np.testing.assert_array_equal(fp8_codes(samples), want)
