"""The recovery benchmark (``benchmarks/controller_recovery.py``) at a small size, so that the
script cannot rot, and its definition of a settled cluster.

Aspects tested:
- the benchmark's core on the session's API server and kubelet in miniature: a busy run of
  played and real jobs, the operator SIGKILLed at random points three times and restarted;
  no node over-committed, no duplicate worker, no orphan, every job not deleted Succeeded,
  every sample of every real job trained once, and every restart observed to re-converge
  (that it did, not how fast: speed goals live in the benchmark);
- ``unsettled`` (condition (b) of the definition) names what is out of place: a worker the
  status does not name, one not Running, a victim past its drain deadline, an exited
  replica not removed, a pod of a deleted or long finished job; a matching cluster is
  settled.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from benchmarks.controller_recovery import Settings, run
from benchmarks.recovery_checks import unsettled
from tests.kube.kubelet import MiniKubelet
from tests.kube.testenv import KubeAPI

NS = "ctrl-recovery"


def test_killed_operator_reconverges_with_every_invariant_kept(
    kube_api: KubeAPI, kubelet: MiniKubelet, tmp_path: Path
) -> None:
    settings = Settings(
        played_nodes=3,
        real_nodes=1,
        gpus=4,
        real_gpus=4,
        played_jobs=4,
        real_jobs=1,
        kills=3,
        seed=7,
        reconverge_timeout_s=60.0,
        end_timeout_s=120.0,
        real_samples=(400, 800),
    )
    result = run(kube_api, tmp_path, settings, ns=NS, prefix="rec-", ports="27000-27999")
    print(result)
    assert result["violations"] == 0, result["violation_examples"]
    assert len(result["reconverge_all_s"]) == 3
    assert all(r is not None for r in result["reconverge_all_s"]), result
    assert all(f is not None for f in result["first_cycle_all_s"]), result
    assert result["jobs"] >= settings.played_jobs + settings.real_jobs
    # every real job trained each sample once, as its workers' ledger files say
    assert result["real_jobs"] >= settings.real_jobs, result
    assert result["samples_lost"] == 0 and result["samples_repeated"] == 0, result


def pod(name: str, job: str, *, role: str = "worker", node: str = "n1",
        phase: str = "Running", **meta: Any) -> dict[str, Any]:  # fmt: skip
    return {
        "metadata": {"name": name, "labels": {"edl.dev/job": job, "edl.dev/role": role}} | meta,
        "spec": {"nodeName": node},
        "status": {"phase": phase},
    }


def job(name: str, phase: str, allocation: dict[str, str], **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "generation": 1},
        "spec": {"timeouts": {"drainSeconds": 10}},
        "status": {
            "phase": phase,
            "observedGeneration": 1,
            "allocation": allocation,
            "replicas": len(allocation),
        }
        | status,
    }


def test_unsettled_names_what_is_out_of_place() -> None:
    now = time.time()
    coordinator = pod("a-coordinator", "a", role="coordinator")
    settled = [coordinator, pod("a-w1", "a"), pod("a-w2", "a", node="n2")]
    running = job("a", "Running", {"a-w1": "n1", "a-w2": "n2"})
    assert unsettled(settled, [running], now) is None

    missing = job("a", "Running", {"a-w1": "n1"})
    assert "status allocation" in str(unsettled(settled, [missing], now))
    starting = [coordinator, pod("a-w1", "a"), pod("a-w2", "a", node="n2", phase="Pending")]
    assert "Pending" in str(unsettled(starting, [running], now))
    exited = [*settled, pod("a-w3", "a", phase="Succeeded")]
    assert "not removed" in str(unsettled(exited, [running], now))
    draining = {"annotations": {"edl.dev/draining": "true", "edl.dev/drain-since": str(now)}}
    victim = pod("a-w3", "a", **draining)
    assert unsettled([*settled, victim], [running], now) is None  # within its deadline
    assert "drain deadline" in str(unsettled([*settled, victim], [running], now + 11))
    no_status = {"metadata": {"name": "b", "generation": 1}, "spec": {}}
    assert "no status" in str(unsettled(settled, [running, no_status], now))
    assert "deleted job" in str(unsettled([*settled, pod("c-w1", "c")], [running], now))

    ended = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
    done = job("a", "Succeeded", {}, completionTime=ended)
    assert unsettled(settled, [done], now) is None  # still within the drain window
    assert "left after" in str(unsettled(settled, [done], now + 11))
