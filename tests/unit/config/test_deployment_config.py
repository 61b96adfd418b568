"""Deployment sections of the aggregator's and the sites' configs: paths, addresses, one-line errors."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import yaml

from fedshard.config import load_federation, load_site
from fedshard.deploy._flower import superlink_command, supernode_command
from fedshard.deploy.app import build_app, write_run_config
from fedshard.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]


def test_shipped_layout_resolves_paths_against_each_file() -> None:
    config = load_federation(ROOT / "configs" / "aggregator.yaml")
    assert config.deployment is not None
    assert config.deployment.keys == ROOT / "keys" and config.deployment.state_dir == ROOT / "runs" / "aggregator"
    assert config.deployment.superlink_port == 9092 and config.deployment.tls
    ports = set()
    for site in config.sites:
        local = load_site(ROOT / "configs" / "sites" / f"{site.id}.yaml")
        assert local.site.jurisdiction == site.jurisdiction and local.deployment is not None
        assert local.deployment.federation == ROOT / "configs" / "aggregator.yaml"
        assert local.deployment.keys == ROOT / "keys" / "sites" / site.id
        assert local.site.state_dir == ROOT / "runs" / "sites" / site.id
        ports.add(local.deployment.port)
    assert len(ports) == len(config.sites)  # SuperNodes on one host need distinct ports


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"superlink": "localhost"}, "deployment.superlink: Value error, must be host:port"),
        ({"tsl": True}, "deployment.tsl: unknown key"),
        ({"wait_s": 0}, "deployment.wait_s"),
    ],
)
def test_bad_deployment_sections_are_one_line(tmp_path: Path, change: dict, message: str) -> None:
    data = yaml.safe_load((ROOT / "configs" / "aggregator.yaml").read_text())
    data["deployment"].update(change)
    path = tmp_path / "aggregator.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as err:
        load_federation(path)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_flower_command_lines_are_secure_unless_told() -> None:
    tls = (Path("c.pem"), Path("c.key"), Path("ca.pem"))
    secure = superlink_command(listen="0.0.0.0", port=9092, database=Path("db"), tls=tls)
    assert "--enable-supernode-auth" in secure and "--insecure" not in secure
    assert "--disable-runtime-dependency-installation" in secure
    plain = superlink_command(listen="127.0.0.1", port=9092, database=Path("db"), tls=None)
    assert "--insecure" in plain and "--enable-supernode-auth" not in plain
    node = supernode_command(
        superlink="h:1",
        port=9111,
        node_config={"site-config": "/a b/s.yaml", "site-id": "x"},
        root_certificates=Path("ca.pem"),
        auth_key=Path("k"),
    )
    assert node[node.index("--node-config") + 1] == 'site-config="/a b/s.yaml" site-id="x"'
    assert "--insecure" not in node and node[node.index("--auth-supernode-private-key") + 1] == "k"


def test_app_bundle_is_a_valid_flower_app(tmp_path: Path) -> None:
    from flwr.common.config import validate_config  # Flower's own check of an app's pyproject.toml

    app = build_app(tmp_path / "app")
    config = tomllib.loads((app / "pyproject.toml").read_text())
    ok, errors, _ = validate_config(config, check_module=True, project_dir=app)
    assert ok, errors
    assert (app / "server" / "server_app.py").exists() and (app / "clients" / "client_app.py").exists()
    assert not list(app.rglob("__pycache__"))
    overrides = write_run_config(tmp_path / "run.toml", {"config": "/x/f.yaml", "zones": '{"eu": "h:1"}'})
    assert tomllib.loads(overrides.read_text()) == {"config": "/x/f.yaml", "zones": '{"eu": "h:1"}'}


def test_a_site_whose_file_disagrees_with_the_federation_is_refused(tmp_path: Path) -> None:
    from fedshard.config import load_deployed_site

    site = yaml.safe_load((ROOT / "configs" / "sites" / "mayo-rochester.yaml").read_text())
    site["deployment"]["federation"] = str(ROOT / "configs" / "aggregator.yaml")
    site["site"]["jurisdiction"] = "EU"
    path = tmp_path / "mayo.yaml"
    path.write_text(yaml.safe_dump(site))
    with pytest.raises(ConfigError, match="jurisdiction EU differs from the federation's entry \\(US\\)"):
        load_deployed_site(path)
    site["site"].update(id="unknown-hospital", jurisdiction="US")
    path.write_text(yaml.safe_dump(site))
    with pytest.raises(ConfigError, match="'unknown-hospital' is not in the federation's sites"):
        load_deployed_site(path)
