"""The shard-store commands: `store tier/stats/keygen`, `verify --store`, `keys rotate` (typer's CliRunner).

The app below wires the commands the way ``fedshard.cli.main`` does.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from fedshard.cli._keys import keys_app
from fedshard.cli._store import store_app, verify_store
from fedshard.crypto.at_rest import KEK_ENV, KEK_FILE_ENV, NEW_KEK_ENV, load_kek
from fedshard.errors import ConfigError, FedshardError, StoreError, StoreKeyError
from fedshard.sharding import ShardPlan
from fedshard.store import LocalDirBackend, SealedShardStore, Tier, catalog
from fedshard.store.model_io import write_tensors
from fedshard.store.sealed_store import blob_name

app = typer.Typer()
app.add_typer(store_app, name="store")
app.command("verify")(verify_store)
app.add_typer(keys_app, name="keys")


@pytest.fixture(autouse=True)
def _no_key_in_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (KEK_ENV, KEK_FILE_ENV, NEW_KEK_ENV):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def _invoke(runner: CliRunner, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = runner.invoke(app, list(args), env={"COLUMNS": "200", **(env or {})})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def _site_store(tmp_path: Path, runner: CliRunner) -> tuple[Path, Path]:
    """A store holding a small model, written 100 days ago; and its key file (made by `store keygen`)."""
    key = tmp_path / "keys" / "site.kek"
    code, out = _invoke(runner, "store", "keygen", "--out", str(key))
    assert code == 0 and "mode 600" in out and key.stat().st_mode & 0o777 == 0o600
    store_dir = tmp_path / "store"
    rng = np.random.default_rng(0)
    tensors = {"layer.weight": rng.standard_normal((40, 30)).astype(np.float32), "layer.bias": np.zeros(40, np.float32)}
    plan = ShardPlan.from_state_dict(tensors, tile=(16, 16))
    long_ago = 1_000_000.0
    store = SealedShardStore.create(store_dir, load_kek(key), clock=lambda: long_ago)
    write_tensors(store, plan, tensors.items())
    return store_dir, key


def test_stats_tier_verify_rotate(tmp_path: Path, runner: CliRunner) -> None:
    store_dir, key = _site_store(tmp_path, runner)
    store_opt, key_opt = ["--store", str(store_dir)], ["--key-file", str(key)]

    code, out = _invoke(runner, "store", "stats", *store_opt, *key_opt, "--json")
    stats = json.loads(out)
    assert code == 0 and stats["authenticated"] and stats["tiers"]["hot"]["shards"] == 9
    assert stats["tiers"]["cold"]["shards"] == 0 and stats["formats"] == {}

    code, out = _invoke(runner, "store", "tier", *store_opt, *key_opt, "--older-than", "90d", "--format", "int4")
    assert code == 0 and "moved 9 shard(s) to the cold tier (int4)" in out

    code, out = _invoke(runner, "store", "stats", *store_opt, *key_opt)
    assert code == 0 and "int4" in out and "max|block|/14" in out and "cold" in out
    code, out = _invoke(runner, "store", "stats", *store_opt, "--json")  # no key: counts, not authenticated
    stats = json.loads(out)
    assert not stats["authenticated"] and stats["tiers"]["cold"]["shards"] == 9
    assert stats["formats"]["int4"]["values"] == 40 * 30 + 40 and 0 < stats["formats"]["int4"]["relative_rms"] < 0.2

    code, out = _invoke(runner, "verify", *store_opt, *key_opt)
    assert code == 0 and "all shards verified" in out and "model version" in out

    new_key = tmp_path / "keys" / "next.kek"
    assert _invoke(runner, "store", "keygen", "--out", str(new_key))[0] == 0
    code, out = _invoke(runner, "keys", "rotate", *store_opt, *key_opt, "--new-key-file", str(new_key))
    assert code == 0 and "re-wrapped 9 data keys" in out and "no longer opens this store" in out
    with pytest.raises(StoreKeyError, match="retired"):
        _invoke(runner, "verify", *store_opt, *key_opt)
    code, out = _invoke(runner, "verify", *store_opt, env={KEK_FILE_ENV: str(new_key)})
    assert code == 0 and "all shards verified" in out

    # the same rotation again (new key from the environment) has nothing to do; the old key rotates nothing else
    code, out = _invoke(runner, "keys", "rotate", *store_opt, *key_opt, env={NEW_KEK_ENV: load_kek(new_key).to_text()})
    assert code == 0 and "already sealed under key" in out and "nothing to do" in out
    with pytest.raises(StoreKeyError, match="retired"):
        _invoke(runner, "keys", "rotate", *store_opt, *key_opt, env={NEW_KEK_ENV: "ab" * 32})


def test_verify_lists_what_is_wrong_and_exits_1(tmp_path: Path, runner: CliRunner) -> None:
    store_dir, key = _site_store(tmp_path, runner)
    kek = load_kek(key)
    store = SealedShardStore.open(store_dir, kek)
    backend = LocalDirBackend(store_dir)
    victim = "layer.weight#r1c1"
    path = store_dir / blob_name(victim, store.stat(victim).version)
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) - 7])  # truncated
    backend.delete(blob_name("layer.bias#r0c0", store.stat("layer.bias#r0c0").version))

    code, out = _invoke(runner, "verify", "--store", str(store_dir), "--key-file", str(key))
    assert code == 1
    assert f"shard {victim}: stored file" in out and "truncated" in out
    assert "layer.bias#r0c0: its stored file" in out and "2 problem(s)" in out

    code, out = _invoke(runner, "verify", "--store", str(store_dir), "--key-file", str(key), "--json")
    report = json.loads(out)
    assert code == 1 and not report["ok"]
    assert sorted(p["shard"] for p in report["problems"]) == ["layer.bias#r0c0", victim]

    code, out = _invoke(runner, "verify", "--store", str(store_dir), "--key-file", str(key), "--version", "ab" * 32)
    assert code == 1 and "expected abababab" in out
    # the other shards are still fine
    assert store.stat("layer.weight#r0c0").tier is Tier.HOT and store.get("layer.weight#r0c0").shape == (16, 16)


def test_bad_input_gives_one_clear_line(tmp_path: Path, runner: CliRunner) -> None:
    store_dir, key = _site_store(tmp_path, runner)
    with pytest.raises(ConfigError, match=r"e\.g\. 90d"):
        _invoke(runner, "store", "tier", "--store", str(store_dir), "--key-file", str(key), "--older-than", "soon")
    with pytest.raises(StoreKeyError, match="no key-encryption key: pass --key-file"):
        _invoke(runner, "verify", "--store", str(store_dir))
    inside = store_dir / "site.kek"
    inside.write_text(load_kek(key).to_text())
    os.chmod(inside, 0o600)
    with pytest.raises(StoreKeyError, match="inside the store") as info:
        _invoke(runner, "verify", "--store", str(store_dir), "--key-file", str(inside))
    assert "\n" not in str(info.value)
    with pytest.raises(FedshardError, match="no shard store"):
        _invoke(runner, "store", "stats", "--store", str(tmp_path / "nowhere"))
    with pytest.raises(FedshardError, match="already exists"):
        _invoke(runner, "store", "keygen", "--out", str(key))
    code, out = _invoke(runner, "store", "tier", "--store", str(store_dir), "--older-than", "1d", "--format", "fp16")
    assert code == 2 and "fp16" in out  # click's usage error lists the choices


def test_a_store_of_the_sha256_era_is_refused_with_one_line(
    tmp_path: Path, runner: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store written before BLAKE3 (catalog and key table of format 2) is refused whole, unchanged."""
    monkeypatch.setattr(catalog, "_FORMAT", 2)
    store_dir, key = _site_store(tmp_path, runner)
    monkeypatch.undo()
    before = {p: p.read_bytes() for p in store_dir.rglob("*") if p.is_file()}

    for command in (["verify"], ["store", "stats"], ["store", "tier", "--older-than", "1d"]):
        with pytest.raises(StoreError) as info:
            _invoke(runner, *command, "--store", str(store_dir), "--key-file", str(key))
        message = str(info.value)
        assert "is of format 2" in message and "before BLAKE3" in message and "new store" in message
        assert "\n" not in message
    assert {p: p.read_bytes() for p in store_dir.rglob("*") if p.is_file()} == before
