"""A real Kubernetes 1.20 control plane on 127.0.0.1 for the tests: etcd, kube-apiserver and,
optionally, kube-controller-manager and kube-scheduler, run as local processes.

The controller is tested against the API server itself (its schema validation, RBAC, owner
references and garbage collection, watches and conflicts), not against a fake. There are no
kubelets: tests create Node objects (`nodes.py`) and play the kubelet themselves.

The binaries come from `scripts/kube-testenv.sh`, which builds them once from Debian's
`kubernetes` source package and caches them outside the repository.

What must stay true:
- everything listens on 127.0.0.1 only, on ports the kernel hands out, so that runs side by
  side do not meet (the 1.20 insecure ports are switched off);
- every wait is bounded, and a failure raises `ControlPlaneError` with the end of the log of
  each process started;
- `stop()` ends only the processes that `start()` began, by PID: SIGTERM, then SIGKILL after a
  bounded wait; it also removes the temporary directory (certificates, etcd data, logs).
"""

from __future__ import annotations

import ctypes
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import kubernetes
import yaml

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "scripts" / "kube-testenv.sh"
SERVICE_CIDR = "10.96.0.0/16"
SERVICE_IP = "10.96.0.1"
ADMIN_USER = "edl-admin"

#: The node-lifecycle controller would mark our kubelet-less nodes unreachable and evict their
#: pods; everything else the controller manager runs by default stays on (garbage collection,
#: service accounts and their tokens, ReplicaSets, pod GC, ...).
CONTROLLERS = "*,-nodelifecycle"


class ControlPlaneError(RuntimeError):
    """The control plane could not be built, started or reached in time."""


def ensure_binaries(timeout_s: float = 1800.0) -> Path:
    """Runs `scripts/kube-testenv.sh` (a no-op once built) and returns its bin directory."""
    with subprocess.Popen(
        ["bash", str(BUILD_SCRIPT)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as proc:
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except BaseException:
            # The script's make and go children share its session: end them with it.
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            raise
    if proc.returncode != 0:
        raise ControlPlaneError(
            f"{BUILD_SCRIPT.name} exited with {proc.returncode}:\n{_tail(err, 40)}"
        )
    lines = out.strip().splitlines()
    bin_dir = Path(lines[-1]) if lines else Path()
    if not (bin_dir / "kube-apiserver").is_file():
        raise ControlPlaneError(f"{BUILD_SCRIPT.name} printed no bin directory: {out!r}")
    return bin_dir


@dataclass(frozen=True, slots=True)
class KubeAPI:
    """What a test needs to talk to the running API server as a cluster admin."""

    kubeconfig: Path
    server: str
    token: str
    ca_file: Path
    api_client: kubernetes.client.ApiClient
    bin_dir: Path

    def new_client(self) -> kubernetes.client.ApiClient:
        """A fresh client of its own (for a controller under test, say); the caller closes it."""
        return kubernetes.config.new_client_from_config(config_file=str(self.kubeconfig))

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout_s: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """Runs Debian's kubectl 1.20 against this API server."""
        result = subprocess.run(
            [str(self.bin_dir / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        if check and result.returncode != 0:
            raise ControlPlaneError(
                f"kubectl {' '.join(args)} exited with {result.returncode}:\n{result.stderr}"
            )
        return result


@dataclass(slots=True)
class LocalProcess:
    """One control-plane process, its output in a log file of its own."""

    name: str
    argv: Sequence[str]
    log_path: Path
    popen: subprocess.Popen[bytes] | None = field(default=None, init=False)

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.popen = subprocess.Popen(
                list(self.argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )

    def exited(self) -> int | None:
        assert self.popen is not None
        return self.popen.poll()

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL if it is still there after `grace_s`; always reaped."""
        if self.popen is None or self.popen.poll() is not None:
            return
        self.popen.terminate()
        try:
            self.popen.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(timeout=grace_s)

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return _tail(text, lines)


class ControlPlane:
    """etcd, kube-apiserver and, if asked, kube-controller-manager and kube-scheduler.

    `start()` writes certificates, a token file and a kubeconfig into a temporary directory,
    starts the processes in order and waits until each is ready; `stop()` undoes all of it.
    """

    def __init__(
        self,
        bin_dir: Path,
        *,
        controller_manager: bool = True,
        scheduler: bool = False,
        startup_timeout_s: float = 90.0,
    ) -> None:
        self.bin_dir = bin_dir
        self.controller_manager = controller_manager
        self.scheduler = scheduler
        self.startup_timeout_s = startup_timeout_s
        self.token = secrets.token_hex(24)
        self.processes: list[LocalProcess] = []
        self.workdir: Path | None = None
        self.api: KubeAPI | None = None

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> KubeAPI:
        shm = Path("/dev/shm")
        # etcd fsyncs every write: on tmpfs that costs nothing, and the data is throwaway.
        base = shm if shm.is_dir() and os.access(shm, os.W_OK) else None
        self.workdir = Path(tempfile.mkdtemp(prefix="edl-kube-", dir=base))
        try:
            return self._start(self.workdir)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.api is not None:
            self.api.api_client.close()
            self.api = None
        for proc in reversed(self.processes):
            proc.stop()
        self.processes.clear()
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def _start(self, d: Path) -> KubeAPI:
        pki = _write_certificates(d / "pki")
        tokens = d / "tokens.csv"
        tokens.write_text(f'{self.token},{ADMIN_USER},{ADMIN_USER},"system:masters"\n')
        tokens.chmod(0o600)

        etcd_port, peer_port, api_port = _free_ports(3)
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        server = f"https://127.0.0.1:{api_port}"
        kubeconfig = d / "kubeconfig"
        _write_kubeconfig(kubeconfig, server, pki["ca.crt"], self.token)

        etcd = self._spawn(
            "etcd",
            [
                str(self.bin_dir / "etcd"),
                "--name=edl-test",
                f"--data-dir={d / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-cluster=edl-test=http://127.0.0.1:{peer_port}",
                "--initial-cluster-state=new",
                "--logger=zap",
                "--log-outputs=stderr",
            ],
        )
        self._wait(lambda: _http_ok(f"{etcd_url}/health"), "etcd /health", [etcd])

        apiserver = self._spawn(
            "kube-apiserver",
            [
                str(self.bin_dir / "kube-apiserver"),
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={api_port}",
                "--insecure-port=0",
                f"--cert-dir={d / 'pki'}",
                f"--tls-cert-file={pki['apiserver.crt']}",
                f"--tls-private-key-file={pki['apiserver.key']}",
                f"--client-ca-file={pki['ca.crt']}",
                f"--token-auth-file={tokens}",
                "--authorization-mode=RBAC",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki['sa.pub']}",
                f"--service-account-signing-key-file={pki['sa.key']}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                # The "kubernetes" Service's endpoints would be 127.0.0.1, which Endpoints
                # validation refuses; nothing in the tests routes to that Service.
                "--endpoint-reconciler-type=none",
                "--allow-privileged=true",
                "--profiling=false",
            ],
        )
        ready_url = f"{server}/readyz"
        tls = ssl.create_default_context(cafile=str(pki["ca.crt"]))
        self._wait(
            lambda: _http_ok(ready_url, token=self.token, tls=tls),
            "kube-apiserver /readyz",
            [etcd, apiserver],
        )

        api = KubeAPI(
            kubeconfig=kubeconfig,
            server=server,
            token=self.token,
            ca_file=pki["ca.crt"],
            api_client=kubernetes.config.new_client_from_config(config_file=str(kubeconfig)),
            bin_dir=self.bin_dir,
        )
        self.api = api

        if self.controller_manager:
            kcm = self._spawn(
                "kube-controller-manager",
                [
                    str(self.bin_dir / "kube-controller-manager"),
                    f"--kubeconfig={kubeconfig}",
                    f"--controllers={CONTROLLERS}",
                    f"--service-account-private-key-file={pki['sa.key']}",
                    f"--root-ca-file={pki['ca.crt']}",
                    f"--cluster-signing-cert-file={pki['ca.crt']}",
                    f"--cluster-signing-key-file={pki['ca.key']}",
                    "--use-service-account-credentials=false",
                    "--leader-elect=false",
                    "--port=0",
                    "--secure-port=0",
                    "--profiling=false",
                ],
            )
            # Pods cannot be admitted before their namespace's "default" ServiceAccount has a
            # token; that one existing in "default" shows the controllers are running.
            core = kubernetes.client.CoreV1Api(api.api_client)
            self._wait(
                lambda: _default_token_ready(core),
                "the default ServiceAccount's token (kube-controller-manager)",
                [etcd, apiserver, kcm],
            )

        if self.scheduler:
            scheduler = self._spawn(
                "kube-scheduler",
                [
                    str(self.bin_dir / "kube-scheduler"),
                    f"--kubeconfig={kubeconfig}",
                    "--leader-elect=false",
                    "--port=0",
                    "--secure-port=0",
                ],
            )
            self._wait(lambda: True, "kube-scheduler", [scheduler])
        return api

    # -- helpers --------------------------------------------------------------------------

    def _spawn(self, name: str, argv: Sequence[str]) -> LocalProcess:
        assert self.workdir is not None
        proc = LocalProcess(name, argv, self.workdir / f"{name}.log")
        self.processes.append(proc)
        proc.start()
        return proc

    def _wait(self, ready: Callable[[], bool], what: str, watched: Sequence[LocalProcess]) -> None:
        """Polls `ready` until it holds; raises if a watched process exits or time runs out."""
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            for proc in watched:
                code = proc.exited()
                if code is not None:
                    raise ControlPlaneError(
                        f"{proc.name} exited with {code} while waiting for {what}:\n"
                        f"{proc.log_tail()}"
                    )
            if ready():
                return
            if time.monotonic() > deadline:
                logs = "\n".join(f"--- {p.name}:\n{p.log_tail()}" for p in self.processes)
                raise ControlPlaneError(
                    f"timed out after {self.startup_timeout_s} s waiting for {what}\n{logs}"
                )
            time.sleep(0.2)


@contextmanager
def running_control_plane(
    bin_dir: Path,
    *,
    controller_manager: bool = True,
    scheduler: bool = False,
    startup_timeout_s: float = 90.0,
) -> Iterator[KubeAPI]:
    plane = ControlPlane(
        bin_dir,
        controller_manager=controller_manager,
        scheduler=scheduler,
        startup_timeout_s=startup_timeout_s,
    )
    try:
        yield plane.start()
    finally:
        plane.stop()


# -- certificates, kubeconfig, probes -------------------------------------------------------

_OPENSSL_CONFIG = f"""\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = edl-test
[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign, digitalSignature
subjectKeyIdentifier = hash
[serving]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
subjectAltName = IP:127.0.0.1, DNS:localhost, IP:{SERVICE_IP}, DNS:kubernetes, \
DNS:kubernetes.default, DNS:kubernetes.default.svc, DNS:kubernetes.default.svc.cluster.local
"""


def _write_certificates(pki: Path) -> dict[str, Path]:
    """A CA, the API server's serving certificate (127.0.0.1, localhost and the in-cluster
    names) and the service-account signing key pair, all made with openssl."""
    pki.mkdir(mode=0o700)
    config = pki / "openssl.cnf"
    config.write_text(_OPENSSL_CONFIG)
    paths = {
        name: pki / name
        for name in ("ca.key", "ca.crt", "apiserver.key", "apiserver.csr", "apiserver.crt")
    }
    paths |= {"sa.key": pki / "sa.key", "sa.pub": pki / "sa.pub"}
    rsa = ["-newkey", "rsa:2048", "-nodes", "-config", str(config)]
    p = {k: str(v) for k, v in paths.items()}
    # fmt: off
    steps = [
        ["req", "-x509", *rsa, "-extensions", "ca", "-subj", "/CN=edl-test-ca", "-days", "30",
         "-keyout", p["ca.key"], "-out", p["ca.crt"]],
        ["req", "-new", *rsa, "-subj", "/CN=kube-apiserver",
         "-keyout", p["apiserver.key"], "-out", p["apiserver.csr"]],
        ["x509", "-req", "-in", p["apiserver.csr"], "-CA", p["ca.crt"], "-CAkey", p["ca.key"],
         "-CAcreateserial", "-days", "30", "-extfile", str(config), "-extensions", "serving",
         "-out", p["apiserver.crt"]],
        ["genrsa", "-out", p["sa.key"], "2048"],
        ["rsa", "-in", p["sa.key"], "-pubout", "-out", p["sa.pub"]],
    ]
    # fmt: on
    for step in steps:
        result = subprocess.run(
            ["openssl", *step], capture_output=True, text=True, timeout=60, check=False
        )
        if result.returncode != 0:
            raise ControlPlaneError(f"openssl {step[0]} failed:\n{result.stderr}")
    return paths


def _write_kubeconfig(path: Path, server: str, ca_file: Path, token: str) -> None:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "edl-test",
                "cluster": {"server": server, "certificate-authority": str(ca_file)},
            }
        ],
        "users": [{"name": ADMIN_USER, "user": {"token": token}}],
        "contexts": [{"name": "edl-test", "context": {"cluster": "edl-test", "user": ADMIN_USER}}],
        "current-context": "edl-test",
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)


def _http_ok(url: str, token: str | None = None, tls: ssl.SSLContext | None = None) -> bool:
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=2, context=tls) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _default_token_ready(core: kubernetes.client.CoreV1Api) -> bool:
    try:
        account = core.read_namespaced_service_account("default", "default")
    except kubernetes.client.ApiException:
        return False
    return bool(account.secrets)


def _free_ports(count: int) -> list[int]:
    """Ports the kernel hands out on 127.0.0.1, all held until every one is chosen."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _libc_prctl() -> Callable[..., int] | None:
    try:
        prctl: Callable[..., int] = ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return prctl


#: Looked up here, in the parent: the forked child of a process with threads (the kubelet
#: in miniature's, a client's pools) must not dlopen, which takes the loader's lock another
#: thread may have held at the fork; it only calls the function.
_PRCTL = _libc_prctl()


def _die_with_parent() -> None:
    """In the child: SIGKILL when the test process dies, even by SIGKILL, so no etcd or API
    server outlives a killed test run."""
    pr_set_pdeathsig = 1
    if _PRCTL is not None:
        _PRCTL(pr_set_pdeathsig, signal.SIGKILL)


def _tail(text: str, lines: int) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])
