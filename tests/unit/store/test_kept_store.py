"""A sealed store kept open between uses (:class:`fedshard.store.kept.KeptStore`): opened once while
its catalog and key table are as this process left them, afresh (with every check) after any other change."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedshard.crypto.at_rest import Kek
from fedshard.errors import StoreError
from fedshard.store import LocalDirBackend, SealedShardStore
from fedshard.store.catalog import CATALOG
from fedshard.store.kept import KeptStore
from fedshard.store.rotation import rotate_keys


@pytest.fixture
def opens(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every SealedShardStore.open, by location."""
    seen: list[str] = []
    real = SealedShardStore.open.__func__  # type: ignore[attr-defined]

    def counted(cls: type[SealedShardStore], location: object, *args: object, **kwargs: object) -> SealedShardStore:
        seen.append(str(location))
        return real(cls, location, *args, **kwargs)  # type: ignore[no-any-return]

    monkeypatch.setattr(SealedShardStore, "open", classmethod(counted))
    return seen


def test_uses_share_one_open_store_while_its_files_are_unchanged(tmp_path: Path, opens: list[str]) -> None:
    kept = KeptStore(tmp_path / "store", Kek.generate())
    with kept.use(create=True) as store:
        store.put("a", np.arange(4, dtype=np.float32))
    with kept.use() as again:
        assert again is store and again.get("a").tolist() == [0, 1, 2, 3]
        again.set_meta("m", {"x": 1})  # its own commit: the kept store stays valid
    with kept.use() as third:
        assert third is store and third.get_meta("m") == {"x": 1}
    assert len(opens) == 1


def test_another_writer_s_commit_makes_the_next_use_open_the_store_afresh(tmp_path: Path, opens: list[str]) -> None:
    kek = Kek.generate()
    kept = KeptStore(tmp_path / "store", kek)
    with kept.use(create=True) as store:
        store.put("a", np.zeros(3, dtype=np.float32))
    with SealedShardStore.open(tmp_path / "store", kek) as other:
        other.put("a", np.ones(3, dtype=np.float32))
    with kept.use() as fresh:
        assert fresh is not store and fresh.get("a").tolist() == [1, 1, 1]


def test_an_edited_catalog_is_refused_at_the_next_use(tmp_path: Path) -> None:
    kept = KeptStore(tmp_path / "store", Kek.generate())
    with kept.use(create=True) as store:
        store.put("a", np.zeros(3, dtype=np.float32))
    catalog = tmp_path / "store" / CATALOG
    raw = bytearray(catalog.read_bytes())
    raw[-2] ^= 1
    (tmp_path / "edited").write_bytes(bytes(raw))
    (tmp_path / "edited").replace(catalog)  # as any writer replaces it (an edit in place changes its times)
    with pytest.raises(StoreError), kept.use():
        pass


def test_a_key_rotation_makes_the_next_use_open_the_store_under_its_new_key(tmp_path: Path) -> None:
    old, new = Kek.generate(), Kek.generate()
    kept = KeptStore(tmp_path / "store", old)
    with kept.use(create=True) as store:
        store.put("a", np.full(2, 7, dtype=np.float32))
    rotate_keys(LocalDirBackend(tmp_path / "store"), old, new)
    with pytest.raises(StoreError), kept.use():  # the key table changed: opened afresh, and the old KEK is retired
        pass
    with KeptStore(tmp_path / "store", new).use() as rotated:
        assert rotated.get("a").tolist() == [7, 7]


def test_a_use_that_raised_drops_the_kept_store(tmp_path: Path, opens: list[str]) -> None:
    kept = KeptStore(tmp_path / "store", Kek.generate())
    with kept.use(create=True) as store:
        store.put("a", np.zeros(1, dtype=np.float32))
    with pytest.raises(RuntimeError), kept.use():
        raise RuntimeError("the block failed half-way")
    assert not kept.is_open()
    with kept.use() as again:
        assert again is not store
    assert len(opens) == 2


def test_a_remote_store_is_opened_at_every_use(opens: list[str]) -> None:
    kept = KeptStore("memory://fedshard-tests/kept", Kek.generate())
    with kept.use(create=True) as store:
        store.put("a", np.zeros(1, dtype=np.float32))
    with kept.use():
        pass
    assert len(opens) == 2 and not kept.is_open()


def test_the_files_stamp_follows_every_file_the_catalog_names(tmp_path: Path) -> None:
    """What a site compares between messages: unchanged while the store is as it left it, changed by
    a rewritten blob, and absent (not comparable) once another process committed."""
    kek = Kek.generate()
    kept = KeptStore(tmp_path / "store", kek)
    assert kept.files_stamp() is None  # nothing kept yet
    with kept.use(create=True) as store:
        store.put_many({"a": np.zeros(3, dtype=np.float32), "b": np.ones(2, dtype=np.float32)})
    first = kept.files_stamp()
    assert first is not None and len(first) == 4  # catalog, key table, two blobs
    assert kept.files_stamp() == first
    blob = tmp_path / "store" / store.blob_names()[0]
    copy = blob.with_name(blob.name + ".copy")
    copy.write_bytes(blob.read_bytes())
    copy.replace(blob)  # the same bytes in another file (as a restored backup would be): another stamp
    assert kept.files_stamp() not in (None, first)
    with SealedShardStore.open(tmp_path / "store", kek) as other:
        other.put("a", np.ones(3, dtype=np.float32))
    assert kept.files_stamp() is None
