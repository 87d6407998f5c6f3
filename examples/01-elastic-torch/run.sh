#!/usr/bin/env bash
# Starts a coordinator and N local workers (default 3), then resizes: drain the last one
# (N -> N-1) and add a new one (-> N), without restarting anyone.
set -euo pipefail
cd "$(dirname "$0")/../.."
workers=${1:-3}
export EDL_JOB_ID=example PYTHONPATH="$PWD" OMP_NUM_THREADS=1
source examples/launcher.sh  # this script's own credentials: see there
export EDL_WORKERS=$workers
work=$(mktemp -d)
python -m trainer_runtime.coordinator --samples 4096 --shard-size 128 --epochs 60 \
  --port-file "$work/port" --exit-when-finished &
coordinator=$!
while [ ! -s "$work/port" ]; do sleep 0.1; done
export EDL_COORDINATOR="127.0.0.1:$(cat "$work/port")"
pids=()
for ((i = 0; i < workers; i++)); do
  EDL_JOB_TOKEN=$(issue worker w$i) EDL_WORKER_ID=w$i python examples/01-elastic-torch/train.py & pids+=($!)
done
python - <<'PY'
import os, time
from trainer_runtime.client import CoordinatorClient
client = CoordinatorClient(os.environ["EDL_COORDINATOR"], os.environ["EDL_CONTROLLER_TOKEN"])
workers = int(os.environ["EDL_WORKERS"])
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    progress = client.progress()
    if len(progress.members) == workers and progress.committed_step >= 100:
        break
    time.sleep(0.2)
victim = f"w{workers - 1}"
print(f"draining {victim} at step", client.progress().committed_step, flush=True)
client.drain(victim)
PY
EDL_JOB_TOKEN=$(issue worker w$workers) EDL_WORKER_ID=w$workers python examples/01-elastic-torch/train.py & pids+=($!)
python - <<'PY'
import os, time
from trainer_runtime.client import CoordinatorClient
client = CoordinatorClient(os.environ["EDL_COORDINATOR"], os.environ["EDL_CONTROLLER_TOKEN"])
newcomer = f"w{os.environ['EDL_WORKERS']}"
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    progress = client.progress()
    if newcomer in [m.worker_id for m in progress.members]:
        print(f"{newcomer} joined at step", progress.committed_step, flush=True)
        break
    time.sleep(0.2)
PY
for pid in "${pids[@]}"; do wait "$pid"; done
wait "$coordinator"
