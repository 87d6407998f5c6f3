"""A small elastic classifier: two Gaussian blobs made locally, no download.

Run by `run.sh` as N local workers; each reads the environment contract (EDL_COORDINATOR,
EDL_JOB_TOKEN, EDL_JOB_ID, EDL_WORKER_ID) and trains inside one elastic session.
"""

from __future__ import annotations

import os

import torch
from torch import nn
from torch.utils.data import TensorDataset

from trainer_runtime.torch import KeepGlobalBatch, session


def making_data(samples: int = 4096) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 2, (samples,), generator=generator)
    centres = torch.tensor([[-1.0, -1.0], [1.0, 1.0]])
    inputs = centres[labels] + 0.7 * torch.randn(samples, 2, generator=generator)
    return TensorDataset(inputs, labels)


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Linear(32, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    dataset = making_data()
    with session(model, optimizer, dataset, KeepGlobalBatch(64)) as s:
        for inputs, labels in s.batches():
            loss = nn.functional.cross_entropy(s.model(inputs), labels)
            s.step(loss)
            if s.rank == 0 and s.step_count % 20 == 0:
                print(f"step {s.step_count} world {s.world_size} loss {loss.item():.4f}")
    inputs, labels = dataset.tensors
    accuracy = (model(inputs).argmax(1) == labels).float().mean().item()
    print(f"{os.environ['EDL_WORKER_ID']}: done at step {s.step_count}, accuracy {accuracy:.3f}")


if __name__ == "__main__":
    main()
