"""``fedshard export``: what a federation trained, in the formats other tools load.

``export adapter``: a site's federated LoRA adapters (and head) as a PEFT adapter folder
(:mod:`fedshard.tasks.hf.adapter`), from a simulation's run folder or a deployed site's
state. It reads the site's own sealed store with the site's own key: only whoever holds
that key (the site) can export its adapters.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from fedshard.errors import ConfigError

__all__ = ["export_app"]

export_app = typer.Typer(no_args_is_help=True, help="Export what a federation trained, in formats other tools load.")
console = Console()


@export_app.command("adapter")
def export_adapter(
    out: Annotated[Path, typer.Option("--out", help="The new adapter folder (refused if it exists and is not empty)")],
    run_dir: Annotated[
        Path | None, typer.Argument(help="A simulation's run folder (fedshard simulate --out); or use --site-config")
    ] = None,
    site: Annotated[str | None, typer.Option("--site", help="Whose adapters, in a run folder: a site's id")] = None,
    site_config: Annotated[
        Path | None,
        typer.Option("--site-config", help="A deployed site's own config: its state folder and store key"),
    ] = None,
) -> None:
    """A site's federated adapters as a PEFT adapter folder (adapter_config.json, adapter_model.safetensors)."""
    from fedshard.assembly.sites import STORE_KEYS_DIR, site_model
    from fedshard.config.layout import SiteBundle
    from fedshard.config.loader import load_deployed_site, load_federation
    from fedshard.tasks.hf.adapter import write_adapter

    if (run_dir is None) == (site_config is None):
        raise ConfigError("name a run folder (with --site) or a deployed site's --site-config, not both")
    if run_dir is not None:
        if site is None:
            raise ConfigError("--site: which site's adapters (a run folder holds every site's)")
        config = load_federation(run_dir / "federation.yaml")
        if site not in {s.id for s in config.sites}:
            raise ConfigError(f"{run_dir}: site {site!r} is not in the run's federation")
        state_dir, kek_file = run_dir / "sites" / site, run_dir / STORE_KEYS_DIR / f"{site}.kek"
    else:
        assert site_config is not None
        local, config, _ = load_deployed_site(site_config)
        assert local.deployment is not None  # load_deployed_site checked it
        site, state_dir, kek_file = local.site.id, local.site.state_dir, SiteBundle(local.deployment.keys).store_kek
    model, version = site_model(config, state_dir, kek_file)
    files = write_adapter(model, out)
    console.print(
        f"adapters of {site} (model version {version[:16]}…) → {out}: {', '.join(f.name for f in files)}\n"
        f"load: PeftModel.from_pretrained(AutoModelForSequenceClassification.from_pretrained(<model_dir>, "
        f"num_labels=…), {str(out)!r})",
        highlight=False,
        soft_wrap=True,
    )
