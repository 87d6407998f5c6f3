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
source examples/ps-launcher.sh  # coordinating ARGS, server ID, waiting WHAT CONDITION
coordinating --samples 8192 --shard-size 256 --epochs 8
server ps0; ps0=$!
server ps1; ps1=$!
pids=()
for ((i = 0; i < workers; i++)); do
  EDL_JOB_TOKEN=$(issue worker w$i) EDL_WORKER_ID=w$i python examples/05-parameter-server/train.py & pids+=($!)
done
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
