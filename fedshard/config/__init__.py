"""Configuration: pydantic models (every default in one place) and YAML loading."""

from fedshard.config.loader import load_federation, load_model, load_site, parse_model
from fedshard.config.models import (
    FederationConfig,
    FederationSettings,
    ShardingConfig,
    SiteConfig,
    SiteLocalConfig,
    SiteLocalSettings,
    TaskConfig,
    TrainingConfig,
    ZoneConfig,
)
from fedshard.config.privacy import BudgetConfig, PrivacyConfig, RecordDPConfig, UpdateDPConfig

__all__ = [
    "BudgetConfig",
    "PrivacyConfig",
    "RecordDPConfig",
    "UpdateDPConfig",
    "FederationConfig",
    "FederationSettings",
    "ShardingConfig",
    "SiteConfig",
    "SiteLocalConfig",
    "SiteLocalSettings",
    "TaskConfig",
    "TrainingConfig",
    "ZoneConfig",
    "load_federation",
    "load_model",
    "load_site",
    "parse_model",
]
