#!/usr/bin/env bash
# Starts a coordinator and 4 local workers whose batch adapts, then at step 400 drains two
# (4 -> 2), without restarting anyone: at each size rank 0 decides the batch anew, and
# inside a generation as its measurements come in.
set -euo pipefail
cd "$(dirname "$0")/../.."
export EDL_JOB_ID=example-adaptive PYTHONPATH="$PWD" OMP_NUM_THREADS=1
source examples/launcher.sh  # this script's own credentials: see there
work=$(mktemp -d)
python -m trainer_runtime.coordinator --samples 32768 --shard-size 256 --epochs 10 \
  --port-file "$work/port" --exit-when-finished &
coordinator=$!
while [ ! -s "$work/port" ]; do sleep 0.1; done
export EDL_COORDINATOR="127.0.0.1:$(cat "$work/port")"
starting() {
  EDL_JOB_TOKEN=$(issue worker "$1") EDL_WORKER_ID=$1 \
    python examples/06-adaptive-batch/train.py & pids+=($!)
}
pids=()
for name in w0 w1 w2 w3; do starting "$name"; done
waiting_for() {  # a committed step, and a number of members
  python - "$1" "$2" <<'PY'
import os, sys, time
from trainer_runtime.client import CoordinatorClient
client = CoordinatorClient(os.environ["EDL_COORDINATOR"], os.environ["EDL_CONTROLLER_TOKEN"])
step, members, deadline = int(sys.argv[1]), int(sys.argv[2]), time.monotonic() + 300
while time.monotonic() < deadline:
    progress = client.progress()
    if progress.committed_step >= step and len(progress.members) >= members:
        print(f"{len(progress.members)} workers at step {progress.committed_step}", flush=True)
        break
    time.sleep(0.2)
PY
}
waiting_for 400 4
python - <<'PY'
import os
from trainer_runtime.client import CoordinatorClient
client = CoordinatorClient(os.environ["EDL_COORDINATOR"], os.environ["EDL_CONTROLLER_TOKEN"])
for victim in ("w3", "w2"):
    print(f"draining {victim} at step", client.progress().committed_step, flush=True)
    client.drain(victim)
PY
for pid in "${pids[@]}"; do wait "$pid"; done
wait "$coordinator"
