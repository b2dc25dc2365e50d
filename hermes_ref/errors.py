"""Errors say whose fault they are.

    HermesRefError
    ├── EngineBug                 the engine broke its own rules: crash loudly, never handle
    │   ├── IllegalTransition     a phase change the transition table does not allow
    │   └── InvariantBroken       a cheap in-line invariant assertion failed
    ├── OperatingError            the world misbehaved: the engine handles these
    │   ├── ProviderError         mapped from HTTP/transport failures at the adapter boundary
    │   │   ├── RateLimited       429; carries Retry-After          (transient)
    │   │   ├── ProviderServerError  5xx, connection failures       (transient)
    │   │   │   └── StreamCut     a stream that failed midway; carries its deltas
    │   │   ├── ProviderTimeout   connect/read timeout               (transient)
    │   │   ├── ContextOverflow   400 context_length_exceeded        (back to preflight, compaction)
    │   │   ├── ProviderAuthError 401/403                            (one refresh, then terminal)
    │   │   ├── ProviderRejected  any other 4xx                      (terminal)
    │   │   └── MalformedReply    a 2xx body that is not a usable completion (terminal)
    │   ├── PersistenceError      the durable store refused or failed a write
    │   │   └── LeaseLost         a write carried a fencing token that no longer holds the lease
    │   ├── TurnInterrupted       the turn must stop now (its lease was lost, or the user
    │   │                         stopped it): raised by the driver from the next model
    │   │                         call, tool batch or sleep
    │   ├── LocalProcessingError  the engine cannot process a reply it was given, and would
    │   │                         fail the same way again: the turn stops at once (LOOP-5)
    │   └── Redirected            the user sent a correction while the model call ran: the
    │                             call is cut, the turn goes on with the correction (LOOP-4)
    └── BadInput                  what the project was handed is unusable: a broken scenario
                                  file, a corrupt database, a malformed script; the message
                                  names what and where

Foreign exceptions (httpx, sqlite3, OSError) never travel past an adapter: each adapter
maps them to one of the classes above, keeping the original as ``__cause__``.
"""

from __future__ import annotations

from typing import Any


class HermesRefError(Exception):
    """Root of every error this project raises on purpose."""


class EngineBug(HermesRefError):
    """The engine violated its own contract. Never caught by the engine."""


class IllegalTransition(EngineBug):
    pass


class InvariantBroken(EngineBug):
    pass


class OperatingError(HermesRefError):
    """Something outside the engine failed; the engine decides what to do."""


class ProviderError(OperatingError):
    transient: bool = False

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class RateLimited(ProviderError):
    transient = True

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message, status=429)
        self.retry_after_s = retry_after_s


class ProviderServerError(ProviderError):
    transient = True


class ProviderTimeout(ProviderError):
    transient = True


class StreamCut(ProviderServerError):
    """A stream that failed after delivering some deltas (a cut connection, a bad chunk).

    ``deltas`` are the ones delivered before the failure, in order: the engine retries
    a cut stream, unless the deltas already hold a whole final answer (FIN-2).
    """

    def __init__(self, message: str, *, deltas: tuple[Any, ...] = ()) -> None:
        super().__init__(message, status=None)
        self.deltas = deltas


class ContextOverflow(ProviderError):
    pass


class ProviderAuthError(ProviderError):
    pass


class ProviderRejected(ProviderError):
    pass


class MalformedReply(ProviderError):
    pass


class PersistenceError(OperatingError):
    """A durable write did not happen. ``cause`` is a short machine-readable reason."""

    def __init__(self, message: str, *, cause: str = "unknown") -> None:
        super().__init__(message)
        self.cause = cause


class LeaseLost(PersistenceError):
    def __init__(self, message: str) -> None:
        super().__init__(message, cause="lease_lost")


class TurnInterrupted(OperatingError):
    """A hard interrupt of the running turn; ``reason`` says why (LEASE-4, or the user).

    ``unsent``: the effect it stopped was never begun (the interrupt, or the loss of the
    lease, was known before it), so a model call it stopped never went out (LOOP-2)."""

    def __init__(self, reason: str, *, unsent: bool = False) -> None:
        super().__init__(f"turn interrupted: {reason}")
        self.reason = reason
        self.unsent = unsent


class LocalProcessingError(OperatingError):
    """A deterministic failure of the engine's own processing of a reply (LOOP-5).

    The same reply would fail the same way on every retry (arguments nested past what the
    parser can take, say), so the loop stops at once instead of spending budget on it.
    """


class Redirected(OperatingError):
    """The user's correction cut the model call short (LOOP-4).

    ``partial`` is the raw text the stream had delivered when it was cut, think blocks
    and all; the loop keeps only its visible part.
    """

    def __init__(self, partial: str = "") -> None:
        super().__init__("the model call was cut short by a correction from the user")
        self.partial = partial


class BadInput(HermesRefError):
    """Input the project was handed is unusable; the message names what and where."""
