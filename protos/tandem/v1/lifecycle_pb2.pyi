from tandem.v1 import common_pb2 as _common_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DrainRequest(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class DrainReply(_message.Message):
    __slots__ = ("draining", "busy", "deadline_s")
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    BUSY_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_S_FIELD_NUMBER: _ClassVar[int]
    draining: bool
    busy: int
    deadline_s: float
    def __init__(self, draining: _Optional[bool] = ..., busy: _Optional[int] = ..., deadline_s: _Optional[float] = ...) -> None: ...

class SetRoleRequest(_message.Message):
    __slots__ = ("role", "reason", "drain_timeout_s")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DRAIN_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    role: _common_pb2.WorkerRole
    reason: str
    drain_timeout_s: float
    def __init__(self, role: _Optional[_Union[_common_pb2.WorkerRole, str]] = ..., reason: _Optional[str] = ..., drain_timeout_s: _Optional[float] = ...) -> None: ...

class SetRoleReply(_message.Message):
    __slots__ = ("role", "previous_role", "drain_s", "switch_s")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_ROLE_FIELD_NUMBER: _ClassVar[int]
    DRAIN_S_FIELD_NUMBER: _ClassVar[int]
    SWITCH_S_FIELD_NUMBER: _ClassVar[int]
    role: _common_pb2.WorkerRole
    previous_role: _common_pb2.WorkerRole
    drain_s: float
    switch_s: float
    def __init__(self, role: _Optional[_Union[_common_pb2.WorkerRole, str]] = ..., previous_role: _Optional[_Union[_common_pb2.WorkerRole, str]] = ..., drain_s: _Optional[float] = ..., switch_s: _Optional[float] = ...) -> None: ...
