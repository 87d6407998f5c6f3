"""A parameter-server job: a linear classifier over 20,000 sparse-ish features made locally.

Run by `run.sh` as N local workers; each reads the environment contract (EDL_COORDINATOR,
EDL_JOB_TOKEN, EDL_JOB_ID, EDL_WORKER_ID) and trains inside one PS session. The optimizer
(SGD with momentum) runs on the parameter servers; workers push gradients and pull
parameters. `EDL_PS_CONSISTENCY=async` (and `EDL_PS_STALENESS=2`) switches to bounded
staleness.
"""

from __future__ import annotations

import os

import torch
from torch import nn
from torch.utils.data import TensorDataset

from trainer_runtime.ps.session import Consistency, PsConfig, ps_session

FEATURES = 20_000


def making_data(samples: int = 8192) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    truth = torch.randn(FEATURES, generator=generator)
    inputs = (torch.rand(samples, FEATURES, generator=generator) < 0.01).float()
    labels = (inputs @ truth > 0).long()
    return TensorDataset(inputs, labels)


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Linear(FEATURES, 2)
    dataset = making_data()
    config = PsConfig(
        global_batch=128,
        lr=0.5,
        momentum=0.9,
        snapshot_dir=os.environ["EDL_PS_SNAPSHOTS"],
        consistency=Consistency(os.environ.get("EDL_PS_CONSISTENCY", "sync")),
        staleness=int(os.environ.get("EDL_PS_STALENESS", "0")),
        snapshot_every=20,
    )
    with ps_session(model, dataset, config) as s:
        for inputs, labels in s.batches():
            loss = nn.functional.cross_entropy(model(inputs), labels)
            s.step(loss)
            if s.leader and s.step_count % 20 == 0:
                world = s.place.world if s.place else 0
                print(f"step {s.step_count} world {world} loss {loss.item():.4f}", flush=True)
    inputs, labels = dataset.tensors
    with torch.no_grad():
        accuracy = (model(inputs).argmax(1) == labels).float().mean().item()
    print(f"{os.environ['EDL_WORKER_ID']}: done, {s.step_count} steps, accuracy {accuracy:.3f}")


if __name__ == "__main__":
    main()
