"""A worker of the runtime's multi-process tests and benchmarks (run as a script).

`--kind ledger` (the per-sample counter) or `--kind mlp` (a small float64 MLP with SGD and
momentum): see `elastic_job.py`, whose loop it runs. `--deaf-steps K` makes the worker hear
of each new generation K reads after it opened (a notice that reaches it late);
`--lost-after-first-step` makes it exit right after its first step as rank 0 of a group;
`--width` sets the MLP's hidden width (its parameters are about 11 times that).
`--stand-in-shrink` lets the session shrink its gloo group as NCCL's would (`standing_in_shrink`);
`--failing-shrink` makes that shrink fail on this worker. `--late-check-in-s S` makes a
newcomer wait S seconds before its first formation; `--plain-joins` turns off the prepared
join (`trainer_runtime.torch.joining`); `--whole-state` sends rank 0's state whole at each
formation, never streamed (`trainer_runtime.torch.streaming`), and `--stream-chunk-bytes`
sets the stream's smallest chunk.

At the end it writes `<out>/<worker>.pt` (final parameters) and `<out>/<worker>.json`.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

if not __package__:  # run as a script: the repository's root is where `tests` is found
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.runtime.elastic_job import arguments, policy, training, waiting_for_gate
from trainer_runtime.torch import AdaptiveBatch, session


class Counter(nn.Module):
    def __init__(self, samples: int) -> None:
        super().__init__()
        self.counts = nn.Parameter(torch.zeros(samples, dtype=torch.float64))

    def forward(self, index: torch.Tensor) -> torch.Tensor:
        return self.counts[index]


def mlp(width: int = 16) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, width), nn.Tanh(), nn.Linear(width, 2)).double()


def mlp_data(samples: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(samples, 8, generator=generator, dtype=torch.float64)
    targets = (inputs[:, 0] > 0).long()
    return TensorDataset(inputs, targets)


def deafened(agent: Any, steps: int) -> None:
    """Make ``agent`` hear of each new generation ``steps`` reads late, as a rank whose
    notice arrives after its peers' does (its Watch stream is its own)."""
    real = agent.changed
    late: list[int] = []

    def changed() -> bool:
        if not real():
            late.clear()
            return False
        if not late:
            late.append(steps)
        if late[0] > 0:
            late[0] -= 1
            return False
        return True

    agent.changed = changed


def lost_after_first_step(s: Any) -> None:
    """Exit at once after this worker's first step as rank 0 of a generation of two or
    more: its peers lose it just before DDP's next forward would rebuild the buckets."""
    real = s.step

    def step(loss: Any) -> None:
        real(loss)
        if s.world_size > 1 and s.rank == 0:
            os._exit(9)

    s.step = step


def checking_in_late(s: Any, delay_s: float) -> None:
    """Wait `delay_s` before this worker's first formation, as a newcomer whose group takes
    that long to build: a group that prepares its join trains on meanwhile."""
    real = s.forming_generation

    def forming_generation(assignment: Any, attempt: int) -> None:
        if s.generations_formed == 0:
            time.sleep(delay_s)
        real(assignment, attempt)

    s.forming_generation = forming_generation


def standing_in_shrink(failing: bool, timeout: Any) -> Any:
    """A shrink for gloo, which has none (`shrinking.Shrinker`): the survivors, and only
    they, build a group of their own in the live group's store, ranked in their old order,
    as NCCL's shrink leaves them one. `failing`: it raises on this worker once the group is
    built, as a shrink that went wrong late on one member (its peers' shrinks succeeded)."""
    from torch._C._distributed_c10d import PrefixStore

    from trainer_runtime.torch.groups import Group, building

    def shrink(live: Group, excluded: list[int]) -> Group:
        survivors = [r for r in range(live.size) if r not in excluded]
        store = PrefixStore(f"shrunk{live.size}/", live.store)
        rank = survivors.index(live.rank)
        shrunk = building(store, rank, len(survivors), live.device, timeout, live.name + "/s")
        if failing:
            raise RuntimeError("this worker's shrink fails (--failing-shrink)")
        return shrunk

    return shrink


def main() -> None:
    parser = arguments()
    parser.add_argument("--deaf-steps", type=int, default=0, help="hear of changes late")
    parser.add_argument(
        "--lost-after-first-step", action="store_true", help="as rank 0 of a group, exit then"
    )
    parser.add_argument("--width", type=int, default=16, help="the MLP's hidden width")
    parser.add_argument("--stand-in-shrink", action="store_true", help="shrink gloo groups")
    parser.add_argument("--failing-shrink", action="store_true", help="a shrink that fails")
    parser.add_argument("--late-check-in-s", type=float, default=0.0, help="form late, once")
    parser.add_argument("--plain-joins", action="store_true", help="never prepare a join")
    parser.add_argument(
        "--whole-state", action="store_true", help="send rank 0's state whole, never streamed"
    )
    parser.add_argument("--stream-chunk-bytes", type=int, help="the stream's smallest chunk")
    args = parser.parse_args()
    logging.basicConfig(level=os.environ.get("EDL_TEST_LOG_LEVEL", "WARNING"))
    torch.set_num_threads(1)
    worker = os.environ["EDL_WORKER_ID"]
    if args.kind == "ledger":
        model: nn.Module = Counter(args.samples)
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        dataset = TensorDataset(torch.arange(args.samples))
    else:
        model = mlp(args.width)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        dataset = mlp_data(args.samples)
    trace = args.trace.open("a", buffering=1) if args.trace else None
    waiting_for_gate(args)
    with session(model, optimizer, dataset, policy(args, AdaptiveBatch)) as s:
        if args.deaf_steps:
            deafened(s.agent, args.deaf_steps)
        if args.lost_after_first_step:
            lost_after_first_step(s)
        if args.late_check_in_s:
            checking_in_late(s, args.late_check_in_s)
        s.joiner.enabled = not args.plain_joins
        s.streaming_state = not args.whole_state
        if args.stream_chunk_bytes:
            s.stream_min_bytes = args.stream_chunk_bytes
        if args.stand_in_shrink:
            shrink = standing_in_shrink(args.failing_shrink, s.stores.timeout)
            s.shrinker_of = lambda live: shrink if live is not None else None
        summary = training(s, args, nn.functional.cross_entropy, trace)
        summary["reformations"] = [
            [r.generation, r.attempt, r.path.value, r.state_sent] for r in s.reformations
        ]
        summary["deliveries"] = {r.generation: r.delivery.value for r in s.reformations}
    args.out.mkdir(parents=True, exist_ok=True)
    torch.save(
        {k: v.detach().clone() for k, v in model.state_dict().items()}, args.out / f"{worker}.pt"
    )
    (args.out / f"{worker}.json").write_text(json.dumps({**summary, "pid": os.getpid()}))


if __name__ == "__main__":
    main()
