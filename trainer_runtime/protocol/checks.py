"""What every server of the runtime checks of a call before its handler runs: the job token,
compared in constant time, and the length of the names a caller gives.

Why: a token compared with ``!=`` tells, by how long the refusal takes, how much of a guess
was right; and a worker id of megabytes is kept in the state every save writes (past what a
ConfigMap snapshot can hold). Both checks are shared by the coordinator and the parameter
servers so they cannot drift apart.

What must stay true: a call whose token is not the job's, or that names a worker, node or
address longer than ``MAX_NAME``, reaches no handler.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable

from trainer_runtime.protocol import TOKEN_HEADER

#: The longest worker id, node name or address a call may give: a Kubernetes object name
#: (253) and a port.
MAX_NAME = 261
#: The request fields that name something kept in the state.
NAMED_FIELDS = ("worker_id", "node", "store_address", "address")


def token_matches(metadata: Iterable[tuple[str, str | bytes]], token: str) -> bool:
    """Whether the call's metadata carries the job's token (compared in constant time)."""
    given = dict(metadata).get(TOKEN_HEADER)
    if given is None:
        return False
    raw = given.encode() if isinstance(given, str) else given
    return hmac.compare_digest(raw, token.encode())


def name_problem(request: object) -> str | None:
    """Why a request's names are refused (one longer than ``MAX_NAME``), or None."""
    for field in NAMED_FIELDS:
        value = getattr(request, field, None)
        if isinstance(value, str) and len(value) > MAX_NAME:
            return f"{field} is {len(value)} characters, more than {MAX_NAME}: use a shorter one"
    return None
