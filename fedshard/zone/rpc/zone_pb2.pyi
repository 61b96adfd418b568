from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class OpenRoundRequest(_message.Message):
    __slots__ = ("round", "token", "plan_json", "base_version", "sites", "base_versions", "weights")
    class BaseVersionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class WeightsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ROUND_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    PLAN_JSON_FIELD_NUMBER: _ClassVar[int]
    BASE_VERSION_FIELD_NUMBER: _ClassVar[int]
    SITES_FIELD_NUMBER: _ClassVar[int]
    BASE_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    round: int
    token: str
    plan_json: str
    base_version: str
    sites: _containers.RepeatedScalarFieldContainer[str]
    base_versions: _containers.ScalarMap[str, str]
    weights: _containers.ScalarMap[str, float]
    def __init__(self, round: _Optional[int] = ..., token: _Optional[str] = ..., plan_json: _Optional[str] = ..., base_version: _Optional[str] = ..., sites: _Optional[_Iterable[str]] = ..., base_versions: _Optional[_Mapping[str, str]] = ..., weights: _Optional[_Mapping[str, float]] = ...) -> None: ...

class OpenRoundReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PushHeader(_message.Message):
    __slots__ = ("manifest", "round_token")
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    ROUND_TOKEN_FIELD_NUMBER: _ClassVar[int]
    manifest: bytes
    round_token: str
    def __init__(self, manifest: _Optional[bytes] = ..., round_token: _Optional[str] = ...) -> None: ...

class ShardChunk(_message.Message):
    __slots__ = ("shard_id", "offset", "data", "dtype", "shape")
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    shard_id: str
    offset: int
    data: bytes
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, shard_id: _Optional[str] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ...) -> None: ...

class PushFrame(_message.Message):
    __slots__ = ("header", "chunk")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    header: PushHeader
    chunk: ShardChunk
    def __init__(self, header: _Optional[_Union[PushHeader, _Mapping]] = ..., chunk: _Optional[_Union[ShardChunk, _Mapping]] = ...) -> None: ...

class PushReply(_message.Message):
    __slots__ = ("zone", "round", "site_id", "shards", "bytes", "fold_seconds")
    ZONE_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    SITE_ID_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    FOLD_SECONDS_FIELD_NUMBER: _ClassVar[int]
    zone: str
    round: int
    site_id: str
    shards: int
    bytes: int
    fold_seconds: float
    def __init__(self, zone: _Optional[str] = ..., round: _Optional[int] = ..., site_id: _Optional[str] = ..., shards: _Optional[int] = ..., bytes: _Optional[int] = ..., fold_seconds: _Optional[float] = ...) -> None: ...

class CloseRoundRequest(_message.Message):
    __slots__ = ("round", "abort", "forward_zone", "forward_endpoint")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    ABORT_FIELD_NUMBER: _ClassVar[int]
    FORWARD_ZONE_FIELD_NUMBER: _ClassVar[int]
    FORWARD_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    round: int
    abort: bool
    forward_zone: str
    forward_endpoint: str
    def __init__(self, round: _Optional[int] = ..., abort: _Optional[bool] = ..., forward_zone: _Optional[str] = ..., forward_endpoint: _Optional[str] = ...) -> None: ...

class CloseRoundReply(_message.Message):
    __slots__ = ("aggregates",)
    AGGREGATES_FIELD_NUMBER: _ClassVar[int]
    aggregates: _containers.RepeatedCompositeFieldContainer[AggregateHeader]
    def __init__(self, aggregates: _Optional[_Iterable[_Union[AggregateHeader, _Mapping]]] = ...) -> None: ...

class ForwardReply(_message.Message):
    __slots__ = ("shards",)
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    shards: int
    def __init__(self, shards: _Optional[int] = ...) -> None: ...

class ShardDigest(_message.Message):
    __slots__ = ("shard_id", "digest", "nbytes", "encrypted")
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    ENCRYPTED_FIELD_NUMBER: _ClassVar[int]
    shard_id: str
    digest: str
    nbytes: int
    encrypted: bool
    def __init__(self, shard_id: _Optional[str] = ..., digest: _Optional[str] = ..., nbytes: _Optional[int] = ..., encrypted: _Optional[bool] = ...) -> None: ...

class AggregateHeader(_message.Message):
    __slots__ = ("zone", "round", "merkle_root", "total_weight", "sites", "shards", "group", "signature")
    ZONE_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    MERKLE_ROOT_FIELD_NUMBER: _ClassVar[int]
    TOTAL_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    SITES_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    zone: str
    round: int
    merkle_root: str
    total_weight: float
    sites: _containers.RepeatedScalarFieldContainer[str]
    shards: _containers.RepeatedCompositeFieldContainer[ShardDigest]
    group: str
    signature: ZoneSignature
    def __init__(self, zone: _Optional[str] = ..., round: _Optional[int] = ..., merkle_root: _Optional[str] = ..., total_weight: _Optional[float] = ..., sites: _Optional[_Iterable[str]] = ..., shards: _Optional[_Iterable[_Union[ShardDigest, _Mapping]]] = ..., group: _Optional[str] = ..., signature: _Optional[_Union[ZoneSignature, _Mapping]] = ...) -> None: ...

class ZoneSignature(_message.Message):
    __slots__ = ("statement", "signature", "certificate")
    STATEMENT_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    CERTIFICATE_FIELD_NUMBER: _ClassVar[int]
    statement: bytes
    signature: bytes
    certificate: bytes
    def __init__(self, statement: _Optional[bytes] = ..., signature: _Optional[bytes] = ..., certificate: _Optional[bytes] = ...) -> None: ...

class FetchAggregateRequest(_message.Message):
    __slots__ = ("round", "group", "site_id")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    SITE_ID_FIELD_NUMBER: _ClassVar[int]
    round: int
    group: str
    site_id: str
    def __init__(self, round: _Optional[int] = ..., group: _Optional[str] = ..., site_id: _Optional[str] = ...) -> None: ...

class AggregateFrame(_message.Message):
    __slots__ = ("header", "chunk")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    header: AggregateHeader
    chunk: ShardChunk
    def __init__(self, header: _Optional[_Union[AggregateHeader, _Mapping]] = ..., chunk: _Optional[_Union[ShardChunk, _Mapping]] = ...) -> None: ...

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InfoReply(_message.Message):
    __slots__ = ("name", "region", "info_json")
    NAME_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    INFO_JSON_FIELD_NUMBER: _ClassVar[int]
    name: str
    region: str
    info_json: str
    def __init__(self, name: _Optional[str] = ..., region: _Optional[str] = ..., info_json: _Optional[str] = ...) -> None: ...

class ReconfigureRequest(_message.Message):
    __slots__ = ("membership_digest",)
    MEMBERSHIP_DIGEST_FIELD_NUMBER: _ClassVar[int]
    membership_digest: str
    def __init__(self, membership_digest: _Optional[str] = ...) -> None: ...

class ReconfigureReply(_message.Message):
    __slots__ = ("policy_digest", "sites", "zones")
    POLICY_DIGEST_FIELD_NUMBER: _ClassVar[int]
    SITES_FIELD_NUMBER: _ClassVar[int]
    ZONES_FIELD_NUMBER: _ClassVar[int]
    policy_digest: str
    sites: int
    zones: int
    def __init__(self, policy_digest: _Optional[str] = ..., sites: _Optional[int] = ..., zones: _Optional[int] = ...) -> None: ...
