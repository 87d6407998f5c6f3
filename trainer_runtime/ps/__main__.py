"""Run one parameter server: `python -m trainer_runtime.ps --snapshot-dir DIR`.

Its identity and its job come from the environment contract (`EDL_WORKER_ID` is the
server's name; `EDL_WORKER_HOST` the address workers reach it at). It serves, registers with
the coordinator as a server, and keeps a `Watch` stream open (its liveness). It exits 0 when
the leader releases it (it was drained, and its partition moved) or the job finished (once
no worker pulled for a few seconds: the workers pull the final parameters last), and
non-zero when the coordinator no longer knows it (fenced, 3), stays unreachable (4), or a
snapshot cannot be written (5: a full disk; replaced, the job rolls back to its last
complete snapshot). Its health
service (``protocol.health``, for the kubelet's probes) answers SERVING until it starts
shutting down.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from pathlib import Path

from trainer_runtime.client import CoordinatorClient, CoordinatorError, Fenced
from trainer_runtime.environment import ContractError, WorkerContract, verifier_from
from trainer_runtime.ps.serving import ParameterServer, ParameterService
from trainer_runtime.ps.snapshots import SnapshotDirectory

LOG = logging.getLogger("trainer_runtime.ps")
EXIT_FENCED = 3
EXIT_UNREACHABLE = 4
#: A snapshot could not be written (a full disk): replaced, the job rolls back to the last
#: complete snapshot (``serving.SnapshotWriter``).
EXIT_NOT_SAVED = 5
QUIET_S = 3.0  # after the job finished, serve until no pull came for this long


def parsing(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m trainer_runtime.ps")
    parser.add_argument(
        "--snapshot-dir", type=Path, required=True, help="shared by every server and worker"
    )
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--threads", type=int, default=32, help="gRPC handler threads")
    return parser.parse_args(argv)


class Liveness:
    """The server's side of membership: one Watch stream, reopened while the coordinator
    restarts; sets `ended` when the job finished or the server was fenced."""

    def __init__(
        self,
        client: CoordinatorClient,
        server_id: str,
        timeout_s: float,
        released: threading.Event,
    ) -> None:
        self.client = client
        self.released = released
        self.server_id = server_id
        self.timeout_s = timeout_s
        self.ended = threading.Event()
        self.outcome = 0
        self.thread = threading.Thread(target=self.watching, name="ps-watch", daemon=True)

    def watching(self) -> None:
        lost_since: float | None = None
        while not self.ended.is_set():
            try:
                for notice in self.client.watch(self.server_id):
                    lost_since = None
                    if notice.finished or self.released.is_set():
                        self.ending(0)
                    elif notice.generation < 0:
                        LOG.error("%s is no longer known to the coordinator", self.server_id)
                        self.ending(EXIT_FENCED)
                    if self.ended.is_set():
                        return
            except Exception as error:  # the stream drops when the coordinator restarts
                LOG.debug("watch stream ended: %s", error)
            lost_since = lost_since or time.monotonic()
            if time.monotonic() - lost_since > self.timeout_s:
                LOG.error("the coordinator is unreachable for %.0f s", self.timeout_s)
                self.ending(EXIT_UNREACHABLE)
            self.ended.wait(0.1)

    def ending(self, outcome: int) -> None:
        self.outcome = outcome
        self.ended.set()


def main(argv: list[str] | None = None) -> int:
    args = parsing(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        contract = WorkerContract.from_environ()
        verifier = verifier_from()
    except ContractError as error:
        print(error, file=sys.stderr)
        return 2
    released = threading.Event()
    service = ParameterService(SnapshotDirectory(args.snapshot_dir), verifier, released.set)
    server = ParameterServer(service, args.host, args.port, args.threads, contract.tls).start()
    address = f"{contract.host}:{server.port}"
    client = CoordinatorClient(
        contract.coordinator,
        contract.token,
        timeout_s=5.0,
        retry_s=contract.timeout_s,
        tls=contract.tls,
    )
    liveness = Liveness(client, contract.worker_id, contract.timeout_s, released)
    try:
        client.register(contract.worker_id, contract.node, address, server=True)
    except CoordinatorError as error:
        LOG.error("cannot register: %s", error)
        server.stop(0.1)
        return EXIT_FENCED if isinstance(error, Fenced) else EXIT_UNREACHABLE
    print(f"serving on {address}", flush=True)
    liveness.thread.start()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: released.set())
    while not (released.wait(0.2) or liveness.ended.is_set() or service.writer.failed.is_set()):
        pass
    server.stopping.set()  # shutting down: the health service answers NOT_SERVING
    outcome = 0 if released.is_set() else liveness.outcome
    if service.writer.failed.is_set() and not released.is_set():
        outcome = EXIT_NOT_SAVED
        print(f"stopped: a snapshot could not be written ({service.writer.failure})",
              file=sys.stderr)  # fmt: skip
    if not released.is_set() and outcome == 0:  # the job finished: let the last pulls end
        service.awaiting_quiet(QUIET_S, contract.timeout_s)
    if released.is_set():
        try:
            client.leave(contract.worker_id)
        except CoordinatorError as error:
            LOG.warning("could not say goodbye: %s", error)
    liveness.ended.set()
    server.stop(0.5)
    client.close()
    LOG.info("%s exits with %d", contract.worker_id, outcome)
    return outcome


if __name__ == "__main__":
    sys.exit(main())
