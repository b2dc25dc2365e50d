"""The per-session turn lease: who may run a turn, for how long, and what losing it means.

Theory of operation
-------------------
A turn runs only while it holds its session's lease (LEASE-1). The store grants it for
``lease_ttl_s`` and numbers every grant with a fencing token that only grows; every write
carries the token, and the store refuses a write whose grant is no longer current *or
has expired* (LEASE-4). So a holder that lost its lease writes nothing, whatever it
believes.

The holder names its process and its turn: ``pid=<n>:pidns=<ns>:turn=<id>:platform=<p>``
(LEASE-2). A lease whose holder process is dead may be reclaimed before it expires
(LEASE-3); the store asks the driver's liveness probe. A turn that waits for a busy lease
joins the session's queue of waiters, and a free lease goes to the live waiter that asked
first (``first_in_line``); a waiter that stops asking drops out after two poll intervals.

While the turn runs, ``keep_lease`` runs beside it (the driver starts it: an asyncio task
in production, an actor of the same process in the simulator). Every ``lease_refresh_s``
it extends the grant to ``now + lease_ttl_s``. A refresh that fails means the lease is
gone (expired, or taken by another holder after expiry): the refresher hard-interrupts the
turn and ends. The driver delivers the interrupt as ``TurnInterrupted`` from the turn's
next model call, tool batch or sleep, or at once if the turn is waiting in one, so the
turn stops calling out; the loop ends it with the ``interrupted`` exit.

The finalizer's order is the contract of LEASE-6: stop the refresher and join it (no
refresh in flight or to come), clear the interrupt this lease raised, then release. The
release is holder-qualified, so releasing a lease that was lost changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from hermes_ref.effects import InterruptTurn, Now, RefreshLease, Sleep
from hermes_ref.errors import PersistenceError
from hermes_ref.models import Lease

LOST_REASON = "session turn lease lost"


def holder_identity(process: str, turn_id: str, platform: str) -> str:
    """LEASE-2: the holder string of one turn of one process (``process`` is ``pid=..``)."""
    return f"{process}:turn={turn_id}:platform={platform or 'unknown'}"


def holder_fields(holder: str) -> dict[str, str]:
    """The ``key=value`` parts of a holder string (``pid``, ``pidns``, ``turn``, ``platform``)."""
    fields: dict[str, str] = {}
    for part in holder.split(":"):
        key, sep, value = part.partition("=")
        if sep:
            fields[key] = value
    return fields


def reclaimable(expires_at: float, now: float, holder_dead: Callable[[], bool]) -> bool:
    """LEASE-3: may a held lease be taken from its holder at ``now``?

    Only when it has expired, or when its holder's process is dead. The liveness probe is
    asked only for an unexpired lease (it costs a system call in production).
    """
    return expires_at <= now or holder_dead()


def fence_holds(token: int, current_token: int | None, held: bool, expires_at: float | None,
                now: float | None) -> bool:
    """LEASE-4: may a write carrying ``token`` commit? Only under the session's current,
    held, unexpired grant (``now`` None: the store keeps no clock and checks no expiry)."""
    expired = now is not None and expires_at is not None and expires_at <= now
    return held and token == current_token and not expired


def first_in_line(mine: int | None, others: Iterable[int]) -> bool:
    """Waiters are served in the order they asked (LEASE-1, fairness).

    ``mine`` is the asker's place in the session's queue (None: it never waited), ``others``
    the places of the other live waiters. A free lease goes to the asker only if nobody
    still waiting asked before it; a first-time asker comes after every waiter. Without
    this, a process that just released a session re-takes it for its next turn while the
    waiters of other processes are between two polls.
    """
    earliest = min(others, default=None)
    return earliest is None or (mine is not None and mine < earliest)


def first_refresh_in(lease: Lease, now: float, interval_s: float, ttl_s: float) -> float:
    """LEASE-2: how long a refresher started at ``now`` on ``lease`` waits for its first
    refresh, so that the lease keeps its cadence: one interval after its last grant or
    refresh (its expiry less the TTL), or at once when that moment has passed.

    A lease just granted waits a whole interval. A refresher started again on a lease it
    did not grant (a rotation stops it while the lease moves) must not count the interval
    from its own start: the stopped one may have refreshed the lease up to an interval ago.
    """
    return max(0.0, lease.expires_at - ttl_s + interval_s - now)


async def keep_lease(lease: Lease, interval_s: float, ttl_s: float,
                     first_s: float | None = None) -> None:
    """Refresh ``lease`` every ``interval_s`` until stopped; on a failed refresh, interrupt.

    The first refresh comes after ``first_s`` (None: a whole interval, for a lease just
    granted; see ``first_refresh_in``). Runs until the driver stops it (the turn's finalizer
    does, first thing) or until a refresh fails. A failed refresh is a loss whatever its
    cause: the store no longer vouches for this holder, so the turn must not go on calling
    out in its name.
    """
    wait = interval_s if first_s is None else first_s
    while True:
        await Sleep(wait)
        wait = interval_s
        now = await Now()
        try:
            lease = await RefreshLease(lease, now, ttl_s)
        except PersistenceError as error:
            lost = f"{LOST_REASON} ({error.cause})"
            break
    await InterruptTurn(lease.holder, lost)
