#!/usr/bin/env bash
# Starts a coordinator, 2 parameter servers and N workers (default 2), then changes the PS
# group while the job trains: a third server joins (partitions move), the first is drained
# (its partition moves out, it exits 0), the second is killed with SIGKILL (the job rolls
# back to the last snapshot, parameters and data ledger together), and a worker joins.
set -euo pipefail
cd "$(dirname "$0")/../.."
workers=${1:-2}
export EDL_JOB_ID=example-ps PYTHONPATH="$PWD" OMP_NUM_THREADS=1
source examples/launcher.sh  # this script's own credentials: see there
work=$(mktemp -d)
export EDL_PS_SNAPSHOTS="$work/snapshots"
python -m trainer_runtime.coordinator --samples 8192 --shard-size 256 --epochs 8 \
  --port-file "$work/port" --exit-when-finished &
coordinator=$!
while [ ! -s "$work/port" ]; do kill -0 "$coordinator" || exit 1; sleep 0.1; done
export EDL_COORDINATOR="127.0.0.1:$(cat "$work/port")"
server() { EDL_JOB_TOKEN=$(issue server "$1") EDL_WORKER_ID=$1 python -m trainer_runtime.ps --snapshot-dir "$EDL_PS_SNAPSHOTS" & }
server ps0; ps0=$!
server ps1; ps1=$!
pids=()
for ((i = 0; i < workers; i++)); do
  EDL_JOB_TOKEN=$(issue worker w$i) EDL_WORKER_ID=w$i python examples/05-parameter-server/train.py & pids+=($!)
done
waiting() {  # waiting "what" python-condition-on-progress
  python - "$1" "$2" <<'PY'
import os, sys, time
from trainer_runtime.client import CoordinatorClient
client = CoordinatorClient(os.environ["EDL_COORDINATOR"], os.environ["EDL_CONTROLLER_TOKEN"])
deadline = time.monotonic() + 180
while time.monotonic() < deadline:
    p = client.progress()
    servers = [m.worker_id for m in p.servers]
    members = [m.worker_id for m in p.members]
    if eval(sys.argv[2]):
        print(f"{sys.argv[1]} at step {p.committed_step}: servers {servers}, workers {members}",
              flush=True)
        sys.exit(0)
    time.sleep(0.2)
sys.exit(f"timed out waiting for {sys.argv[1]}")
PY
}
waiting "training" "p.committed_step >= 40"
server ps2
waiting "ps2 joined" "'ps2' in servers"
python -c "
import os; from trainer_runtime.client import CoordinatorClient
CoordinatorClient(os.environ['EDL_COORDINATOR'], os.environ['EDL_CONTROLLER_TOKEN']).drain('ps0')"
wait "$ps0" && echo "ps0 drained and exited 0"
waiting "after the drain" "p.committed_step >= 100 and 'ps0' not in servers"
kill -9 "$ps1" && echo "ps1 killed"
EDL_JOB_TOKEN=$(issue worker w$workers) EDL_WORKER_ID=w$workers python examples/05-parameter-server/train.py & pids+=($!)
waiting "w$workers joined" "'w$workers' in members"
for pid in "${pids[@]}"; do wait "$pid"; done
wait "$coordinator"
