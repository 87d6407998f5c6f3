"""A parameter-server job (``strategy: ps``) on the local backend, in-process, with real
coordinator, servers (``python -m trainer_runtime.ps``) and PyTorch PS workers
(``tests/runtime/ps_job.py --kind ledger``: a counter per sample that SGD with rate 1 on the
servers raises by exactly 1 each time the sample is trained).

Aspects tested:
- the servers are started from the job's ``pserver`` block, hold no slot, and get the
  servers' side of the environment contract; the workers are told the snapshot directory
  through ``$(EDL_PS_SNAPSHOTS)`` in their arguments, expanded as Kubernetes does;
- a server SIGKILLed mid-run is replaced by the planner (charged to the restart budget),
  the job rolls back to its last snapshot and goes on; then the job is suspended (its
  workers drain, then its servers stop) and resumed (new servers restore the snapshots);
  it succeeds, and every sample's counter equals the number of epochs;
- the CTR example (``examples/07-ctr/ctr.yaml``, PaddlePaddle workers) runs to its end
  on the local backend, every worker's held-out AUC above what a constant scores;
- ``$(NAME)`` expansion: ``$$`` escapes, unknown names stay as written.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import torch
import yaml

from edl_scheduler.api import JobPhase, load_training_job
from edl_scheduler.core import Role
from edl_scheduler.local.launching import expand

from .jobs import as_ps, plain_job
from .test_cluster import Harness

JOB = str(Path(__file__).resolve().parents[1] / "runtime" / "ps_job.py")
SAMPLES, EPOCHS, BATCH = 360, 2, 6


def ps_job(name: str, out: Path) -> str:
    worker = [
        sys.executable, JOB, "--kind", "ledger", "--samples", str(SAMPLES),
        "--global-batch", str(BATCH), "--snapshot-dir", "$(EDL_PS_SNAPSHOTS)",
        "--snapshot-every", "5", "--step-sleep-s", "0.05", "--out", str(out),
    ]  # fmt: skip
    document = yaml.safe_load(as_ps(plain_job(name, 2, 2, samples=SAMPLES, command=worker)))
    document["metadata"]["annotations"]["edl.dev/coordinator-args"] = (
        f"--samples {SAMPLES} --shard-size 10 --epochs {EPOCHS} --lease-timeout-s 15"
    )
    document["spec"]["timeouts"]["drainSeconds"] = 20
    (container,) = document["spec"]["template"]["spec"]["containers"]
    container["env"] = [{"name": "EDL_TIMEOUT_S", "value": "120"}]
    return yaml.safe_dump(document, sort_keys=False)


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(tmp_path / "home", slots=2)
    yield h
    h.close()


def committed(h: Harness, key: str) -> int:
    progress = h.cluster.progress(key)
    return int(progress.committed_step) if progress is not None else 0


@pytest.mark.slow
def test_a_ps_job_survives_a_killed_server_and_a_suspension(
    harness: Harness, tmp_path: Path
) -> None:
    h, out = harness, tmp_path / "out"
    key = h.submit(ps_job("ctr", out))

    def running() -> bool:
        live = [w for w in h.store.replicas(key) if not w.draining]
        return len(live) == 4 and committed(h, key) >= 20

    h.until("two servers, two workers and 20 committed steps", running)
    servers = h.store.servers(key)
    assert [s.slots for s in servers] == [(), ()], "a server holds no slot"
    env = psutil.Process(servers[0].pid).environ()
    assert env["EDL_ROLE"] == "pserver" and env["EDL_TRUSTED_KEY"]
    snapshots = Path(env["EDL_PS_SNAPSHOTS"])
    assert snapshots.parent == h.cluster.config.state_dir
    argv = psutil.Process(h.store.workers(key)[0].pid).cmdline()
    assert argv[argv.index("--snapshot-dir") + 1] == str(snapshots)
    assert any(snapshots.glob("step-*")), "the servers write their snapshots there"

    victim = servers[0]
    assert victim.pid is not None
    os.kill(victim.pid, signal.SIGKILL)

    def replaced() -> bool:
        names = {s.name for s in h.store.servers(key)}
        return len(names) == 2 and victim.name not in names

    h.until("a replacement server", replaced)
    at_kill = committed(h, key)
    h.until("training on after the rollback", lambda: committed(h, key) >= at_kill + 10)

    h.cluster.set_suspended(key, True)
    h.until(
        "Suspended with no server or worker left",
        lambda: h.phase(key) is JobPhase.SUSPENDED and not h.store.replicas(key),
    )
    h.cluster.set_suspended(key, False)
    h.until("Succeeded", lambda: h.phase(key) is JobPhase.SUCCEEDED, 180)

    row = h.cluster.get(key)
    assert row.job.status.restarts == 1, "the killed server, only"
    reasons = [e.reason for e in h.store.events(key)]
    assert "ServerFailed" in reasons and reasons.count("ServerStarted") >= 5
    expected = torch.full((SAMPLES,), float(EPOCHS), dtype=torch.float64)
    steps = SAMPLES * EPOCHS // BATCH
    summaries = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}
    final = [name for name, s in summaries.items() if s["pulled"] == steps]
    assert len(final) == 2, summaries
    for name in final:
        counts = torch.load(out / f"{name}.pt")["counts"]
        assert torch.equal(counts, expected), f"{name}: {counts.unique(return_counts=True)}"
    assert any(s["rolled_back"] >= 1 for s in summaries.values()), summaries
    assert all(r.role is Role.PSERVER or r.slots for r in h.store.replicas(key))


@pytest.mark.slow
def test_the_ctr_example_runs_on_the_local_backend(harness: Harness) -> None:
    h = harness
    example = Path(__file__).resolve().parents[2] / "examples" / "07-ctr"
    job = load_training_job((example / "ctr.yaml").read_text())
    h.cluster.submit(job, str(example))
    h.until("Succeeded", lambda: h.phase(job.key) is JobPhase.SUCCEEDED, 240)
    names = h.cluster.log_names(job.key)
    assert [n for n in names if n.startswith("pserver-")], names
    ends = [
        h.cluster.log_path(job.key, n).read_text().strip().splitlines()[-1]
        for n in names
        if n.startswith("worker-")
    ]
    found = [re.search(r"done, \d+ steps, auc ([0-9.]+)", e) for e in ends]
    aucs = [float(m.group(1)) for m in found if m is not None]
    assert aucs and min(aucs) >= 0.7, ends  # a constant predictor scores 0.5


def test_references_in_arguments_expand_as_on_kubernetes() -> None:
    env = {"EDL_PS_SNAPSHOTS": "/s", "A": "1"}
    assert expand("--dir=$(EDL_PS_SNAPSHOTS)/x", env) == "--dir=/s/x"
    assert expand("$$(A) $(A)$(A) $(B) $$ $A", env) == "$(A) 11 $(B) $ $A"
