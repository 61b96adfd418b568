"""On-prem and zone-side shard storage."""

from fedshard.store.local import LocalShardStore

__all__ = ["LocalShardStore"]
