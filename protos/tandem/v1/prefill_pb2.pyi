from tandem.v1 import common_pb2 as _common_pb2
from tandem.v1 import decode_pb2 as _decode_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PrefillRequest(_message.Message):
    __slots__ = ("request_id", "transfer_id", "prompt_token_ids", "sampling", "decode_address", "reservation")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    DECODE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    RESERVATION_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    transfer_id: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    sampling: _common_pb2.SamplingParams
    decode_address: str
    reservation: _decode_pb2.ReserveReply
    def __init__(self, request_id: _Optional[str] = ..., transfer_id: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., decode_address: _Optional[str] = ..., reservation: _Optional[_Union[_decode_pb2.ReserveReply, _Mapping]] = ...) -> None: ...

class PrefillTimings(_message.Message):
    __slots__ = ("queue_s", "compute_s", "transfer_s", "transfer_tail_s")
    QUEUE_S_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_S_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_S_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_TAIL_S_FIELD_NUMBER: _ClassVar[int]
    queue_s: float
    compute_s: float
    transfer_s: float
    transfer_tail_s: float
    def __init__(self, queue_s: _Optional[float] = ..., compute_s: _Optional[float] = ..., transfer_s: _Optional[float] = ..., transfer_tail_s: _Optional[float] = ...) -> None: ...

class PrefillReply(_message.Message):
    __slots__ = ("first_token", "first_token_logprob", "kv_bytes", "timings", "transport", "push_status")
    FIRST_TOKEN_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_LOGPROB_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    PUSH_STATUS_FIELD_NUMBER: _ClassVar[int]
    first_token: int
    first_token_logprob: float
    kv_bytes: int
    timings: PrefillTimings
    transport: _common_pb2.KvTransport
    push_status: _decode_pb2.PushKvStatus
    def __init__(self, first_token: _Optional[int] = ..., first_token_logprob: _Optional[float] = ..., kv_bytes: _Optional[int] = ..., timings: _Optional[_Union[PrefillTimings, _Mapping]] = ..., transport: _Optional[_Union[_common_pb2.KvTransport, str]] = ..., push_status: _Optional[_Union[_decode_pb2.PushKvStatus, str]] = ...) -> None: ...
