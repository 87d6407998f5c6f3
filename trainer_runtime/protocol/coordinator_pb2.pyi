from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Role(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WORKER: _ClassVar[Role]
    SERVER: _ClassVar[Role]

class GenerationStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GENERATION_STATUS_UNSPECIFIED: _ClassVar[GenerationStatus]
    MEMBER: _ClassVar[GenerationStatus]
    DRAINED: _ClassVar[GenerationStatus]
    FENCED: _ClassVar[GenerationStatus]
    PENDING: _ClassVar[GenerationStatus]
    FINISHED: _ClassVar[GenerationStatus]
WORKER: Role
SERVER: Role
GENERATION_STATUS_UNSPECIFIED: GenerationStatus
MEMBER: GenerationStatus
DRAINED: GenerationStatus
FENCED: GenerationStatus
PENDING: GenerationStatus
FINISHED: GenerationStatus

class SampleRange(_message.Message):
    __slots__ = ("start", "stop")
    START_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    start: int
    stop: int
    def __init__(self, start: _Optional[int] = ..., stop: _Optional[int] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("worker_id", "node", "store_address", "role", "previous_incarnation", "last_generation", "trained", "last_lease_id")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    STORE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_INCARNATION_FIELD_NUMBER: _ClassVar[int]
    LAST_GENERATION_FIELD_NUMBER: _ClassVar[int]
    TRAINED_FIELD_NUMBER: _ClassVar[int]
    LAST_LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    node: str
    store_address: str
    role: Role
    previous_incarnation: str
    last_generation: int
    trained: _containers.RepeatedCompositeFieldContainer[TrainedRange]
    last_lease_id: int
    def __init__(self, worker_id: _Optional[str] = ..., node: _Optional[str] = ..., store_address: _Optional[str] = ..., role: _Optional[_Union[Role, str]] = ..., previous_incarnation: _Optional[str] = ..., last_generation: _Optional[int] = ..., trained: _Optional[_Iterable[_Union[TrainedRange, _Mapping[str, object]]]] = ..., last_lease_id: _Optional[int] = ...) -> None: ...

class TrainedRange(_message.Message):
    __slots__ = ("epoch", "range")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    RANGE_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    range: SampleRange
    def __init__(self, epoch: _Optional[int] = ..., range: _Optional[_Union[SampleRange, _Mapping[str, object]]] = ...) -> None: ...

class RegisterReply(_message.Message):
    __slots__ = ("generation", "incarnation")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    generation: int
    incarnation: str
    def __init__(self, generation: _Optional[int] = ..., incarnation: _Optional[str] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("worker_id",)
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    def __init__(self, worker_id: _Optional[str] = ...) -> None: ...

class Notice(_message.Message):
    __slots__ = ("generation", "draining", "finished", "incarnation")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    generation: int
    draining: bool
    finished: bool
    incarnation: str
    def __init__(self, generation: _Optional[int] = ..., draining: _Optional[bool] = ..., finished: _Optional[bool] = ..., incarnation: _Optional[str] = ...) -> None: ...

class Member(_message.Message):
    __slots__ = ("worker_id", "rank", "node", "store_address")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    STORE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    rank: int
    node: str
    store_address: str
    def __init__(self, worker_id: _Optional[str] = ..., rank: _Optional[int] = ..., node: _Optional[str] = ..., store_address: _Optional[str] = ...) -> None: ...

class AwaitGenerationRequest(_message.Message):
    __slots__ = ("worker_id", "after", "timeout_s", "incarnation")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    after: int
    timeout_s: float
    incarnation: str
    def __init__(self, worker_id: _Optional[str] = ..., after: _Optional[int] = ..., timeout_s: _Optional[float] = ..., incarnation: _Optional[str] = ...) -> None: ...

class Generation(_message.Message):
    __slots__ = ("status", "number", "rank", "members", "servers", "retiring", "incarnation")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    SERVERS_FIELD_NUMBER: _ClassVar[int]
    RETIRING_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    status: GenerationStatus
    number: int
    rank: int
    members: _containers.RepeatedCompositeFieldContainer[Member]
    servers: _containers.RepeatedCompositeFieldContainer[Member]
    retiring: _containers.RepeatedCompositeFieldContainer[Member]
    incarnation: str
    def __init__(self, status: _Optional[_Union[GenerationStatus, str]] = ..., number: _Optional[int] = ..., rank: _Optional[int] = ..., members: _Optional[_Iterable[_Union[Member, _Mapping[str, object]]]] = ..., servers: _Optional[_Iterable[_Union[Member, _Mapping[str, object]]]] = ..., retiring: _Optional[_Iterable[_Union[Member, _Mapping[str, object]]]] = ..., incarnation: _Optional[str] = ...) -> None: ...

class LedgerView(_message.Message):
    __slots__ = ("epoch", "committed_step", "todo", "finished", "samples", "shard_size", "epochs", "seed")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_STEP_FIELD_NUMBER: _ClassVar[int]
    TODO_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    SHARD_SIZE_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    committed_step: int
    todo: _containers.RepeatedCompositeFieldContainer[SampleRange]
    finished: bool
    samples: int
    shard_size: int
    epochs: int
    seed: int
    def __init__(self, epoch: _Optional[int] = ..., committed_step: _Optional[int] = ..., todo: _Optional[_Iterable[_Union[SampleRange, _Mapping[str, object]]]] = ..., finished: _Optional[bool] = ..., samples: _Optional[int] = ..., shard_size: _Optional[int] = ..., epochs: _Optional[int] = ..., seed: _Optional[int] = ...) -> None: ...

class ReconcileRequest(_message.Message):
    __slots__ = ("worker_id", "generation", "step", "windows")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    generation: int
    step: int
    windows: _containers.RepeatedCompositeFieldContainer[StepWindow]
    def __init__(self, worker_id: _Optional[str] = ..., generation: _Optional[int] = ..., step: _Optional[int] = ..., windows: _Optional[_Iterable[_Union[StepWindow, _Mapping[str, object]]]] = ...) -> None: ...

class StepWindow(_message.Message):
    __slots__ = ("step", "epoch", "ranges")
    STEP_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    RANGES_FIELD_NUMBER: _ClassVar[int]
    step: int
    epoch: int
    ranges: _containers.RepeatedCompositeFieldContainer[SampleRange]
    def __init__(self, step: _Optional[int] = ..., epoch: _Optional[int] = ..., ranges: _Optional[_Iterable[_Union[SampleRange, _Mapping[str, object]]]] = ...) -> None: ...

class CommitRequest(_message.Message):
    __slots__ = ("worker_id", "generation", "windows", "step_time_s", "noise", "incarnation", "batch")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_FIELD_NUMBER: _ClassVar[int]
    STEP_TIME_S_FIELD_NUMBER: _ClassVar[int]
    NOISE_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    generation: int
    windows: _containers.RepeatedCompositeFieldContainer[StepWindow]
    step_time_s: float
    noise: GradientNoise
    incarnation: str
    batch: BatchInUse
    def __init__(self, worker_id: _Optional[str] = ..., generation: _Optional[int] = ..., windows: _Optional[_Iterable[_Union[StepWindow, _Mapping[str, object]]]] = ..., step_time_s: _Optional[float] = ..., noise: _Optional[_Union[GradientNoise, _Mapping[str, object]]] = ..., incarnation: _Optional[str] = ..., batch: _Optional[_Union[BatchInUse, _Mapping[str, object]]] = ...) -> None: ...

class BatchInUse(_message.Message):
    __slots__ = ("global_batch", "accumulation", "goodput", "max_batch", "max_local", "min_local")
    GLOBAL_BATCH_FIELD_NUMBER: _ClassVar[int]
    ACCUMULATION_FIELD_NUMBER: _ClassVar[int]
    GOODPUT_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_FIELD_NUMBER: _ClassVar[int]
    MAX_LOCAL_FIELD_NUMBER: _ClassVar[int]
    MIN_LOCAL_FIELD_NUMBER: _ClassVar[int]
    global_batch: int
    accumulation: int
    goodput: float
    max_batch: int
    max_local: int
    min_local: int
    def __init__(self, global_batch: _Optional[int] = ..., accumulation: _Optional[int] = ..., goodput: _Optional[float] = ..., max_batch: _Optional[int] = ..., max_local: _Optional[int] = ..., min_local: _Optional[int] = ...) -> None: ...

class GradientNoise(_message.Message):
    __slots__ = ("init_batch", "grad_sqr", "grad_var", "steps")
    INIT_BATCH_FIELD_NUMBER: _ClassVar[int]
    GRAD_SQR_FIELD_NUMBER: _ClassVar[int]
    GRAD_VAR_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    init_batch: int
    grad_sqr: float
    grad_var: float
    steps: int
    def __init__(self, init_batch: _Optional[int] = ..., grad_sqr: _Optional[float] = ..., grad_var: _Optional[float] = ..., steps: _Optional[int] = ...) -> None: ...

class CommitReply(_message.Message):
    __slots__ = ("committed_step", "finished")
    COMMITTED_STEP_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    committed_step: int
    finished: bool
    def __init__(self, committed_step: _Optional[int] = ..., finished: _Optional[bool] = ...) -> None: ...

class LeaseRequest(_message.Message):
    __slots__ = ("worker_id", "generation", "incarnation")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    generation: int
    incarnation: str
    def __init__(self, worker_id: _Optional[str] = ..., generation: _Optional[int] = ..., incarnation: _Optional[str] = ...) -> None: ...

class Lease(_message.Message):
    __slots__ = ("lease_id", "epoch", "range")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    RANGE_FIELD_NUMBER: _ClassVar[int]
    lease_id: int
    epoch: int
    range: SampleRange
    def __init__(self, lease_id: _Optional[int] = ..., epoch: _Optional[int] = ..., range: _Optional[_Union[SampleRange, _Mapping[str, object]]] = ...) -> None: ...

class LeaseReply(_message.Message):
    __slots__ = ("finished", "leases")
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    LEASES_FIELD_NUMBER: _ClassVar[int]
    finished: bool
    leases: _containers.RepeatedCompositeFieldContainer[Lease]
    def __init__(self, finished: _Optional[bool] = ..., leases: _Optional[_Iterable[_Union[Lease, _Mapping[str, object]]]] = ...) -> None: ...

class CommitLeasesRequest(_message.Message):
    __slots__ = ("worker_id", "generation", "lease_ids", "step_time_s", "incarnation")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    STEP_TIME_S_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    generation: int
    lease_ids: _containers.RepeatedScalarFieldContainer[int]
    step_time_s: float
    incarnation: str
    def __init__(self, worker_id: _Optional[str] = ..., generation: _Optional[int] = ..., lease_ids: _Optional[_Iterable[int]] = ..., step_time_s: _Optional[float] = ..., incarnation: _Optional[str] = ...) -> None: ...

class LeaveRequest(_message.Message):
    __slots__ = ("worker_id",)
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    def __init__(self, worker_id: _Optional[str] = ...) -> None: ...

class DrainRequest(_message.Message):
    __slots__ = ("worker_id",)
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    def __init__(self, worker_id: _Optional[str] = ...) -> None: ...

class TargetRequest(_message.Message):
    __slots__ = ("workers",)
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    workers: int
    def __init__(self, workers: _Optional[int] = ...) -> None: ...

class Empty(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Throughput(_message.Message):
    __slots__ = ("nodes", "workers", "samples_per_s", "step_time_s", "steps", "batch")
    NODES_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_S_FIELD_NUMBER: _ClassVar[int]
    STEP_TIME_S_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    nodes: int
    workers: int
    samples_per_s: float
    step_time_s: float
    steps: int
    batch: int
    def __init__(self, nodes: _Optional[int] = ..., workers: _Optional[int] = ..., samples_per_s: _Optional[float] = ..., step_time_s: _Optional[float] = ..., steps: _Optional[int] = ..., batch: _Optional[int] = ...) -> None: ...

class Progress(_message.Message):
    __slots__ = ("generation", "epoch", "epochs", "committed_step", "samples_done", "samples_per_epoch", "finished", "members", "draining", "throughput", "servers", "noise", "batch")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_STEP_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_DONE_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    THROUGHPUT_FIELD_NUMBER: _ClassVar[int]
    SERVERS_FIELD_NUMBER: _ClassVar[int]
    NOISE_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    generation: int
    epoch: int
    epochs: int
    committed_step: int
    samples_done: int
    samples_per_epoch: int
    finished: bool
    members: _containers.RepeatedCompositeFieldContainer[Member]
    draining: _containers.RepeatedScalarFieldContainer[str]
    throughput: _containers.RepeatedCompositeFieldContainer[Throughput]
    servers: _containers.RepeatedCompositeFieldContainer[Member]
    noise: GradientNoise
    batch: BatchInUse
    def __init__(self, generation: _Optional[int] = ..., epoch: _Optional[int] = ..., epochs: _Optional[int] = ..., committed_step: _Optional[int] = ..., samples_done: _Optional[int] = ..., samples_per_epoch: _Optional[int] = ..., finished: _Optional[bool] = ..., members: _Optional[_Iterable[_Union[Member, _Mapping[str, object]]]] = ..., draining: _Optional[_Iterable[str]] = ..., throughput: _Optional[_Iterable[_Union[Throughput, _Mapping[str, object]]]] = ..., servers: _Optional[_Iterable[_Union[Member, _Mapping[str, object]]]] = ..., noise: _Optional[_Union[GradientNoise, _Mapping[str, object]]] = ..., batch: _Optional[_Union[BatchInUse, _Mapping[str, object]]] = ...) -> None: ...

class Snapshot(_message.Message):
    __slots__ = ("state_json",)
    STATE_JSON_FIELD_NUMBER: _ClassVar[int]
    state_json: str
    def __init__(self, state_json: _Optional[str] = ...) -> None: ...
