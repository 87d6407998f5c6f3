"""TLS between a job's processes, where the deployment turns it on.

Why: the coordinator's and the parameter servers' calls carry credentials and the job's
state; on a network others share, plaintext lets whoever can read packets replay a worker's
credential or read the parameters. With TLS on, every server of a job (its coordinator and
its parameter servers) presents one certificate of the job's own, and every client trusts
that certificate only (pinned; no certificate authority of the cluster is involved). Servers
are reached at addresses no certificate can name in advance (pod IPs, Service names), so
the certificate names ``SERVER_NAME`` and clients check that name whatever address they dial.

The launcher derives the job's key and certificate from a secret it already keeps per job
(the controller's per-job token), deterministically: an ECDSA P-256 key, a self-signed
certificate with fixed fields and a deterministic (RFC 6979) signature. So the controller
can hand the certificate to clients again after a restart without reading a Secret back.

What must stay true: a TLS server answers no plaintext client and a client trusts no
certificate but its job's; the same secret always gives byte-for-byte the same certificate;
the private key goes only to the job's servers.
"""

from __future__ import annotations

import datetime
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

#: The name every server certificate of a job carries, and every client checks.
SERVER_NAME = "edl-job"
#: The certificate's validity: fixed, so that it is the same whenever it is derived.
VALID_FROM = datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC)
VALID_UNTIL = datetime.datetime(2100, 1, 1, tzinfo=datetime.UTC)
#: The order of P-256's group: a private key is a number in [1, ORDER).
ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551

CERT_ENV = "EDL_TLS_CERT"
KEY_ENV = "EDL_TLS_KEY"


@dataclass(frozen=True, slots=True)
class JobTls:
    """A job's TLS certificate (PEM), and its private key where a server holds it."""

    cert_pem: str
    key_pem: str | None = None

    @classmethod
    def derived(cls, secret: str) -> JobTls:
        """The job's key and certificate, always the same for the same ``secret``."""
        digest = hashlib.sha256(b"edl-tls-key\0" + secret.encode()).digest()
        key = ec.derive_private_key(int.from_bytes(digest, "big") % (ORDER - 1) + 1, ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, SERVER_NAME)])
        serial = int.from_bytes(hashlib.sha256(b"edl-tls-serial\0" + digest).digest()[:16], "big")
        certificate = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(serial >> 1 or 1)
            .not_valid_before(VALID_FROM)
            .not_valid_after(VALID_UNTIL)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(SERVER_NAME)]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256(), ecdsa_deterministic=True)
        )
        key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        cert_pem = certificate.public_bytes(serialization.Encoding.PEM)
        return cls(cert_pem.decode("ascii"), key_pem.decode("ascii"))

    def for_clients(self) -> JobTls:
        """The same certificate without the key: what a client (a worker, the controller)
        gets."""
        return JobTls(self.cert_pem)

    def environ(self) -> dict[str, str]:
        """The variables that give a process this TLS setting (``from_environ``)."""
        key = {KEY_ENV: self.key_pem} if self.key_pem else {}
        return {CERT_ENV: self.cert_pem, **key}


def from_environ(env: Mapping[str, str]) -> JobTls | None:
    """The process's TLS setting: None (plaintext) unless ``EDL_TLS_CERT`` is set."""
    cert = env.get(CERT_ENV)
    if not cert:
        return None
    return JobTls(cert, env.get(KEY_ENV) or None)


def listening(server: grpc.Server, address: str, tls: JobTls | None) -> int:
    """Bind ``server`` at ``address``: with the job's key when TLS is on (then only TLS
    clients are answered), in plaintext otherwise. Returns the port (0: it failed)."""
    if tls is None:
        return int(server.add_insecure_port(address))
    if tls.key_pem is None:
        raise ValueError(f"TLS is on ({CERT_ENV}) but {KEY_ENV}, the servers' key, is not set")
    credentials = grpc.ssl_server_credentials([(tls.key_pem.encode(), tls.cert_pem.encode())])
    return int(server.add_secure_port(address, credentials))


def opening_channel(
    address: str, options: Sequence[tuple[str, Any]], tls: JobTls | None
) -> grpc.Channel:
    """A channel to one of the job's servers: trusting the job's certificate only (and the
    name it carries) when TLS is on, in plaintext otherwise."""
    if tls is None:
        return grpc.insecure_channel(address, options=list(options))
    trusted = grpc.ssl_channel_credentials(root_certificates=tls.cert_pem.encode())
    named = [*options, ("grpc.ssl_target_name_override", SERVER_NAME)]
    return grpc.secure_channel(address, trusted, options=named)
