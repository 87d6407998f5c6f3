#!/usr/bin/env bash
# Starts a coordinator and 3 local workers, then resizes: drain one (3 -> 2), add one (-> 3).
set -euo pipefail
cd "$(dirname "$0")/../.."
export EDL_JOB_TOKEN="example-$RANDOM" EDL_JOB_ID=example PYTHONPATH="$PWD" OMP_NUM_THREADS=1
work=$(mktemp -d)
python -m trainer_runtime.coordinator --samples 4096 --shard-size 128 --epochs 20 \
  --port-file "$work/port" --exit-when-finished &
coordinator=$!
while [ ! -s "$work/port" ]; do sleep 0.1; done
export EDL_COORDINATOR="127.0.0.1:$(cat "$work/port")"
pids=()
for worker in w0 w1 w2; do
  EDL_WORKER_ID=$worker python examples/01-elastic-torch/train.py & pids+=($!)
done
python - <<'PY'
import os, time
from trainer_runtime.client import CoordinatorClient
client = CoordinatorClient(os.environ["EDL_COORDINATOR"], os.environ["EDL_JOB_TOKEN"])
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    progress = client.progress()
    if len(progress.members) == 3 and progress.committed_step >= 100:
        break
    time.sleep(0.2)
print("draining w2 at step", client.progress().committed_step)
client.drain("w2")
PY
EDL_WORKER_ID=w3 python examples/01-elastic-torch/train.py & pids+=($!)
for pid in "${pids[@]}"; do wait "$pid"; done
wait "$coordinator"
