from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Holding(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HOLDING_NOTHING: _ClassVar[Holding]
    HOLDING_RANGE: _ClassVar[Holding]
HOLDING_NOTHING: Holding
HOLDING_RANGE: Holding

class PushHeader(_message.Message):
    __slots__ = ("generation", "step", "contributor", "contributors", "offset")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    CONTRIBUTOR_FIELD_NUMBER: _ClassVar[int]
    CONTRIBUTORS_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    generation: int
    step: int
    contributor: int
    contributors: int
    offset: int
    def __init__(self, generation: _Optional[int] = ..., step: _Optional[int] = ..., contributor: _Optional[int] = ..., contributors: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class PushReply(_message.Message):
    __slots__ = ("complete",)
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    complete: bool
    def __init__(self, complete: _Optional[bool] = ...) -> None: ...

class PullRequest(_message.Message):
    __slots__ = ("generation", "at_least", "timeout_s", "start", "stop")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    AT_LEAST_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    generation: int
    at_least: int
    timeout_s: float
    start: int
    stop: int
    def __init__(self, generation: _Optional[int] = ..., at_least: _Optional[int] = ..., timeout_s: _Optional[float] = ..., start: _Optional[int] = ..., stop: _Optional[int] = ...) -> None: ...

class RowsHeader(_message.Message):
    __slots__ = ("generation", "step", "contributor", "contributors", "start", "stop", "rows")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    CONTRIBUTOR_FIELD_NUMBER: _ClassVar[int]
    CONTRIBUTORS_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    generation: int
    step: int
    contributor: int
    contributors: int
    start: int
    stop: int
    rows: int
    def __init__(self, generation: _Optional[int] = ..., step: _Optional[int] = ..., contributor: _Optional[int] = ..., contributors: _Optional[int] = ..., start: _Optional[int] = ..., stop: _Optional[int] = ..., rows: _Optional[int] = ...) -> None: ...

class PullRowsRequest(_message.Message):
    __slots__ = ("generation", "at_least", "timeout_s", "start", "stop", "rows")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    AT_LEAST_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    generation: int
    at_least: int
    timeout_s: float
    start: int
    stop: int
    rows: bytes
    def __init__(self, generation: _Optional[int] = ..., at_least: _Optional[int] = ..., timeout_s: _Optional[float] = ..., start: _Optional[int] = ..., stop: _Optional[int] = ..., rows: _Optional[bytes] = ...) -> None: ...

class PullHeader(_message.Message):
    __slots__ = ("ready", "watermark")
    READY_FIELD_NUMBER: _ClassVar[int]
    WATERMARK_FIELD_NUMBER: _ClassVar[int]
    ready: bool
    watermark: int
    def __init__(self, ready: _Optional[bool] = ..., watermark: _Optional[int] = ...) -> None: ...

class StepRequest(_message.Message):
    __slots__ = ("generation", "step", "timeout_s")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    generation: int
    step: int
    timeout_s: float
    def __init__(self, generation: _Optional[int] = ..., step: _Optional[int] = ..., timeout_s: _Optional[float] = ...) -> None: ...

class StepReply(_message.Message):
    __slots__ = ("done", "watermark")
    DONE_FIELD_NUMBER: _ClassVar[int]
    WATERMARK_FIELD_NUMBER: _ClassVar[int]
    done: bool
    watermark: int
    def __init__(self, done: _Optional[bool] = ..., watermark: _Optional[int] = ...) -> None: ...

class FenceRequest(_message.Message):
    __slots__ = ("generation",)
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    generation: int
    def __init__(self, generation: _Optional[int] = ...) -> None: ...

class Status(_message.Message):
    __slots__ = ("generation", "holding", "start", "stop", "watermark", "complete_steps", "size", "dtype", "adopted")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    HOLDING_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    WATERMARK_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_STEPS_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    ADOPTED_FIELD_NUMBER: _ClassVar[int]
    generation: int
    holding: Holding
    start: int
    stop: int
    watermark: int
    complete_steps: _containers.RepeatedScalarFieldContainer[int]
    size: int
    dtype: str
    adopted: int
    def __init__(self, generation: _Optional[int] = ..., holding: _Optional[_Union[Holding, str]] = ..., start: _Optional[int] = ..., stop: _Optional[int] = ..., watermark: _Optional[int] = ..., complete_steps: _Optional[_Iterable[int]] = ..., size: _Optional[int] = ..., dtype: _Optional[str] = ..., adopted: _Optional[int] = ...) -> None: ...

class SettleRequest(_message.Message):
    __slots__ = ("generation", "through")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    THROUGH_FIELD_NUMBER: _ClassVar[int]
    generation: int
    through: int
    def __init__(self, generation: _Optional[int] = ..., through: _Optional[int] = ...) -> None: ...

class AdoptRequest(_message.Message):
    __slots__ = ("generation", "start", "stop", "size", "dtype", "lr", "momentum", "step", "from_snapshot", "snapshot_every", "tables")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    LR_FIELD_NUMBER: _ClassVar[int]
    MOMENTUM_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    FROM_SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_EVERY_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    generation: int
    start: int
    stop: int
    size: int
    dtype: str
    lr: float
    momentum: float
    step: int
    from_snapshot: bool
    snapshot_every: int
    tables: _containers.RepeatedCompositeFieldContainer[Table]
    def __init__(self, generation: _Optional[int] = ..., start: _Optional[int] = ..., stop: _Optional[int] = ..., size: _Optional[int] = ..., dtype: _Optional[str] = ..., lr: _Optional[float] = ..., momentum: _Optional[float] = ..., step: _Optional[int] = ..., from_snapshot: _Optional[bool] = ..., snapshot_every: _Optional[int] = ..., tables: _Optional[_Iterable[_Union[Table, _Mapping[str, object]]]] = ...) -> None: ...

class Table(_message.Message):
    __slots__ = ("start", "rows", "row_length")
    START_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    ROW_LENGTH_FIELD_NUMBER: _ClassVar[int]
    start: int
    rows: int
    row_length: int
    def __init__(self, start: _Optional[int] = ..., rows: _Optional[int] = ..., row_length: _Optional[int] = ...) -> None: ...

class Empty(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RawElements(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...
