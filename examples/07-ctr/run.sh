#!/usr/bin/env bash
# Runs the CTR example without a scheduler: a coordinator, 2 parameter servers and N workers
# (default 2) started by hand with the environment contract. Mid-run a server is killed with
# SIGKILL: the job rolls back to its last snapshot (parameters, momentum and the
# coordinator's data ledger together), a replacement server joins, and training goes on.
# Every process but the killed server must exit 0.
set -euo pipefail
cd "$(dirname "$0")/../.."
workers=${1:-2}
samples=65536  # the coordinator's --samples and train.py's, which must be equal
export EDL_JOB_ID=example-ctr PYTHONPATH="$PWD" OMP_NUM_THREADS=1
source examples/launcher.sh  # this script's own credentials: see there
work=$(mktemp -d)
export EDL_PS_SNAPSHOTS="$work/snapshots"
source examples/ps-launcher.sh  # coordinating ARGS, server ID, waiting WHAT CONDITION
coordinating --samples "$samples" --shard-size 256 --epochs 2
server ps0; ps0=$!
server ps1; ps1=$!
pids=()
for ((i = 0; i < workers; i++)); do
  EDL_JOB_TOKEN=$(issue worker w$i) EDL_WORKER_ID=w$i \
    python examples/07-ctr/train.py --samples "$samples" & pids+=($!)
done
waiting "training" "p.committed_step >= 200"
kill -9 "$ps1" && echo "ps1 killed"
server ps2; ps2=$!
waiting "ps2 joined" "'ps2' in servers"
for pid in "${pids[@]}" "$coordinator" "$ps0" "$ps2"; do wait "$pid"; done  # set -e: each 0
echo "the job finished: every process but the killed ps1 exited 0"
