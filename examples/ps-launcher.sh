# Sourced by the parameter-server examples' run.sh after launcher.sh, with `work` (a scratch
# directory) and EDL_PS_SNAPSHOTS set. `coordinating ARGS...` starts the job's coordinator
# with ARGS (its PID in $coordinator; it exits once the job finished) and exports
# EDL_COORDINATOR once it listens; `server ID` starts a parameter server in the background
# (its PID in $!); `waiting WHAT CONDITION` waits, 3 minutes at most, until CONDITION (Python
# over the coordinator's progress `p`, and `servers` and `members`, the ids of each) holds,
# then says at which step.
coordinating() {
  python -m trainer_runtime.coordinator "$@" --port-file "$work/port" --exit-when-finished &
  coordinator=$!
  while [ ! -s "$work/port" ]; do kill -0 "$coordinator" || exit 1; sleep 0.1; done
  export EDL_COORDINATOR="127.0.0.1:$(cat "$work/port")"
}
server() { EDL_JOB_TOKEN=$(issue server "$1") EDL_WORKER_ID=$1 python -m trainer_runtime.ps --snapshot-dir "$EDL_PS_SNAPSHOTS" & }
waiting() {
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
