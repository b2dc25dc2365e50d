"""The multi-process world: seeded interleaving, deadlines, stalls and kills replay exactly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import scenarios
from hermes_ref.effects import Now, Sleep
from sim.driver import SimDriver
from sim.harness import Story, run_scenario
from sim.provider import ScriptedProvider, text
from sim.store import MemoryStore
from sim.tools import SimTools
from sim.world import World


def _world(seed: int) -> World:
    return World(store=MemoryStore(), provider=ScriptedProvider([]), tools=SimTools({}),
                 seed=seed, trace=False)


async def _steps(log: list[tuple[str, int]], name: str, count: int) -> None:
    for index in range(count):
        await Now()  # an instant effect: the scheduler may switch actors after it
        log.append((name, index))


def _interleaving(seed: int) -> list[tuple[str, int]]:
    world = _world(seed)
    log: list[tuple[str, int]] = []
    drivers = [SimDriver(world, world.processes[1]), SimDriver(world, world.start_process())]
    actors = [d.spawn(_steps(log, f"p{i}", 6)) for i, d in enumerate(drivers)]
    world.scheduler.run_until(lambda: all(a.done for a in actors))
    return log


def test_one_seed_gives_one_interleaving() -> None:
    """Two processes whose steps are all ready at once interleave the same way for one seed."""
    assert _interleaving(7) == _interleaving(7)


def test_the_seed_decides_the_interleaving() -> None:
    """Different seeds give different orders of the same steps (and every step happens)."""
    orders = {tuple(_interleaving(seed)) for seed in range(8)}
    assert len(orders) > 1
    assert all(sorted(order) == sorted(_interleaving(0)) for order in orders)


async def _sleeper(log: list[tuple[str, float]], name: str, world: World, seconds: float) -> None:
    await Sleep(seconds)
    log.append((name, world.clock.now() - world.timeline.start_s))


def test_the_clock_jumps_to_the_earliest_deadline() -> None:
    """When every actor waits, time moves to the next deadline, in deadline order."""
    world = _world(0)
    log: list[tuple[str, float]] = []
    driver = SimDriver(world)
    actors = [driver.spawn(_sleeper(log, name, world, s))
              for name, s in (("late", 30.0), ("early", 5.0), ("middle", 12.0))]
    world.scheduler.run_until(lambda: all(a.done for a in actors))
    assert log == [("early", 5.0), ("middle", 12.0), ("late", 30.0)]


def test_a_stalled_process_wakes_when_the_stall_ends() -> None:
    """An actor of a stalled process runs at the end of the stall, not at its own deadline."""
    world = _world(0)
    log: list[tuple[str, float]] = []
    stalled = SimDriver(world, world.processes[1])
    free = SimDriver(world, world.start_process())
    actors = [stalled.spawn(_sleeper(log, "stalled", world, 5.0)),
              free.spawn(_sleeper(log, "free", world, 20.0))]
    world.scheduler.run_until(lambda: all(a.wait is not None for a in actors))  # both asleep
    world.scheduler.freeze(1, world.clock.now() + 50.0)
    world.scheduler.run_until(lambda: all(a.done for a in actors))
    assert log == [("free", 20.0), ("stalled", 50.0)]


def test_a_killed_process_stops_and_the_others_run_on() -> None:
    """A kill closes every actor of one process where it waits; the other process finishes."""
    world = _world(0)
    log: list[tuple[str, float]] = []
    doomed = SimDriver(world, world.processes[1])
    other = SimDriver(world, world.start_process())
    victim = doomed.spawn(_sleeper(log, "doomed", world, 10.0))
    survivor = other.spawn(_sleeper(log, "survivor", world, 20.0))
    world.scheduler.at(world.clock.now() + 5.0, lambda: doomed.crash_process("SIGKILL"))
    world.scheduler.run_until(lambda: victim.done and survivor.done)
    assert victim.crashed == "SIGKILL" and log == [("survivor", 20.0)]
    assert not world.processes[1].alive and world.processes[2].alive


def test_a_multi_process_story_replays_its_timeline(tmp_path: Path) -> None:
    """The stalled-holder story, run twice on one seed, narrates the same timeline."""
    spec = scenarios.load_all()["stalled_holder_is_fenced_off"]
    first = run_scenario(spec, "memory", workdir=tmp_path / "a")
    second = run_scenario(spec, "memory", workdir=tmp_path / "b")
    assert first.passed and first.timeline == second.timeline


def test_concurrent_turns_of_one_story_each_record_their_run(tmp_path: Path) -> None:
    """Turns handed to two processes are each recorded with the turn id their actor minted."""
    s = Story(store_kind="memory", workdir=tmp_path)
    s.script(text("One."), text("Two."))
    other = s.process()
    a = s.start_turn("first", session="s-1")
    b = s.start_turn("second", session="s-2", process=other)
    s.run_all()
    runs: list[Any] = s.world.runs
    assert {r.turn_id for r in runs} == {a.actor.turn_id, b.actor.turn_id}
    assert s.violations == []


def test_a_turn_handed_to_a_dead_process_never_runs(tmp_path: Path) -> None:
    """A process that died before it was handed a turn starts nothing: no call, no row, no
    run, and the timeline says so; the live process's turn runs as usual."""
    s = Story(store_kind="memory", workdir=tmp_path)
    s.script(text("Alive."), text("Zombie."))
    doomed = s.process()
    doomed.driver.crash_process("SIGKILL")
    dead = s.start_turn("never", session="s-2", process=doomed, after_s=5.0)
    live = s.start_turn("first", session="s-1")
    s.run_all()
    assert dead.done and dead.result is None and dead.actor.turn_id is None
    assert [r.turn_id for r in s.world.runs] == [live.actor.turn_id]
    assert [c.session_id for c in s.world.calls] == ["s-1"]
    assert s.world.store.snapshot().transcript("s-2") == []
    assert f"pid={doomed.pid} is dead: nothing handed to it" in s.world.timeline.render()
    assert s.violations == []


def test_a_timer_fires_on_time_while_a_process_is_stalled() -> None:
    """A kill due during a stall happens at its time; the stalled actor never wakes."""
    world = _world(0)
    log: list[tuple[str, float]] = []
    stalled = SimDriver(world, world.processes[1])
    victim = stalled.spawn(_sleeper(log, "stalled", world, 30.0))
    world.scheduler.run_until(lambda: victim.wait is not None)
    world.scheduler.freeze(1, world.clock.now() + 400.0)
    world.scheduler.at(world.clock.now() + 100.0, lambda: stalled.crash_process("SIGKILL"))
    world.scheduler.run_until(lambda: victim.done)
    assert victim.crashed == "SIGKILL" and log == []
    assert world.processes[1].died_at == world.timeline.start_s + 100.0
