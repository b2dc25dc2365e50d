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
* A correction may also be held for a **moment** of a turn rather than sent at a time
  (``correct_at_a_moment``, ``Moment``, ``World.moments``): the driver asks at each tool
  round and model call whether it is the moment, so the correction arrives during a tool
  round, during the grace call, during a call that prepares a tool call, or during the
  call that asks the model to check its work, which a timer would rarely hit.

``script_for`` gives a model of its own a scripted fake (``World.providers``): a fallback
route (LOOP-6) answers from its own script while the primary fails from the story's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hermes_ref import effects as fx
from hermes_ref.errors import Redirected, TurnInterrupted
from hermes_ref.models import ProviderReply, ScaffoldFlag
from hermes_ref.wire import ProviderRequest
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
            if isinstance(actor.pending, fx.CallProvider):
                world.mark_pending_call(actor.turn_id, stopped="interrupt")
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
        _deliver(world, actor, session, text)
    world.scheduler.at(world.clock.now() + after_s, fire)


def _deliver(world: World, actor: Actor, session: str, text: str) -> None:
    """Queue ``text`` for the turn ``actor`` runs and cut the model call it waits on, if any."""
    assert actor.turn_id is not None
    world.redirects.setdefault(actor.turn_id, []).append((session, text))
    if actor.wait is None or not isinstance(actor.pending, fx.CallProvider):
        return
    reply = world.streaming.pop(actor.seq, None)
    world.mark_pending_call(actor.turn_id, cut="redirect")
    _cut(world, actor, Redirected(raw_partial(reply)))


MOMENTS = ("tools", "grace", "call", "check")


@dataclass
class Moment:
    """A correction the user sends at a moment of a turn of ``session`` rather than at a
    time: the first such moment after the user began to watch (``correct_at_a_moment``).

    * ``tools``: the turn begins a tool round after its ``calls``-th model call (any
      round, with 0); the correction waits in the turn's queue while the tools run
      (nothing is cut), as a correction typed during a long read;
    * ``grace``: the turn sends its grace call, whose reply streams for ``slow_s``; the
      user corrects the turn halfway, which cuts the grace call;
    * ``call``: the turn sends a model call whose reply is a tool call with no text; it
      streams for ``slow_s`` and the user cuts it halfway, before it showed anything (the
      cut reply is stored hidden, LOOP-4);
    * ``check``: the turn sends the model call that asks the model to verify its work
      after the gate held an answer back (FIN-1); it streams for ``slow_s`` and the user
      cuts it halfway, so the correction comes while the answer is held.
    """

    session: str
    during: str
    text: str
    slow_s: float = 0.0
    from_s: float = 0.0  # the virtual time the user begins to watch
    calls: int = 0  # tools: the model calls the turn has made before the round (requests)

    def reached(self, world: World, actor: Actor | None, effect: Any,
                reply: ProviderReply | None) -> float | None:
        """The reply's delay if ``effect`` of ``actor`` is this moment, else None."""
        if actor is None or actor.parent is not None or actor.turn_id is None \
                or getattr(effect, "session_id", None) != self.session \
                or world.clock.now() < self.from_s:
            return None
        if self.during == "tools":
            if not isinstance(effect, fx.ExecuteTools) or self._calls_made(world, actor) < self.calls:
                return None
            _note(world, "redirect", self.session, actor, self.text)
            world.timeline.add("redirect", f"the user says {self.text!r} during the tool round")
            _deliver(world, actor, self.session, self.text)
            return 0.0
        if not isinstance(effect, fx.CallProvider) or reply is None:
            return None
        purpose = effect.request.purpose
        if self.during == "grace" and purpose != "grace":
            return None
        if self.during == "call" and (purpose != "turn" or not reply.tool_calls
                                      or (reply.content or "").strip()):
            return None
        if self.during == "check" and not asks_for_the_check(effect.request):
            return None
        world.scheduler.at(world.clock.now() + self.slow_s / 2, lambda: self._cut(world, actor, effect))
        return self.slow_s

    def _calls_made(self, world: World, actor: Actor) -> int:
        """The turn's model calls so far, a request sent again after a failure counted once."""
        if not self.calls:
            return 0  # any round will do: nothing to count
        return len({id(c.request) for c in world.calls
                    if c.turn_id == actor.turn_id and c.request.purpose == "turn"})

    def _cut(self, world: World, actor: Actor, effect: Any) -> None:
        if actor.done or actor.wait is None or actor.pending is not effect:
            world.timeline.add("redirect", f"nothing sent: the model call of {self.session} "
                               "ended first")
            return
        _note(world, "redirect", self.session, actor, self.text)
        world.timeline.add("redirect", f"the user says {self.text!r} during the {self.during} call"
                           if self.during in ("grace", "check") else f"the user says {self.text!r}")
        _deliver(world, actor, self.session, self.text)


def asks_for_the_check(request: ProviderRequest) -> bool:
    """The request ends on the nudge FIN-1's gate adds after the answer it holds back."""
    last = request.messages[-1] if request.messages else None
    return last is not None and last.scaffold is ScaffoldFlag.PRE_VERIFY


def correct_at_a_moment(story: Story, text: str, *, after_s: float, session: str,
                        during: str, slow_s: float = 0.0, calls: int = 0) -> None:
    """``after_s`` from now the user watches ``session`` and corrects its turn at the next
    moment ``during`` names (``Moment``); a moment the faulty phase does not reach is
    disarmed with the other faults (``World.moments``)."""
    if during not in MOMENTS:
        raise ValueError(f"unknown moment {during!r} (known: {', '.join(MOMENTS)})")
    world = story.world
    world.moments.append(Moment(session, during, text, slow_s, world.clock.now() + after_s,
                                calls))


def _cut(world: World, actor: Actor, error: BaseException) -> None:
    pending = actor.pending
    world.scheduler.unpark(actor)
    actor.driver._complete(actor, pending, None, error)


def script_for(story: Story, model: str, steps: tuple[Any, ...]) -> ScriptedProvider:
    provider = ScriptedProvider(list(steps))
    story.world.providers[model] = provider
    return provider
