"""The user's hand on a running turn: interrupts and corrections, on the virtual clock.

Theory of operation
-------------------
A story schedules an intervention ``after_s`` seconds from now (``Story.interrupt``,
``Story.redirect``); the scheduler fires it when the clock gets there, which is while the
turn waits in something that takes time (a slow model reply: ``Story.delay_reply``, a
tool batch, a backoff sleep). Both are written to the world's ``interventions`` log, the
world's own account that the checkers read.

* An **interrupt** marks the session's running turn interrupted with the reason
  ``interrupted_by_user``, exactly as a lost lease does (``sim.lease_actor``): the wait it
  is in ends at once with ``TurnInterrupted``, and so would its next model call, tool
  batch or sleep.
* A **correction** is queued for the session's running turn (``World.redirects``, by turn:
  it lives in that turn's process), where the turn's next ``DrainRedirects`` finds it; a
  turn that ends without taking it in takes it along, and with no turn running nothing
  is queued. If the turn is waiting for a model reply, the reply's
  stream is cut: the turn gets ``Redirected`` carrying the raw text streamed so far (the
  scripted reply stands for a stream that delivered its reasoning, as a think block, and
  its text, then stalled), and the world's call record is marked cut.

``script_for`` gives a model of its own a scripted fake (``World.providers``): a fallback
route (LOOP-6) answers from its own script while the primary fails from the story's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from hermes_ref import effects as fx
from hermes_ref.errors import Redirected, TurnInterrupted
from hermes_ref.models import ProviderReply
from sim.provider import ScriptedProvider
from sim.scheduler import Actor
from sim.world import Intervention, World

if TYPE_CHECKING:
    from sim.harness import Story

USER_INTERRUPT = "interrupted_by_user"
_CUTTABLE: frozenset[type[Any]] = frozenset({fx.CallProvider, fx.ExecuteTools, fx.Sleep})


def running_turn(world: World, session: str) -> Actor | None:
    """The live turn actor working on ``session`` (a root actor, not a refresher)."""
    turns = [a for a in world.scheduler.live() if a.parent is None and a.turn_id is not None]
    for actor in turns:
        pending = actor.pending
        if getattr(pending, "session_id", None) == session:
            return actor
    for actor in turns:  # waiting in something that names no session (a backoff sleep)
        if any(c.turn_id == actor.turn_id and c.session_id == session for c in world.calls):
            return actor
    return None


def raw_partial(reply: ProviderReply | None) -> str:
    """What a cut stream had delivered: its reasoning as a think block, then its text."""
    if reply is None:
        return ""
    thought = f"<think>{reply.reasoning}</think>" if reply.reasoning else ""
    return thought + (reply.streamed_text or reply.content or "")


def _note(world: World, what: str, session: str, actor: Actor | None, text: str) -> None:
    world.interventions.append(Intervention(what, session, actor.turn_id if actor else None,
                                            text, world.clock.now(), world.effects_performed))


def interrupt(story: Story, after_s: float, session: str) -> None:
    world = story.world

    def fire() -> None:
        actor = running_turn(world, session)
        _note(world, "interrupt", session, actor, USER_INTERRUPT)
        world.timeline.add("INTERRUPT", f"the user stops {actor.turn_id if actor else 'nothing'}")
        if actor is None or actor.done:
            return
        actor.interrupt = USER_INTERRUPT
        if actor.wait is not None and type(actor.pending) in _CUTTABLE:
            _cut(world, actor, TurnInterrupted(USER_INTERRUPT))
    world.scheduler.at(world.clock.now() + after_s, fire)


def redirect(story: Story, text: str, after_s: float, session: str,
             arrives: Callable[[], bool] | None = None) -> None:
    """``after_s`` from now, queue ``text`` for the session and cut the model call its turn
    waits on; ``arrives``, when given, is asked at that instant whether it is delivered."""
    world = story.world

    def fire() -> None:
        if arrives is not None and not arrives():
            return
        actor = running_turn(world, session)
        _note(world, "redirect", session, actor, text)
        world.timeline.add("redirect", f"the user says {text!r}")
        if actor is None or actor.turn_id is None:
            return  # no turn runs: a correction of nothing (a new message is the user's way)
        world.redirects.setdefault(actor.turn_id, []).append((session, text))
        if actor.wait is None or not isinstance(actor.pending, fx.CallProvider):
            return
        reply = world.streaming.pop(actor.seq, None)
        for index in range(len(world.calls) - 1, -1, -1):  # the call it waits on was the last
            if world.calls[index].turn_id == actor.turn_id:
                world.calls[index] = replace(world.calls[index], cut="redirect")
                break
        _cut(world, actor, Redirected(raw_partial(reply)))
    world.scheduler.at(world.clock.now() + after_s, fire)


def _cut(world: World, actor: Actor, error: BaseException) -> None:
    pending = actor.pending
    world.scheduler.unpark(actor)
    actor.driver._complete(actor, pending, None, error)


def script_for(story: Story, model: str, steps: tuple[Any, ...]) -> ScriptedProvider:
    provider = ScriptedProvider(list(steps))
    story.world.providers[model] = provider
    return provider
