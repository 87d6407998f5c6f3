"""The recovery benchmark's busy cluster (``controller_recovery.py``): its settings, the
namespace's pods and TrainingJobs as a list-then-watch keeps them, and the seeded driver
that creates and ends jobs while the operator is killed and restarted.

What must stay true: the driver is seeded (a run is repeated by its seed), and ``pause``
returns only once no act of the driver is in progress, so that nothing it does lands while
a re-convergence is measured.
"""

from __future__ import annotations

import functools
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.played_cluster import THIS_TREE, PlayedCoordinators
from benchmarks.recovery_checks import CheckedPods, phase_of
from tests.kube.controller_harness import GROUP, PLURAL, VERSION, Cluster, training_job
from tests.kube.listing import Listings

POOL = "edl.bench/pool"
DRAIN_S = 10
PRIORITIES = (1, 10, 100)


@dataclass(frozen=True, slots=True)
class Settings:
    played_nodes: int = 30
    real_nodes: int = 1
    gpus: int = 8
    real_gpus: int = 4
    #: Played and real jobs the driver keeps alive at once.
    played_jobs: int = 40
    real_jobs: int = 2
    kills: int = 10
    seed: int = 5
    #: ``same``: a restart keeps the identity (a container restarted in its pod);
    #: ``fresh``: each restart is a new replica, which waits for the Lease to lapse.
    identity: str = "same"
    #: How long a restart may take to re-converge before it counts as a violation.
    reconverge_timeout_s: float = 120.0
    #: How long the jobs may take to finish once the driver ends them.
    end_timeout_s: float = 300.0
    #: The samples of a real job (its workers train 10 a step, one step in 0.05 s or more).
    real_samples: tuple[int, int] = (1500, 4000)
    #: Seconds of driver activity before each kill, and of downtime after it.
    busy_s: tuple[float, float] = (1.0, 4.0)
    down_s: tuple[float, float] = (0.0, 1.0)


class Watched(Listings):
    """This namespace's pods (``CheckedPods``) and TrainingJobs, each kept by a
    list-then-watch in a thread of its own."""

    def __init__(self, cluster: Cluster, ns: str, pods: CheckedPods) -> None:
        super().__init__()
        self.pods = pods
        self.jobs: dict[str, dict[str, Any]] = {}
        self.listing(functools.partial(cluster.core.list_namespaced_pod, ns), pods)
        self.listing(
            functools.partial(
                cluster.custom.list_namespaced_custom_object, GROUP, VERSION, ns, PLURAL
            ),
            self.jobs,
        )

    def state(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        with self.lock:
            return list(self.pods.values()), list(self.jobs.values())

    def phases(self) -> dict[str, str]:
        with self.lock:
            return {j["metadata"]["name"]: phase_of(j) for j in self.jobs.values()}


class Driver:
    """Keeps the cluster busy, seeded: creates jobs up to ``played_jobs`` and ``real_jobs``
    alive, ends played jobs after their random lifetime (their coordinator reports the last
    epoch committed; one in five is deleted by its user instead). ``pause`` and ``resume``
    stop and restart it (a played job past its lifetime while paused ends after resume)."""

    def __init__(
        self,
        cluster: Cluster,
        ns: str,
        settings: Settings,
        coordinators: PlayedCoordinators,
        watched: Watched,
        max_replicas: dict[str, int],
        ledgers: Path,
    ) -> None:
        self.cluster = cluster
        self.ledgers = ledgers
        #: The samples of each real job, whose workers write their ledger files in
        #: ``ledgers / <job>``.
        self.samples: dict[str, int] = {}
        self.ns = ns
        self.settings = settings
        self.coordinators = coordinators
        self.watched = watched
        self.max_replicas = max_replicas
        self.rng = random.Random(settings.seed)
        self.ends: dict[str, float] = {}  # live played job -> when it ends
        self.real: set[str] = set()
        self.deleted: set[str] = set()
        self.created: list[str] = []
        self.arrivals = True
        self.running = threading.Event()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="driver", daemon=True)
        self.errors: list[str] = []
        self._lock = threading.Lock()  # the thread and the caller both step

    def _manifest(self, name: str, pool: str, real: bool) -> dict[str, Any]:
        rng = self.rng
        if real:
            minimum, maximum = 1, rng.choice((2, self.settings.real_gpus))
            samples = rng.randint(*self.settings.real_samples)
        else:
            minimum, maximum = rng.choice((1, 1, 2)), rng.choice((2, 4, 8))
            samples = 1000
        command = [*THIS_TREE, "-m", "trainer_runtime.plain_worker", "--step-time-s", "0.05"]
        if real:
            self.samples[name] = samples
            command += ["--ledger-dir", str(self.ledgers / name)]
        manifest = training_job(
            name,
            self.ns,
            min_replicas=minimum,
            max_replicas=maximum,
            priority=rng.choice(PRIORITIES),
            samples=samples,
            command=command,
        )
        manifest["spec"]["template"]["spec"]["nodeSelector"] = {POOL: pool}
        manifest["spec"]["timeouts"] = {"drainSeconds": DRAIN_S}
        self.max_replicas[name] = maximum
        return manifest

    def _create(self, real: bool) -> None:
        name = f"{'r' if real else 'p'}-{len(self.created)}"
        pool = f"{self.ns}-{'real' if real else 'played'}"
        self.cluster.create_job(self._manifest(name, pool, real))
        self.created.append(name)
        if real:
            self.real.add(name)
        else:
            self.ends[name] = time.monotonic() + self.rng.uniform(4.0, 20.0)

    def step(self) -> None:
        """One act of the driver: end the played jobs whose time came, fill up."""
        with self._lock:
            self._step()

    def _step(self) -> None:
        now = time.monotonic()
        for name, end in sorted(self.ends.items()):
            if end <= now:
                del self.ends[name]
                if self.rng.random() < 0.2:
                    self.cluster.delete_job(self.ns, name)
                    self.deleted.add(name)
                else:
                    self.coordinators.finish(name)
        if not self.arrivals:
            return
        phases = self.watched.phases()
        live_real = [n for n in self.real if phases.get(n) not in ("Succeeded", "Failed")]
        if len(live_real) < self.settings.real_jobs:
            self._create(real=True)
        if len(self.ends) < self.settings.played_jobs:
            self._create(real=False)

    def pause(self) -> None:
        """Stops the thread's acts; returns once none is in progress, so that nothing the
        driver does lands while a re-convergence is measured."""
        with self._lock:
            self.running.clear()

    def _step_while_running(self) -> None:
        with self._lock:
            if self.running.is_set():
                self._step()

    def _run(self) -> None:
        while not self.stopping.is_set():
            if self.running.wait(0.2):
                try:
                    self._step_while_running()
                except Exception as error:  # reported, and the run goes on
                    self.errors.append(repr(error))
                self.stopping.wait(self.rng.uniform(0.2, 0.8))

    def end_all(self) -> None:
        """No more arrivals; every live played job ends now."""
        self.arrivals = False
        for name in list(self.ends):
            self.ends[name] = 0.0
        self.step()

    def __enter__(self) -> Driver:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stopping.set()
        self.thread.join(10)
