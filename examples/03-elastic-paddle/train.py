"""A small elastic Paddle classifier: two Gaussian blobs made locally, no download.

Run by `run.sh` as N local workers; each reads the environment contract (EDL_COORDINATOR,
EDL_JOB_TOKEN, EDL_JOB_ID, EDL_WORKER_ID) and trains inside one elastic session. The loop
is the PyTorch example's, written with Paddle.
"""

from __future__ import annotations

import os

import numpy as np
import paddle
from paddle import nn

from trainer_runtime.paddle import KeepGlobalBatch, session


def making_data(samples: int = 4096) -> paddle.io.TensorDataset:
    generator = np.random.default_rng(0)
    labels = generator.integers(0, 2, samples)
    centres = np.array([[-1.0, -1.0], [1.0, 1.0]], dtype="float32")
    inputs = centres[labels] + 0.7 * generator.standard_normal((samples, 2)).astype("float32")
    return paddle.io.TensorDataset([paddle.to_tensor(inputs), paddle.to_tensor(labels)])


def main() -> None:
    paddle.set_device("cpu")
    paddle.seed(0)
    model = nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Linear(32, 2))
    optimizer = paddle.optimizer.Momentum(
        learning_rate=0.05, momentum=0.9, parameters=model.parameters()
    )
    dataset = making_data()
    with session(model, optimizer, dataset, KeepGlobalBatch(64)) as s:
        for inputs, labels in s.batches():
            loss = nn.functional.cross_entropy(s.model(inputs), labels)
            s.step(loss)
            if s.rank == 0 and s.step_count % 20 == 0:
                print(f"step {s.step_count} world {s.world_size} loss {float(loss):.4f}")
    inputs, labels = dataset.tensors
    accuracy = float((model(inputs).argmax(1) == labels).astype("float32").mean())
    print(f"{os.environ['EDL_WORKER_ID']}: done at step {s.step_count}, accuracy {accuracy:.3f}")


if __name__ == "__main__":
    main()
