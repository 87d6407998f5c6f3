"""Who may call a job's coordinator and parameter servers: signed credentials, one per caller.

Why: one token shared by a whole job let whoever held it (any worker, or any pod that could
mount the job's Secret) act as every worker and as the controller: commit an epoch as rank 0
with nothing trained, make a real worker leave, set the target to a thousand. Now the
launcher of a job (the controller, or the local service) holds an Ed25519 signing key and
issues each process a credential that names the job, the caller's role and, for a worker
or a server, its worker id. A coordinator and its parameter servers hold only the public
key: they can check a credential but cannot make one, so a compromised server cannot speak
for anyone. A credential looks like ``edl1.<claims>.<signature>`` (both URL-safe base64).

What must stay true:
- a credential verifies only with the issuer's public key, for the job it names (the job's
  identity: on Kubernetes namespace, name and uid, so a job recreated under the same name
  refuses its predecessor's pods);
- a worker's or server's credential names exactly one worker id; whoever checks a call
  compares it with the worker id the call acts for (``callers``);
- the private key never leaves the launcher: pods and processes receive credentials and the
  public key only.

By hand (what ``examples/*/run.sh`` do), with the key in the environment, not the command
line: ``python -m trainer_runtime.protocol.credentials new-key``, then with it in
``EDL_SIGNING_KEY``: ``... public-key`` and ``... issue JOB worker|server|controller [ID]``.
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import json
import os
import sys
import threading
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

PREFIX = "edl1"
#: The variables that give a coordinator or a parameter server the launcher's public key and
#: the job's identity (the runtime's environment contract, written by every launcher).
TRUSTED_KEY_ENV = "EDL_TRUSTED_KEY"
JOB_IDENTITY_ENV = "EDL_JOB_IDENTITY"
#: Credentials checked once are remembered (a worker sends the same one on every call, and
#: a signature check costs ~50 us); bounded so that a flood of forged ones cannot grow it.
CACHE_SIZE = 4096
#: The longest credential accepted before decoding anything: claims of a 261-character id
#: and a 300-character job identity, encoded, with the signature.
MAX_CREDENTIAL = 1500


class CallerRole(enum.Enum):
    """What a credential lets its holder do."""

    WORKER = "worker"  # a training process: acts for its own worker id
    SERVER = "server"  # a parameter server: acts for its own worker id, serves parameters
    CONTROLLER = "controller"  # whoever runs the job: resizes, drains, reads progress


@dataclass(frozen=True, slots=True)
class Claims:
    """What a verified credential says."""

    job: str
    role: CallerRole
    worker_id: str = ""


def _encode(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Issuer:
    """Holds a launcher's signing key and issues credentials with it."""

    def __init__(self, key: Ed25519PrivateKey) -> None:
        self._key = key

    @classmethod
    def generate(cls) -> Issuer:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_secret(cls, secret: str) -> Issuer:
        """The issuer whose key is derived from ``secret`` (a launcher that already keeps a
        random secret per job, as the local service does, needs to keep nothing more)."""
        seed = hashlib.sha256(b"edl-signing-key\0" + secret.encode()).digest()
        return cls(Ed25519PrivateKey.from_private_bytes(seed))

    @classmethod
    def from_text(cls, text: str) -> Issuer:
        """The issuer whose private key ``private_text()`` wrote."""
        try:
            raw = _decode(text.strip())
            return cls(Ed25519PrivateKey.from_private_bytes(raw))
        except (ValueError, binascii.Error) as error:
            raise ValueError(
                f"not an EDL signing key ({error}): expected the 43 characters that "
                "`python -m trainer_runtime.protocol.credentials new-key` prints"
            ) from None

    def private_text(self) -> str:
        raw = self._key.private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )
        return _encode(raw)

    def public_text(self) -> str:
        """The public key, as the coordinator's ``EDL_TRUSTED_KEY`` carries it."""
        raw = self._key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        return _encode(raw)

    def issue(self, job: str, role: CallerRole, worker_id: str = "") -> str:
        """A credential for ``role`` in ``job``; a worker's or server's names its worker id."""
        if (role is CallerRole.CONTROLLER) != (worker_id == ""):
            raise ValueError(
                f"a {role.value} credential {'names no' if worker_id else 'needs a'} worker id"
            )
        claims = json.dumps(
            {"job": job, "role": role.value, "id": worker_id}, separators=(",", ":"), sort_keys=True
        ).encode()
        body = f"{PREFIX}.{_encode(claims)}"
        return f"{body}.{_encode(self._key.sign(body.encode('ascii')))}"


class Verifier:
    """Checks credentials for one job with its launcher's public key."""

    def __init__(self, public_text: str, job: str) -> None:
        try:
            self._key = Ed25519PublicKey.from_public_bytes(_decode(public_text.strip()))
        except (ValueError, binascii.Error) as error:
            raise ValueError(
                f"EDL_TRUSTED_KEY is not a public key ({error}): give the 43 characters "
                "`python -m trainer_runtime.protocol.credentials public-key` prints"
            ) from None
        if not job:
            raise ValueError("the job identity is empty: set EDL_JOB_IDENTITY")
        self.job = job
        self._known: dict[str, Claims | None] = {}
        self._lock = threading.Lock()

    def claims(self, credential: str | bytes | None) -> Claims | None:
        """What ``credential`` says, or None when it is not a valid one of this job."""
        if credential is None:
            return None
        text = (
            credential.decode("ascii", "replace") if isinstance(credential, bytes) else credential
        )
        if len(text) > MAX_CREDENTIAL:
            return None
        with self._lock:
            if text in self._known:
                return self._known[text]
        found = self._checking(text)
        with self._lock:
            if len(self._known) >= CACHE_SIZE:
                self._known.clear()
            self._known[text] = found
        return found

    def _checking(self, text: str) -> Claims | None:
        parts = text.split(".")
        if len(parts) != 3 or parts[0] != PREFIX:
            return None
        try:
            self._key.verify(_decode(parts[2]), f"{parts[0]}.{parts[1]}".encode("ascii"))
            raw = json.loads(_decode(parts[1]))
            claims = Claims(str(raw["job"]), CallerRole(raw["role"]), str(raw["id"]))
        except (InvalidSignature, ValueError, binascii.Error, KeyError, TypeError):
            return None
        return claims if claims.job == self.job else None


@dataclass(frozen=True, slots=True)
class JobCredentials:
    """An issuer and one job's identity: what a launcher needs to start that job's processes."""

    issuer: Issuer
    job: str

    def controller(self) -> str:
        return self.issuer.issue(self.job, CallerRole.CONTROLLER)

    def worker(self, worker_id: str) -> str:
        return self.issuer.issue(self.job, CallerRole.WORKER, worker_id)

    def server(self, worker_id: str) -> str:
        return self.issuer.issue(self.job, CallerRole.SERVER, worker_id)

    def verifier(self) -> Verifier:
        return Verifier(self.issuer.public_text(), self.job)


SIGNING_KEY = "EDL_SIGNING_KEY"
USAGE = (
    "usage: python -m trainer_runtime.protocol.credentials "
    "new-key | public-key | issue JOB ROLE [WORKER_ID]"
)


def main(argv: list[str]) -> int:
    """Make a signing key, or with one in ``EDL_SIGNING_KEY`` print its public key or issue."""
    if argv[:1] == ["new-key"]:
        print(Issuer.generate().private_text())
        return 0
    issuing = argv[:1] == ["issue"] and len(argv) in (3, 4)
    if argv != ["public-key"] and not issuing:
        print(USAGE, file=sys.stderr)
        return 2
    try:
        issuer = Issuer.from_text(os.environ.get(SIGNING_KEY, ""))
    except ValueError as error:
        print(f"{SIGNING_KEY}: {error}", file=sys.stderr)
        return 2
    if not issuing:
        print(issuer.public_text())
        return 0
    roles = {role.value: role for role in CallerRole}
    if argv[2] not in roles:
        print(f"ROLE is one of {', '.join(roles)}, not {argv[2]!r}", file=sys.stderr)
        return 2
    try:
        print(issuer.issue(argv[1], roles[argv[2]], argv[3] if len(argv) == 4 else ""))
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
