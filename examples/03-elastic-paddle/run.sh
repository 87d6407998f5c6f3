#!/usr/bin/env bash
# Starts a coordinator and N local Paddle workers (default 3), then resizes three ways:
# drain the last one (N -> N-1), add a new one (-> N), SIGKILL one (-> N-1), all without
# restarting any survivor.
set -euo pipefail
cd "$(dirname "$0")/../.."
workers=${1:-3}
export EDL_JOB_ID=example PYTHONPATH="$PWD" OMP_NUM_THREADS=1
source examples/launcher.sh  # this script's own credentials: see there
export EDL_WORKERS=$workers PADDLE_DISTRI_BACKEND=gloo
work=$(mktemp -d)
python -m trainer_runtime.coordinator --samples 4096 --shard-size 128 --epochs 30 \
  --port-file "$work/port" --exit-when-finished &
coordinator=$!
while [ ! -s "$work/port" ]; do sleep 0.1; done
export EDL_COORDINATOR="127.0.0.1:$(cat "$work/port")"
pids=()
for ((i = 0; i < workers; i++)); do
  EDL_JOB_TOKEN=$(issue worker w$i) EDL_WORKER_ID=w$i python examples/03-elastic-paddle/train.py & pids+=($!)
done
waiting() {  # waiting MEMBERS_AT_LEAST STEP_AT_LEAST [NAME]: until the job is there
  python - "$@" <<'PY'
import os, sys, time
from trainer_runtime.client import CoordinatorClient
client = CoordinatorClient(os.environ["EDL_COORDINATOR"], os.environ["EDL_CONTROLLER_TOKEN"])
members, step = int(sys.argv[1]), int(sys.argv[2])
name = sys.argv[3] if len(sys.argv) > 3 else None
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    progress = client.progress()
    names = [m.worker_id for m in progress.members]
    if len(names) >= members and progress.committed_step >= step and (name is None or name in names):
        print(f"members {names} at step {progress.committed_step}", flush=True)
        sys.exit(0)
    time.sleep(0.2)
sys.exit("timed out waiting for the job")
PY
}
waiting "$workers" 100
victim=w$((workers - 1))
echo "draining $victim"
python -c "
import os
from trainer_runtime.client import CoordinatorClient
CoordinatorClient(os.environ['EDL_COORDINATOR'], os.environ['EDL_CONTROLLER_TOKEN']).drain('$victim')"
EDL_JOB_TOKEN=$(issue worker w$workers) EDL_WORKER_ID=w$workers python examples/03-elastic-paddle/train.py & pids+=($!)
waiting "$workers" 0 "w$workers"
waiting "$workers" 400
echo "SIGKILL w1 (pid ${pids[1]})"
kill -KILL "${pids[1]}"
status=0
for i in "${!pids[@]}"; do
  if [ "$i" -eq 1 ]; then wait "${pids[$i]}" || true; else wait "${pids[$i]}" || status=1; fi
done
wait "$coordinator"
exit $status
