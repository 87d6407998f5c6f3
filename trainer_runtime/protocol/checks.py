"""What every server of the runtime checks of a call before its handler runs: who is calling
(its credential, ``credentials``), whether that caller may make this call, and the length of
the names a caller gives.

Why: a worker may act only for itself (commit, lease, leave as its own worker id), and only
the job's controller may resize, drain or read the whole state; a worker id of megabytes
would be kept in the state every save writes (past what a ConfigMap snapshot can hold). The
checks are shared by the coordinator and the parameter servers so they cannot drift apart.

What must stay true: a call without a valid credential of the job, a worker's call that acts
for another worker id or calls a controller's method, a call that names a worker, node,
address or incarnation longer than ``MAX_NAME``, and a report of more than ``MAX_TRAINED``
trained ranges, reach no handler.
"""

from __future__ import annotations

from collections.abc import Iterable

from trainer_runtime.protocol import TOKEN_HEADER, pb
from trainer_runtime.protocol.credentials import CallerRole, Claims, Verifier

#: The longest worker id, node name or address a call may give: a Kubernetes object name
#: (253) and a port.
MAX_NAME = 261
#: The request fields that name something kept in the state, or compared with it.
NAMED_FIELDS = (
    "worker_id",
    "node",
    "store_address",
    "address",
    "incarnation",
    "previous_incarnation",
)
#: The most trained ranges one registration may report: a worker reports one epoch, its
#: ranges merged where they touch, so a million-sample epoch in shards of ten fits.
MAX_TRAINED = 100_000


#: The coordinator's methods only the job's controller may call (a worker may read the
#: job's progress, as a training script does to learn it finished; not its whole state).
CONTROLLER_METHODS = frozenset({"Drain", "SetTarget", "GetSnapshot"})


def caller(metadata: Iterable[tuple[str, str | bytes]], verifier: Verifier) -> Claims | None:
    """Who the call's credential says is calling, or None when it carries no valid one."""
    return verifier.claims(dict(metadata).get(TOKEN_HEADER))


def refusal(claims: Claims, method: str, request: object) -> str | None:
    """Why ``claims`` may not make this call, or None. The controller may make every call; a
    worker or a server only its own: no controller method, its own worker id in the request,
    and its own role when it registers."""
    if claims.role is CallerRole.CONTROLLER:
        return None
    if method in CONTROLLER_METHODS:
        return f"{method} is for the job's controller, not a {claims.role.value}"
    acting = getattr(request, "worker_id", None)
    if isinstance(acting, str) and acting != claims.worker_id:
        return f"the credential of {claims.worker_id!r} cannot act for {acting[:MAX_NAME]!r}"
    registering_as = getattr(request, "role", None)
    if method == "Register" and isinstance(registering_as, int):
        server = registering_as == pb.SERVER
        if server != (claims.role is CallerRole.SERVER):
            return f"a {claims.role.value} credential cannot register as another role"
    return None


def name_problem(request: object) -> str | None:
    """Why a request's names are refused (one longer than ``MAX_NAME``), or None."""
    for field in NAMED_FIELDS:
        value = getattr(request, field, None)
        if isinstance(value, str) and len(value) > MAX_NAME:
            return f"{field} is {len(value)} characters, more than {MAX_NAME}: use a shorter one"
    return None


def size_problem(request: object) -> str | None:
    """Why a request's report is refused (more than ``MAX_TRAINED`` ranges), or None."""
    trained = getattr(request, "trained", None)
    if trained is not None and len(trained) > MAX_TRAINED:
        return (
            f"trained has {len(trained)} ranges, more than {MAX_TRAINED}: merge the ranges "
            "that touch, and report the latest epoch only"
        )
    return None
