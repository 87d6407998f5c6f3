"""A soak of the trainer runtime: one job's workers SIGKILLed again and again, exactly-once
checked at the end.

`python benchmarks/runtime_soak.py [--kills 100] [--seed 1] [--workers 5]` starts one real
coordinator process (independent mode, its state in a file, as on a volume) and `--workers`
real framework-free worker processes (`trainer_runtime.plain_worker`, each "training" a
shard of `--shard-size` samples in `--step-time-s`, each writing its ledger file), through
the runtime tests' harness (`tests/runtime/harness.py`). A seeded driver then, `--kills`
times: waits a random 0 to `--pause-s` seconds, SIGKILLs a random live worker, starts its
replacement at once (a fresh process with a fresh id, as a replacement pod has a new name),
and measures the re-convergence. Then it lets the job finish and checks, from what the
workers committed, that every sample of every epoch was trained exactly once. It prints
one JSON line:
``{"kills": 100, "violations": 0, "samples_lost": 0, "samples_repeated": 0,
"reconverge_p50_s": ..., "reconverge_p95_s": ..., "reconverge_max_s": ..., "seconds": ...}``
and exits 1 when a goal is missed: a violation, a sample lost or repeated, or a p95
re-convergence above 10 s.

Re-convergence of one kill, defined: from just before the SIGKILL to the first poll of the
coordinator's progress (every 20 ms) that shows (a) a generation with the full member count
(`--workers`), the victim not among them, and (b) a committed step above the one read at
the first poll that showed that generation: a commit was accepted after the full
generation was seen, so inside it. Each measure is late by at most a poll and a call.

Exactly-once, from the committed record: each worker's ledger file says which leases it
committed (`done`, an answered commit) and which commit it sent without seeing the answer
(`intent` alone: it was killed in between). Those are decided by the coordinator's own
record of recent commits (`recent_commits` in its snapshot), read once the coordinator has
let the victim go (so no commit of the victim is still in flight); a sample is then lost if
no kept commit holds it in an epoch, and repeated for each kept commit beyond the first.

Violations: a kill not re-converged within `--reconverge-timeout-s`; a worker that exited
non-zero without being killed; a job not finished within `--end-timeout-s`; a job that
finished before the driver's last kill (the dataset was too small for the soak).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.runtime.harness import Cluster, waiting_for  # noqa: E402
from tests.runtime.ledger_files import Intent, counting_trained, exactness, unanswered  # noqa: E402

POLL_S = 0.02
P95_GOAL_S = 10.0


@dataclass(frozen=True, slots=True)
class Settings:
    kills: int = 100
    seed: int = 1
    workers: int = 5
    #: Samples per epoch; by default, sized to last the kills (`sized`).
    samples: int | None = None
    shard_size: int = 50
    epochs: int = 2
    step_time_s: float = 0.05
    pause_s: float = 1.0
    reconverge_timeout_s: float = 60.0
    end_timeout_s: float = 300.0


def sized(settings: Settings) -> int:
    """Samples per epoch: what the job trains while the driver kills, with a margin. Measured
    on this 2-core machine (`--kills 5`, load 4.5): about 3,300 samples a second with 5
    workers of 50-sample shards in 0.05 s, and a kill every 1.1 s (a pause of 0.5 s on
    average, and re-convergence), so about 3,600 samples a kill; both slow down together
    under load. Rounded to whole shards."""
    if settings.samples is not None:
        return settings.samples
    total = (settings.kills * 5_000 + 20_000) * settings.workers // 5
    shards = math.ceil(total / settings.epochs / settings.shard_size)
    return shards * settings.shard_size


@dataclass(slots=True)
class Soak:
    """What the driver saw: re-convergence times, problems, the intents it decided."""

    reconverge_s: list[float] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    kept: dict[Intent, bool] = field(default_factory=dict)
    killed: set[str] = field(default_factory=set)
    kills_done: int = 0


class Driver:
    """The seeded driver of one soak over one cluster."""

    def __init__(self, cluster: Cluster, settings: Settings) -> None:
        self.cluster = cluster
        self.settings = settings
        self.rng = random.Random(settings.seed)
        self.client = cluster.client()
        self.soak = Soak()
        self.started = 0

    def worker(self) -> str:
        name = f"w{self.started}"
        self.started += 1
        ledger = self.cluster.root / f"{name}.ledger"
        step_time_s = str(self.settings.step_time_s)
        argv = ["-m", "trainer_runtime.plain_worker", "--step-time-s", step_time_s,
                "--ledger-file", str(ledger)]  # fmt: skip
        self.cluster.starting_worker(name, argv)
        return name

    def members(self) -> list[str]:
        return [m.worker_id for m in self.client.progress().members]

    def live(self) -> list[str]:
        return sorted(
            name
            for name, process in self.cluster.processes.items()
            if name != "coordinator" and process.poll() is None
        )

    def killing_once(self) -> None:
        """One kill: a random live worker, its replacement, the re-convergence measured."""
        time.sleep(self.rng.uniform(0.0, self.settings.pause_s))
        victim = self.rng.choice(self.live())
        struck = time.monotonic()
        self.cluster.killing(victim)
        self.soak.killed.add(victim)
        self.worker()
        # Decide the victim's unanswered commits once the coordinator has let it go.
        waiting_for(lambda: victim not in self.members(), 30, f"{victim} to depart")
        recent = json.loads(self.client.snapshot())["ledger"]["recent_commits"]
        committed = {(str(holder), int(lease)) for holder, lease in recent}
        for lease in unanswered(self.cluster.root / f"{victim}.ledger"):
            self.soak.kept[(victim, lease)] = (victim, lease) in committed
        found = self.reconverging(victim, struck)
        if found is None:
            kill = self.soak.kills_done + 1
            self.soak.problems.append(f"kill {kill} ({victim}) not re-converged")
        else:
            self.soak.reconverge_s.append(found)
        self.soak.kills_done += 1

    def reconverging(self, victim: str, struck: float) -> float | None:
        """Seconds from `struck` to re-convergence (the module's docstring), or None."""
        full: tuple[int, int] | None = None  # (generation, committed step first seen in it)
        while time.monotonic() - struck < self.settings.reconverge_timeout_s:
            progress = self.client.progress()
            now = time.monotonic()
            names = {m.worker_id for m in progress.members}
            if progress.finished:
                return None
            if len(names) == self.settings.workers and victim not in names:
                if full is None or full[0] != progress.generation:
                    full = (int(progress.generation), int(progress.committed_step))
                elif progress.committed_step > full[1]:
                    return now - struck
            else:
                full = None
            time.sleep(POLL_S)
        return None

    def running(self) -> None:
        for _ in range(self.settings.workers):
            self.worker()
        waiting_for(lambda: len(self.members()) == self.settings.workers, 60, "every worker")
        for _ in range(self.settings.kills):
            if self.client.progress().finished:
                self.soak.problems.append(
                    f"the job finished after {self.soak.kills_done} kills: give it more --samples"
                )
                return
            self.killing_once()

    def ending(self) -> None:
        """Let the job finish, then every live worker exit; what went wrong, in problems."""
        try:
            waiting_for(
                lambda: bool(self.client.progress().finished),
                self.settings.end_timeout_s,
                "the job to finish",
            )
        except AssertionError as error:
            self.soak.problems.append(str(error))
            return
        for name in self.live():
            try:
                code = self.cluster.processes[name].wait(timeout=30)
            except Exception:
                code = None
            if code != 0:
                self.soak.problems.append(f"{name} exited with {code}")
        for name, process in self.cluster.processes.items():
            code = process.poll()
            if name != "coordinator" and name not in self.soak.killed and code not in (0, None):
                message = f"{name} exited with {code}"
                if message not in self.soak.problems:
                    self.soak.problems.append(message)


def nearest_rank(values: list[float], fraction: float) -> float | None:
    """The nearest-rank percentile: the smallest value with at least `fraction` of all at or
    below it."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(math.ceil(fraction * len(ordered)) - 1, 0)]


def rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def soaking(root: Path, settings: Settings) -> dict[str, Any]:
    """The soak in `root`; its JSON result."""
    started, load = time.monotonic(), os.getloadavg()[0]
    samples = sized(settings)
    cluster = Cluster(root)
    try:
        cluster.starting_coordinator(
            "--samples", str(samples), "--shard-size", str(settings.shard_size),
            "--epochs", str(settings.epochs), "--seed", str(settings.seed),
            "--mode", "independent",
        )  # fmt: skip
        driver = Driver(cluster, settings)
        driver.running()
        driver.ending()
    finally:
        cluster.stopping_all()
    soak = driver.soak
    counts, unknown = counting_trained(root, settings.epochs, soak.kept)
    exact = exactness(counts, samples, unknown)
    times = soak.reconverge_s
    return {
        "kills": soak.kills_done,
        "violations": len(soak.problems),
        "samples_lost": exact.lost,
        "samples_repeated": exact.repeated,
        "reconverge_p50_s": rounded(statistics.median(times) if times else None),
        "reconverge_p95_s": rounded(nearest_rank(times, 0.95)),
        "reconverge_max_s": rounded(max(times) if times else None),
        "seconds": round(time.monotonic() - started, 1),
        "workers": settings.workers,
        "samples": samples,
        "epochs": settings.epochs,
        "unanswered_commits": len(soak.kept),
        "unanswered_kept": sum(soak.kept.values()),
        "unknown_intents": exact.unknown,
        "violation_examples": soak.problems[:5],
        "load": [round(load, 2), round(os.getloadavg()[0], 2)],
        "seed": settings.seed,
    }


def missed(result: dict[str, Any]) -> bool:
    p95 = result["reconverge_p95_s"]
    return bool(
        result["violations"]
        or result["samples_lost"]
        or result["samples_repeated"]
        or p95 is None
        or p95 > P95_GOAL_S
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = Settings()
    parser.add_argument("--kills", type=int, default=defaults.kills)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--workers", type=int, default=defaults.workers)
    parser.add_argument("--samples", type=int, help="per epoch (default: sized to the kills)")
    parser.add_argument("--shard-size", type=int, default=defaults.shard_size)
    parser.add_argument("--epochs", type=int, default=defaults.epochs)
    parser.add_argument("--step-time-s", type=float, default=defaults.step_time_s)
    parser.add_argument("--pause-s", type=float, default=defaults.pause_s)
    parser.add_argument("--workdir", type=Path, help="keep the logs and ledgers here")
    args = parser.parse_args(argv)
    if args.kills < 1 or args.workers < 2:
        parser.error("--kills must be at least 1 and --workers at least 2")
    settings = Settings(
        kills=args.kills,
        seed=args.seed,
        workers=args.workers,
        samples=args.samples,
        shard_size=args.shard_size,
        epochs=args.epochs,
        step_time_s=args.step_time_s,
        pause_s=args.pause_s,
    )
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
        result = soaking(args.workdir, settings)
    else:
        with tempfile.TemporaryDirectory(prefix="edl-soak-") as root:
            result = soaking(Path(root), settings)
    print(json.dumps(result), flush=True)
    return 1 if missed(result) else 0


if __name__ == "__main__":
    sys.exit(main())
