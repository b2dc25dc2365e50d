"""Broken reply intake: text that is not Unicode taken in as it came, and calls of one reply
left sharing an id."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any
from unittest import mock

from hermes_ref import reply_intake
from hermes_ref.models import ProviderReply, ToolCall
from sim.sabotage.base import sabotage

# ---- FIN-6: the answer kept as the provider sent it -------------------------------------------


def _as_sent(reply: ProviderReply) -> ProviderReply:
    return reply


@sabotage("surrogates_taken_in", ("FIN-6",),
          "reply intake skips the text rule: a lone surrogate or a split pair reaches the user "
          "and the store as the provider sent it")
def _p_surrogates_taken_in() -> list[AbstractContextManager[Any]]:
    return [mock.patch.object(reply_intake, "clean_reply", _as_sent)]


# ---- TOOL-3: calls that share an id stay that way ---------------------------------------------


def _ids_as_sent(calls: tuple[ToolCall, ...]) -> tuple[ToolCall, ...]:
    return calls


@sabotage("shared_call_ids_kept", ("TOOL-3",),
          "reply intake keeps a repeated call id, so two calls of one reply share one id and "
          "their results")
def _p_shared_call_ids_kept() -> list[AbstractContextManager[Any]]:
    return [mock.patch.object(reply_intake, "unique_call_ids", _ids_as_sent)]
