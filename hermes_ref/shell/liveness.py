"""Is the process that holds a lease still alive? (LEASE-3, production side.)

A holder string starts with ``pid=<n>`` (and may name ``pidns=<inode>``, the pid
namespace, after it). A holder is dead when it names this machine's pid namespace and
no process with that pid exists. A holder from another namespace, or one that cannot be
parsed, is presumed alive: reclaiming a live lease would be worse than waiting for its
expiry.
"""

from __future__ import annotations

import os
import re

_PID = re.compile(r"(?:^|:)pid=(\d+)(?::|$)")
_PIDNS = re.compile(r"(?:^|:)pidns=(\d+)(?::|$)")


def own_pid_namespace() -> str | None:
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return None


def holder_identity() -> str:
    """This process's holder prefix: ``pid=<pid>[:pidns=<inode>]``."""
    ns = own_pid_namespace()
    return f"pid={os.getpid()}" + (f":pidns={ns}" if ns else "")


def holder_alive(holder: str) -> bool:
    pid_match = _PID.search(holder)
    if pid_match is None:
        return True
    ns_match = _PIDNS.search(holder)
    if ns_match is not None and ns_match.group(1) != own_pid_namespace():
        return True
    try:
        os.kill(int(pid_match.group(1)), 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists but not ours (EPERM), or unknown: presume alive
    return True
