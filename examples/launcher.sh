# Sourced by the examples' run.sh after EDL_JOB_ID is set: the script plays the launcher
# of its job. It keeps the job's signing key to itself (in this shell, not exported),
# gives the coordinator and the parameter servers the public half (EDL_TRUSTED_KEY,
# EDL_JOB_IDENTITY), and its resizing steps the controller's credential
# (EDL_CONTROLLER_TOKEN); `issue worker|server ID` makes a process's own credential
# (trainer_runtime/protocol/credentials.py).
key=$(python -m trainer_runtime.protocol.credentials new-key)
issue() {
  EDL_SIGNING_KEY=$key python -m trainer_runtime.protocol.credentials issue "$EDL_JOB_IDENTITY" "$@"
}
EDL_TRUSTED_KEY=$(EDL_SIGNING_KEY=$key python -m trainer_runtime.protocol.credentials public-key)
export EDL_TRUSTED_KEY EDL_JOB_IDENTITY=$EDL_JOB_ID
EDL_CONTROLLER_TOKEN=$(issue controller)
export EDL_CONTROLLER_TOKEN
