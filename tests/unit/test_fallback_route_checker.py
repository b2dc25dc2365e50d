"""LOOP-6's reading of a spent route: which failures used up a request's retries."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

from hermes_ref.limits import Limits, ProviderRoute
from hermes_ref.models import Message, ProviderReply, Role
from hermes_ref.wire import ProviderRequest
from sim.checkers.base import Observation, TurnView, route_chain
from sim.checkers.loop_fire import _spent_without_switch
from sim.world import CallRecord

LIMITS = Limits(fallback_providers=(ProviderRoute(model="fallback-small", context_window_tokens=120),))
OBS = cast(Observation, SimpleNamespace(limits=LIMITS))


def _request(model: str) -> ProviderRequest:
    return ProviderRequest(model=model, messages=(Message(role=Role.USER, content="hi"),),
                           tools=(), prompt_tokens=1)


def _call(seq: int, request: ProviderRequest, error: str | None) -> CallRecord:
    reply = None if error is not None else ProviderReply(content="done")
    return CallRecord(seq, "s-1", "turn-1", request, reply, error, 0, 0.0, None, request.wire_body())


def _spent(*calls: tuple[ProviderRequest, str | None]) -> list[str]:
    view = TurnView("s-1", "turn-1", None,
                    calls=[_call(n, r, e) for n, (r, e) in enumerate(calls, 1)], exits=[])
    return _spent_without_switch(OBS, view, route_chain(LIMITS))


def test_an_auth_error_before_the_outage_spends_no_retry() -> None:
    """Seeds 2052, 4542, 4850: a 401, a credential renewal, then four 503s on one request
    (the first try after the renewal and its three retries), then the fallback. The checker
    counted the 401 as a retry and wanted the switch after the third 503 (LOOP-5: auth is
    answered by one refresh, transient errors by bounded retries)."""
    primary = _request(LIMITS.model)
    fallback = _request("fallback-small")
    outage = [(primary, "ProviderServerError")] * 4
    assert _spent((primary, "ProviderAuthError"), *outage, (fallback, None)) == []


def test_a_fifth_try_on_the_spent_primary_is_still_caught() -> None:
    """Four transient failures of one request spend its retries: a fifth call on the same
    route is no switch."""
    primary = _request(LIMITS.model)
    outage = [(primary, "ProviderServerError")] * 4
    assert _spent((primary, "ProviderAuthError"), *outage, (primary, None)) != []
    assert _spent(*outage, (primary, None)) != []
