"""Configuration: pydantic models (every default in one place) and YAML loading."""

from fedshard.config.loader import load_federation, load_model, parse_model
from fedshard.config.models import (
    FederationConfig,
    FederationSettings,
    ShardingConfig,
    SiteConfig,
    TaskConfig,
    TrainingConfig,
    ZoneConfig,
)

__all__ = [
    "FederationConfig",
    "FederationSettings",
    "ShardingConfig",
    "SiteConfig",
    "TaskConfig",
    "TrainingConfig",
    "ZoneConfig",
    "load_federation",
    "load_model",
    "parse_model",
]
