"""The PaddlePaddle adapter: an elastic session that feels like the PyTorch one.

`session(model, optimizer, dataset, batch_policy=...)` is the whole API; see `session.py`.
Each generation forms its own process group inside the running process (`grouping.py`).
Parameter-server mode has its own worker, `trainer_runtime.paddle.ps.ps_session` (`ps.py`).
"""

from trainer_runtime.adaptive import LrScaling
from trainer_runtime.batching import KeepGlobalBatch, LrRule
from trainer_runtime.paddle.batching import AdaptiveBatch, BatchPolicy, ScaleBatch
from trainer_runtime.paddle.session import ElasticSession, session

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
