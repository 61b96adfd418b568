"""Configuration: pydantic models (every default in one place) and YAML loading."""

from fedshard.config.deployment import AggregatorDeployment, SiteDeployment
from fedshard.config.loader import (
    DeployedSite,
    load_deployed_site,
    load_federation,
    load_model,
    load_site,
    parse_model,
)
from fedshard.config.models import (
    FederationConfig,
    FederationSettings,
    HeConfig,
    ShardingConfig,
    SiteConfig,
    SiteLocalConfig,
    SiteLocalSettings,
    StoreConfig,
    TaskConfig,
    TrainingConfig,
    ZoneConfig,
    ZoneLimits,
)
from fedshard.config.privacy import BudgetConfig, LayerPolicy, PrivacyConfig, RecordDPConfig, UpdateDPConfig
from fedshard.config.residency import ClassRule, PolicyRule, Protection, ResidencyConfig, ShardClass, default_rules

__all__ = [
    "AggregatorDeployment",
    "SiteDeployment",
    "BudgetConfig",
    "LayerPolicy",
    "PrivacyConfig",
    "RecordDPConfig",
    "UpdateDPConfig",
    "ClassRule",
    "PolicyRule",
    "Protection",
    "ResidencyConfig",
    "ShardClass",
    "default_rules",
    "FederationConfig",
    "FederationSettings",
    "HeConfig",
    "ShardingConfig",
    "SiteConfig",
    "SiteLocalConfig",
    "SiteLocalSettings",
    "StoreConfig",
    "TaskConfig",
    "TrainingConfig",
    "ZoneConfig",
    "ZoneLimits",
    "DeployedSite",
    "load_deployed_site",
    "load_federation",
    "load_model",
    "load_site",
    "parse_model",
]
