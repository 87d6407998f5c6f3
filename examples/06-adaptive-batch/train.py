"""An elastic classifier whose batch adapts: the same user loop as `01-elastic-torch`, with
`AdaptiveBatch` as its batch policy. Ten overlapping Gaussian classes made locally (no
download), so the gradient is noisy and a larger batch is worth less than proportionally:
the policy weighs that against the time a step takes.

Run by `run.sh` as local workers; each reads the environment contract (EDL_COORDINATOR,
EDL_JOB_TOKEN, EDL_JOB_ID, EDL_WORKER_ID) and trains inside one elastic session. Rank 0
prints the batch in force whenever it changes.
"""

from __future__ import annotations

import os

import torch
from torch import nn
from torch.utils.data import TensorDataset

from trainer_runtime.torch import AdaptiveBatch, session


def making_data(samples: int = 32768, classes: int = 10, features: int = 16) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    centres = 0.4 * torch.randn(classes, features, generator=generator)
    labels = torch.randint(0, classes, (samples,), generator=generator)
    inputs = centres[labels] + torch.randn(samples, features, generator=generator)
    return TensorDataset(inputs, labels)


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    dataset = making_data()
    policy = AdaptiveBatch(initial_batch=32, max_batch=2048, max_local=256, base_lr=0.05)
    shown = None
    with session(model, optimizer, dataset, policy) as s:
        for inputs, labels in s.batches():
            loss = nn.functional.cross_entropy(s.model(inputs), labels)
            s.step(loss)
            world = s.world_size
            chosen = (world, policy.global_batch(world), policy.accumulation(world))
            if s.rank == 0 and chosen != shown:
                shown = chosen
                rate = optimizer.param_groups[0]["lr"]
                print(
                    f"step {s.step_count} world {world} batch {chosen[1]} "
                    f"accumulation {chosen[2]} lr {rate:.4f} loss {loss.item():.4f}",
                    flush=True,
                )
    inputs, labels = dataset.tensors
    with torch.no_grad():
        accuracy = (model(inputs).argmax(1) == labels).float().mean().item()
    print(f"{os.environ['EDL_WORKER_ID']}: done at step {s.step_count}, accuracy {accuracy:.3f}")


if __name__ == "__main__":
    main()
