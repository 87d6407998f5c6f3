"""The kubelet's probe of a runtime server: ``python -m trainer_runtime.protocol.health_probe
--port N``, run inside the server's container (an ``exec`` probe).

Why: Kubernetes before 1.24 has no ``grpc`` probe, and the controller supports 1.20; this
calls the server's standard health service (``health``) instead, as a ``grpc`` probe would.
Exit 0 when the server answers SERVING; 1 when it answers anything else, or does not answer
within ``--timeout``; one line says which (the kubelet shows it in the pod's Events).

``--host-env NAME`` reads the address from the container's environment: a parameter server
listens on the pod's IP (``EDL_WORKER_HOST``), not on 127.0.0.1, and an exec probe's command
is not expanded by the kubelet. Where the job's servers speak TLS (``EDL_TLS_CERT`` in the
container's environment), so does the probe.
"""

from __future__ import annotations

import argparse
import os
import sys

import grpc

from trainer_runtime.protocol.health import SERVING, check, status_name
from trainer_runtime.protocol.tls import from_environ as tls_from_environ


def parsing(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m trainer_runtime.protocol.health_probe")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--host-env", default=None, help="take the host from this variable")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parsing(argv)
    host = os.environ.get(args.host_env, "") if args.host_env else args.host
    if not host:
        print(f"{args.host_env} is not set: no address to probe", file=sys.stderr)
        return 1
    address = f"[{host}]:{args.port}" if ":" in host else f"{host}:{args.port}"
    try:
        status = check(address, args.timeout, tls_from_environ(os.environ))
    except grpc.RpcError as error:
        print(f"{address}: no answer ({error.code().name})", file=sys.stderr)
        return 1
    print(f"{address}: {status_name(status)}")
    return 0 if status == SERVING else 1


if __name__ == "__main__":
    sys.exit(main())
