from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class KvTransport(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    KV_TRANSPORT_UNSPECIFIED: _ClassVar[KvTransport]
    KV_TRANSPORT_GRPC: _ClassVar[KvTransport]
    KV_TRANSPORT_SHM: _ClassVar[KvTransport]
    KV_TRANSPORT_CUDA_IPC: _ClassVar[KvTransport]

class WorkerRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WORKER_ROLE_UNSPECIFIED: _ClassVar[WorkerRole]
    WORKER_ROLE_PREFILL: _ClassVar[WorkerRole]
    WORKER_ROLE_DECODE: _ClassVar[WorkerRole]
    WORKER_ROLE_COLOCATED: _ClassVar[WorkerRole]

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_ABORT: _ClassVar[FinishReason]
    FINISH_REASON_ERROR: _ClassVar[FinishReason]
KV_TRANSPORT_UNSPECIFIED: KvTransport
KV_TRANSPORT_GRPC: KvTransport
KV_TRANSPORT_SHM: KvTransport
KV_TRANSPORT_CUDA_IPC: KvTransport
WORKER_ROLE_UNSPECIFIED: WorkerRole
WORKER_ROLE_PREFILL: WorkerRole
WORKER_ROLE_DECODE: WorkerRole
WORKER_ROLE_COLOCATED: WorkerRole
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_ABORT: FinishReason
FINISH_REASON_ERROR: FinishReason

class WorkerInfo(_message.Message):
    __slots__ = ("worker_id", "role", "model_name", "dtype", "num_layers", "num_kv_heads", "head_dim", "block_size", "host_id", "transports", "shm_capable", "cuda_device", "protocol_version", "version", "kv_cache_dtype", "cuda_device_uuid")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    NUM_KV_HEADS_FIELD_NUMBER: _ClassVar[int]
    HEAD_DIM_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    TRANSPORTS_FIELD_NUMBER: _ClassVar[int]
    SHM_CAPABLE_FIELD_NUMBER: _ClassVar[int]
    CUDA_DEVICE_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_DTYPE_FIELD_NUMBER: _ClassVar[int]
    CUDA_DEVICE_UUID_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    role: WorkerRole
    model_name: str
    dtype: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    host_id: str
    transports: _containers.RepeatedScalarFieldContainer[KvTransport]
    shm_capable: bool
    cuda_device: int
    protocol_version: int
    version: str
    kv_cache_dtype: str
    cuda_device_uuid: str
    def __init__(self, worker_id: _Optional[str] = ..., role: _Optional[_Union[WorkerRole, str]] = ..., model_name: _Optional[str] = ..., dtype: _Optional[str] = ..., num_layers: _Optional[int] = ..., num_kv_heads: _Optional[int] = ..., head_dim: _Optional[int] = ..., block_size: _Optional[int] = ..., host_id: _Optional[str] = ..., transports: _Optional[_Iterable[_Union[KvTransport, str]]] = ..., shm_capable: _Optional[bool] = ..., cuda_device: _Optional[int] = ..., protocol_version: _Optional[int] = ..., version: _Optional[str] = ..., kv_cache_dtype: _Optional[str] = ..., cuda_device_uuid: _Optional[str] = ...) -> None: ...

class HandshakeRequest(_message.Message):
    __slots__ = ("peer", "peer_address")
    PEER_FIELD_NUMBER: _ClassVar[int]
    PEER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    peer: WorkerInfo
    peer_address: str
    def __init__(self, peer: _Optional[_Union[WorkerInfo, _Mapping]] = ..., peer_address: _Optional[str] = ...) -> None: ...

class HandshakeReply(_message.Message):
    __slots__ = ("worker", "problems", "transport", "peer_connected")
    WORKER_FIELD_NUMBER: _ClassVar[int]
    PROBLEMS_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    PEER_CONNECTED_FIELD_NUMBER: _ClassVar[int]
    worker: WorkerInfo
    problems: _containers.RepeatedScalarFieldContainer[str]
    transport: KvTransport
    peer_connected: bool
    def __init__(self, worker: _Optional[_Union[WorkerInfo, _Mapping]] = ..., problems: _Optional[_Iterable[str]] = ..., transport: _Optional[_Union[KvTransport, str]] = ..., peer_connected: _Optional[bool] = ...) -> None: ...

class LoadRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LoadReport(_message.Message):
    __slots__ = ("worker_id", "queued_prompt_tokens", "running_sequences", "waiting_sequences", "free_kv_blocks", "total_kv_blocks", "reserved_kv_blocks", "draining", "role")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    WAITING_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    FREE_KV_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_KV_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    RESERVED_KV_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    queued_prompt_tokens: int
    running_sequences: int
    waiting_sequences: int
    free_kv_blocks: int
    total_kv_blocks: int
    reserved_kv_blocks: int
    draining: bool
    role: WorkerRole
    def __init__(self, worker_id: _Optional[str] = ..., queued_prompt_tokens: _Optional[int] = ..., running_sequences: _Optional[int] = ..., waiting_sequences: _Optional[int] = ..., free_kv_blocks: _Optional[int] = ..., total_kv_blocks: _Optional[int] = ..., reserved_kv_blocks: _Optional[int] = ..., draining: _Optional[bool] = ..., role: _Optional[_Union[WorkerRole, str]] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_p", "top_k", "seed", "max_tokens", "stop_token_ids", "logprobs", "ignore_eos", "cache_salt", "grammar", "min_tokens", "top_logprobs", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "prompt_logprobs")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    CACHE_SALT_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_FIELD_NUMBER: _ClassVar[int]
    MIN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    top_k: int
    seed: int
    max_tokens: int
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: bool
    ignore_eos: bool
    cache_salt: str
    grammar: str
    min_tokens: int
    top_logprobs: int
    min_p: float
    repetition_penalty: float
    presence_penalty: float
    frequency_penalty: float
    prompt_logprobs: int
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., seed: _Optional[int] = ..., max_tokens: _Optional[int] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[bool] = ..., ignore_eos: _Optional[bool] = ..., cache_salt: _Optional[str] = ..., grammar: _Optional[str] = ..., min_tokens: _Optional[int] = ..., top_logprobs: _Optional[int] = ..., min_p: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., prompt_logprobs: _Optional[int] = ...) -> None: ...

class TokenLogprob(_message.Message):
    __slots__ = ("token_id", "logprob")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    logprob: float
    def __init__(self, token_id: _Optional[int] = ..., logprob: _Optional[float] = ...) -> None: ...

class TokenEvent(_message.Message):
    __slots__ = ("request_id", "token_id", "logprob", "finish_reason", "error", "index", "has_token", "top_logprobs", "prompt_logprobs")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    HAS_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    token_id: int
    logprob: float
    finish_reason: FinishReason
    error: str
    index: int
    has_token: bool
    top_logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    prompt_logprobs: _containers.RepeatedCompositeFieldContainer[PromptLogprob]
    def __init__(self, request_id: _Optional[str] = ..., token_id: _Optional[int] = ..., logprob: _Optional[float] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., error: _Optional[str] = ..., index: _Optional[int] = ..., has_token: _Optional[bool] = ..., top_logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ..., prompt_logprobs: _Optional[_Iterable[_Union[PromptLogprob, _Mapping]]] = ...) -> None: ...

class PromptLogprob(_message.Message):
    __slots__ = ("logprob", "top", "rank")
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    logprob: float
    top: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    rank: int
    def __init__(self, logprob: _Optional[float] = ..., top: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ..., rank: _Optional[int] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("request_id", "prompt_token_ids", "sampling")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    sampling: SamplingParams
    def __init__(self, request_id: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ...) -> None: ...
