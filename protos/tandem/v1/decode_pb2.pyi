from tandem.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class KvCompression(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    KV_COMPRESSION_NONE: _ClassVar[KvCompression]
    KV_COMPRESSION_INT8_ABSMAX: _ClassVar[KvCompression]

class KvChunkKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    KV_CHUNK_KIND_UNSPECIFIED: _ClassVar[KvChunkKind]
    KV_CHUNK_KIND_DATA: _ClassVar[KvChunkKind]
    KV_CHUNK_KIND_COMMIT: _ClassVar[KvChunkKind]

class PushKvStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PUSH_KV_STATUS_UNSPECIFIED: _ClassVar[PushKvStatus]
    PUSH_KV_STATUS_COMMITTED: _ClassVar[PushKvStatus]
    PUSH_KV_STATUS_REJECTED: _ClassVar[PushKvStatus]
    PUSH_KV_STATUS_INCOMPLETE: _ClassVar[PushKvStatus]
KV_COMPRESSION_NONE: KvCompression
KV_COMPRESSION_INT8_ABSMAX: KvCompression
KV_CHUNK_KIND_UNSPECIFIED: KvChunkKind
KV_CHUNK_KIND_DATA: KvChunkKind
KV_CHUNK_KIND_COMMIT: KvChunkKind
PUSH_KV_STATUS_UNSPECIFIED: PushKvStatus
PUSH_KV_STATUS_COMMITTED: PushKvStatus
PUSH_KV_STATUS_REJECTED: PushKvStatus
PUSH_KV_STATUS_INCOMPLETE: PushKvStatus

class ReserveRequest(_message.Message):
    __slots__ = ("transfer_id", "request_id", "prompt_token_ids", "sampling", "lease_ms", "transports", "prefill_host_id", "prefill_cuda_device_uuid")
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    TRANSPORTS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_HOST_ID_FIELD_NUMBER: _ClassVar[int]
    PREFILL_CUDA_DEVICE_UUID_FIELD_NUMBER: _ClassVar[int]
    transfer_id: str
    request_id: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    sampling: _common_pb2.SamplingParams
    lease_ms: int
    transports: _containers.RepeatedScalarFieldContainer[_common_pb2.KvTransport]
    prefill_host_id: str
    prefill_cuda_device_uuid: str
    def __init__(self, transfer_id: _Optional[str] = ..., request_id: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., lease_ms: _Optional[int] = ..., transports: _Optional[_Iterable[_Union[_common_pb2.KvTransport, str]]] = ..., prefill_host_id: _Optional[str] = ..., prefill_cuda_device_uuid: _Optional[str] = ...) -> None: ...

class ReserveReply(_message.Message):
    __slots__ = ("block_ids", "num_cached_tokens", "epoch", "lease_deadline_ms", "transport", "shm_name", "shm_capacity", "first_block_index", "cuda_ipc")
    BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEASE_DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    SHM_NAME_FIELD_NUMBER: _ClassVar[int]
    SHM_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    FIRST_BLOCK_INDEX_FIELD_NUMBER: _ClassVar[int]
    CUDA_IPC_FIELD_NUMBER: _ClassVar[int]
    block_ids: _containers.RepeatedScalarFieldContainer[int]
    num_cached_tokens: int
    epoch: int
    lease_deadline_ms: int
    transport: _common_pb2.KvTransport
    shm_name: str
    shm_capacity: int
    first_block_index: int
    cuda_ipc: CudaIpcBuffer
    def __init__(self, block_ids: _Optional[_Iterable[int]] = ..., num_cached_tokens: _Optional[int] = ..., epoch: _Optional[int] = ..., lease_deadline_ms: _Optional[int] = ..., transport: _Optional[_Union[_common_pb2.KvTransport, str]] = ..., shm_name: _Optional[str] = ..., shm_capacity: _Optional[int] = ..., first_block_index: _Optional[int] = ..., cuda_ipc: _Optional[_Union[CudaIpcBuffer, _Mapping]] = ...) -> None: ...

class CudaIpcBuffer(_message.Message):
    __slots__ = ("device", "handle", "storage_size", "storage_offset", "ref_counter_name", "ref_counter_offset", "event_handle", "event_sync_required")
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    STORAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    STORAGE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    REF_COUNTER_NAME_FIELD_NUMBER: _ClassVar[int]
    REF_COUNTER_OFFSET_FIELD_NUMBER: _ClassVar[int]
    EVENT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    EVENT_SYNC_REQUIRED_FIELD_NUMBER: _ClassVar[int]
    device: int
    handle: bytes
    storage_size: int
    storage_offset: int
    ref_counter_name: str
    ref_counter_offset: int
    event_handle: bytes
    event_sync_required: bool
    def __init__(self, device: _Optional[int] = ..., handle: _Optional[bytes] = ..., storage_size: _Optional[int] = ..., storage_offset: _Optional[int] = ..., ref_counter_name: _Optional[str] = ..., ref_counter_offset: _Optional[int] = ..., event_handle: _Optional[bytes] = ..., event_sync_required: _Optional[bool] = ...) -> None: ...

class StagingSlice(_message.Message):
    __slots__ = ("offset", "length")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    offset: int
    length: int
    def __init__(self, offset: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class KvChunkHeader(_message.Message):
    __slots__ = ("transfer_id", "epoch", "kind", "layer", "block_ids", "checksum", "has_checksum", "compression", "scales", "staging", "first_token", "first_token_logprob", "sequence", "first_token_top_logprobs")
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    LAYER_FIELD_NUMBER: _ClassVar[int]
    BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    HAS_CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    SCALES_FIELD_NUMBER: _ClassVar[int]
    STAGING_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_LOGPROB_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    transfer_id: str
    epoch: int
    kind: KvChunkKind
    layer: int
    block_ids: _containers.RepeatedScalarFieldContainer[int]
    checksum: int
    has_checksum: bool
    compression: KvCompression
    scales: _containers.RepeatedScalarFieldContainer[float]
    staging: StagingSlice
    first_token: int
    first_token_logprob: float
    sequence: int
    first_token_top_logprobs: _containers.RepeatedCompositeFieldContainer[_common_pb2.TokenLogprob]
    def __init__(self, transfer_id: _Optional[str] = ..., epoch: _Optional[int] = ..., kind: _Optional[_Union[KvChunkKind, str]] = ..., layer: _Optional[int] = ..., block_ids: _Optional[_Iterable[int]] = ..., checksum: _Optional[int] = ..., has_checksum: _Optional[bool] = ..., compression: _Optional[_Union[KvCompression, str]] = ..., scales: _Optional[_Iterable[float]] = ..., staging: _Optional[_Union[StagingSlice, _Mapping]] = ..., first_token: _Optional[int] = ..., first_token_logprob: _Optional[float] = ..., sequence: _Optional[int] = ..., first_token_top_logprobs: _Optional[_Iterable[_Union[_common_pb2.TokenLogprob, _Mapping]]] = ...) -> None: ...

class KvChunk(_message.Message):
    __slots__ = ("header", "payload")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    header: KvChunkHeader
    payload: bytes
    def __init__(self, header: _Optional[_Union[KvChunkHeader, _Mapping]] = ..., payload: _Optional[bytes] = ...) -> None: ...

class PushKvReply(_message.Message):
    __slots__ = ("transfer_id", "status", "chunks_applied", "chunks_dropped_stale", "bytes_received", "error")
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_APPLIED_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_DROPPED_STALE_FIELD_NUMBER: _ClassVar[int]
    BYTES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    transfer_id: str
    status: PushKvStatus
    chunks_applied: int
    chunks_dropped_stale: int
    bytes_received: int
    error: str
    def __init__(self, transfer_id: _Optional[str] = ..., status: _Optional[_Union[PushKvStatus, str]] = ..., chunks_applied: _Optional[int] = ..., chunks_dropped_stale: _Optional[int] = ..., bytes_received: _Optional[int] = ..., error: _Optional[str] = ...) -> None: ...

class AbortRequest(_message.Message):
    __slots__ = ("transfer_id", "request_id", "reason")
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    transfer_id: str
    request_id: str
    reason: str
    def __init__(self, transfer_id: _Optional[str] = ..., request_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class AbortReply(_message.Message):
    __slots__ = ("found", "blocks_freed")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FREED_FIELD_NUMBER: _ClassVar[int]
    found: bool
    blocks_freed: int
    def __init__(self, found: _Optional[bool] = ..., blocks_freed: _Optional[int] = ...) -> None: ...

class StreamTokensRequest(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...
