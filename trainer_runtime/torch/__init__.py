"""The PyTorch adapter: an elastic session that feels like DistributedDataParallel.

`session(model, optimizer, dataset, batch_policy=...)` is the whole API; see `session.py`.
"""

from trainer_runtime.adaptive import LrScaling
from trainer_runtime.batching import KeepGlobalBatch, LrRule
from trainer_runtime.torch.batching import AdaptiveBatch, BatchPolicy, ScaleBatch
from trainer_runtime.torch.session import ElasticSession, session

__all__ = [
    "AdaptiveBatch",
    "BatchPolicy",
    "ElasticSession",
    "KeepGlobalBatch",
    "LrRule",
    "LrScaling",
    "ScaleBatch",
    "session",
]
