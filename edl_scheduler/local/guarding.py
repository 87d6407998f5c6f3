"""What keeps the other users of a machine out of the local service.

The service runs commands (every job's workers) as the user who started it, and its home
holds the jobs' secrets (``state.db``, whence their signing keys) and every job's logs. So:

- the home is this user's own: refused when another user owns it or others may write it
  (they could swap the socket or the database under us), and narrowed to ``0700``; what an
  earlier version left readable in it is narrowed too (``prepare_home``);
- every file the service writes is created under the umask ``077``, so readable and
  writable by its owner only (``LocalService`` sets it before it creates anything);
- the control socket is bound here, ``0600``, and handed to uvicorn already bound (asked to
  bind a path itself, uvicorn makes it ``0666``);
- and, should its mode ever be opened up, every connection's peer is checked with
  ``SO_PEERCRED``: a process of another uid gets ``403`` and the connection is closed,
  before any request is read (``owner_only``).

What must stay true: nothing reaches a route but a process of the service's own uid.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import stat
import struct
from pathlib import Path
from typing import Any

LOG = logging.getLogger("edl.local")
#: The mode bits no file or folder of the home may give to others.
_OTHERS = 0o077
#: ``struct ucred``: pid (signed), uid and gid (unsigned).
_UCRED = struct.Struct("iII")


class HomeError(ValueError):
    """The home is not safe to run the service on; the message says why and the fix."""


def prepare_home(home: Path) -> None:
    """Create ``home`` (``0700``) or check it is this user's own and closed to others'
    writes; then narrow it and what the service keeps in it to its owner."""
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = home.lstat()
    if not stat.S_ISDIR(info.st_mode):
        raise HomeError(f"--home {home} is not a folder: give a folder (or a new path)")
    if info.st_uid != os.geteuid():
        raise HomeError(
            f"--home {home} belongs to uid {info.st_uid}, not to you (uid {os.geteuid()}): "
            "the service keeps the jobs' secrets there; give a folder of your own"
        )
    if info.st_mode & 0o022:
        raise HomeError(
            f"--home {home} is writable by others (mode {stat.S_IMODE(info.st_mode):o}): "
            f"they could replace the service's socket or database; `chmod 700 {home}`, "
            "or give a folder of your own"
        )
    _narrow(home)
    for entry in home.iterdir():
        _narrow(entry)
        if entry.name in ("logs", "coordinators") and entry.is_dir() and not entry.is_symlink():
            for inner in entry.iterdir():
                _narrow(inner)


def _narrow(path: Path) -> None:
    """Take every permission bit of others off ``path`` where this user owns it (never
    through a symbolic link)."""
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode) or info.st_uid != os.geteuid():
        return
    if info.st_mode & _OTHERS:
        os.chmod(path, stat.S_IMODE(info.st_mode) & ~_OTHERS)


def bind_socket(path: Path) -> socket.socket:
    """A listening unix socket at ``path``, ``0600``, replacing a stale one."""
    path.unlink(missing_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        old = os.umask(0o177)
        try:
            sock.bind(str(path))
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    return sock


def peer_uid(transport: asyncio.BaseTransport) -> int | None:
    """The uid of the process at the other end of a unix-socket connection (None: not a
    unix socket, or the kernel did not say)."""
    try:
        sock: Any = transport.get_extra_info("socket")
        if sock is None or sock.family != socket.AF_UNIX:
            return None
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
        _, uid, _ = _UCRED.unpack(raw)
    except Exception:  # no SO_PEERCRED here (not Linux), or no answer: nobody is trusted
        return None
    return int(uid)


#: How long a refused peer may go on sending before its connection is closed.
REFUSED_LINGER_S = 5.0


def refusal(owner: int, uid: int | None) -> bytes:
    """The whole answer to a peer that is not the owner: 403, the reason, and the end."""
    who = "an unknown user" if uid is None else f"uid {uid}"
    body = json.dumps(
        {
            "detail": f"this EDL local service answers only its owner (uid {owner}), not "
            f"{who}: start a service of your own with `edlctl local start`"
        }
    ).encode()
    head = (
        "HTTP/1.1 403 Forbidden\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


def owner_only(base: type[asyncio.Protocol], owner: int) -> type[asyncio.Protocol]:
    """``base`` (uvicorn's HTTP protocol) for connections from ``owner`` only: any other
    peer gets ``refusal`` and nothing of its request is read."""

    class OwnerOnly(base):  # type: ignore[valid-type, misc]
        _refused = False

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            uid = peer_uid(transport)
            if uid == owner:
                super().connection_made(transport)
                return
            self._refused = True
            LOG.warning("refused a connection from %s: not the service's owner", uid)
            assert isinstance(transport, asyncio.WriteTransport)
            transport.write(refusal(owner, uid))
            # Closed at once, the socket made a peer still sending its request fail with a
            # broken pipe before it read the answer. So the answer ends (half-close), what
            # the peer sends is dropped unread, and the connection closes when the peer
            # does, or after ``REFUSED_LINGER_S``.
            if transport.can_write_eof():
                transport.write_eof()
                asyncio.get_running_loop().call_later(REFUSED_LINGER_S, transport.close)
            else:
                transport.close()

        def data_received(self, data: bytes) -> None:
            if not self._refused:
                super().data_received(data)

        def eof_received(self) -> bool | None:
            if self._refused:
                return None
            result: bool | None = super().eof_received()
            return result

        def connection_lost(self, exc: Exception | None) -> None:
            if not self._refused:
                super().connection_lost(exc)

    OwnerOnly.__name__ = OwnerOnly.__qualname__ = f"OwnerOnly{base.__name__}"
    return OwnerOnly
