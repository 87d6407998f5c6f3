"""The kubelet's probes of the servers the controller creates, as pure functions returning
container fields: each job's coordinator and its parameter servers.

Both servers answer the standard gRPC health service (``grpc.health.v1.Health``, without the
caller's credential): SERVING while they can answer, NOT_SERVING once a coordinator stopped because
it could not save its state, or while a server shuts down. The probes ask it.

Why ``exec`` and not ``grpc`` probes: the ``grpc`` probe type exists from Kubernetes 1.24
(beta; alpha behind a feature gate in 1.23), and the controller supports 1.20, whose API
server refuses a probe without a handler it knows (tests/kube runs 1.20). So each probe runs
``python -m trainer_runtime.protocol.health_probe`` inside the server's own container, with
the interpreter that runs the server (the runtime is in the coordinator's image and in the
workers' image, where parameter servers run), and exits 0 on SERVING. It costs a short
Python process (about 0.25 s of CPU) per probe, hence the periods: readiness every 10 s,
liveness every 20 s.

- readiness: the pod shows Ready once its server answers SERVING. It gates nothing of the
  job's traffic: the coordinator's Service publishes its address before (workers and the
  controller reach it as soon as it listens: an admission waits for its first answer, not
  for a probe period), and parameter servers are reached at the address they register;
- liveness: a server that has not answered SERVING for three periods in a row is killed,
  its pod fails (``restartPolicy: Never``) and the controller replaces it as it does a
  failed one (a coordinator from its saved state). The first check waits
  ``LIVENESS_DELAY_S`` for the process to start.

What must stay true: the probe's port and address are the ones the server listens on; a
parameter server with no fixed port (``pserver_port`` 0, pods sharing one address) gets no
probe rather than a wrong one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Manifest = dict[str, Any]

#: The probe's module, run in the server's container by the interpreter that runs the server.
HEALTH_PROBE_MODULE = "trainer_runtime.protocol.health_probe"
READINESS_PERIOD_S = 10
LIVENESS_PERIOD_S = 20
LIVENESS_FAILURES = 3
LIVENESS_DELAY_S = 10
#: The kubelet's deadline of one probe; the probe's own deadline for the call is shorter.
PROBE_TIMEOUT_S = 5
CALL_TIMEOUT_S = 3
#: Addresses that mean "every interface": probed at the loopback address.
_WILDCARDS = frozenset({"", "0.0.0.0", "::", "[::]"})


def interpreter_of(command: Sequence[str]) -> tuple[str, ...]:
    """What runs a server's ``python -m module`` command line: the words before ``-m``."""
    words = tuple(command)
    return words[: words.index("-m")] if "-m" in words[1:] else ("python",)


def health_probes(
    port: int, python: Sequence[str], *, host: str = "", host_env: str = ""
) -> dict[str, Manifest]:
    """``readinessProbe`` and ``livenessProbe`` of a container whose server listens on
    ``port`` at ``host`` (any interface: the loopback), or at the address in the container's
    variable ``host_env``; ``python`` is the interpreter's command (``interpreter_of``)."""
    command = [*python, "-m", HEALTH_PROBE_MODULE, "--port", str(port)]
    command += ["--timeout", str(CALL_TIMEOUT_S)]
    if host_env:
        command += ["--host-env", host_env]
    elif host not in _WILDCARDS:
        command += ["--host", host]
    return {
        "readinessProbe": {
            "exec": {"command": list(command)},
            "periodSeconds": READINESS_PERIOD_S,
            "timeoutSeconds": PROBE_TIMEOUT_S,
            "failureThreshold": 1,
        },
        "livenessProbe": {
            "exec": {"command": list(command)},
            "initialDelaySeconds": LIVENESS_DELAY_S,
            "periodSeconds": LIVENESS_PERIOD_S,
            "timeoutSeconds": PROBE_TIMEOUT_S,
            "failureThreshold": LIVENESS_FAILURES,
        },
    }
