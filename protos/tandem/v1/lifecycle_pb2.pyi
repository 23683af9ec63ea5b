from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

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
