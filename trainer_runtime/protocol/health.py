"""The standard gRPC health service (``grpc.health.v1.Health``) of the runtime's servers.

Why: the kubelet (a ``grpc`` probe on Kubernetes 1.24 and later, or ``health_probe`` in an
``exec`` probe) and any load balancer know this service; they cannot speak the coordinator's
or the parameter server's own API, which needs a credential of the job. So each server registers
this one beside its own handlers: ``Check`` and ``Watch`` (``List`` stays unimplemented).

What must stay true:
- it answers without a credential (a probe has none) and tells nothing but the server's
  overall status (the service name ``""``): any other name is NOT_FOUND;
- SERVING from the start until ``stopping`` is set (the coordinator could not save its
  state, or the server is shutting down); NOT_SERVING from then on, for good: ``Check``
  answers it at once, and every open ``Watch`` is told.
"""

from __future__ import annotations

import threading
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from trainer_runtime.protocol.tls import JobTls, opening_channel

SERVING: int = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING: int = health_pb2.HealthCheckResponse.NOT_SERVING
#: The service name of the server's overall status, the only one answered.
OVERALL = health.OVERALL_HEALTH


def status_name(status: int) -> str:
    """SERVING, NOT_SERVING, ... for a status number."""
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(status))


class _Servicer(health.HealthServicer):  # type: ignore[misc]
    """The reference servicer, whose ``Check`` sees ``stopping`` at once (without waiting
    for the thread that tells the watchers)."""

    def __init__(self, stopping: threading.Event) -> None:
        super().__init__(experimental_non_blocking=True)
        self.stopping = stopping

    def Check(self, request: Any, context: grpc.ServicerContext) -> Any:
        if self.stopping.is_set():
            self.enter_graceful_shutdown()  # idempotent
        return super().Check(request, context)


class HealthService:
    """One server's health: SERVING until ``stopping`` is set, then NOT_SERVING for good."""

    def __init__(self, stopping: threading.Event) -> None:
        self.stopping = stopping
        self.servicer = _Servicer(stopping)
        self._follower = threading.Thread(target=self._following, name="health", daemon=True)

    def register(self, server: grpc.Server) -> None:
        """Adds the service to ``server`` (before it starts) and starts following
        ``stopping``."""
        health_pb2_grpc.add_HealthServicer_to_server(self.servicer, server)
        self._follower.start()

    def _following(self) -> None:
        self.stopping.wait()
        self.servicer.enter_graceful_shutdown()


def check(address: str, timeout_s: float, tls: JobTls | None = None) -> int:
    """The overall status the server at ``address`` answers (over TLS with ``tls``, as the
    server requires when it has it); raises ``grpc.RpcError`` when it does not answer
    within ``timeout_s``."""
    with opening_channel(address, [], tls) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = stub.Check(health_pb2.HealthCheckRequest(service=OVERALL), timeout=timeout_s)
        return int(reply.status)
