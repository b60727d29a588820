"""Roles that run concurrently in the interpreter: warp groups on the two sides of an if/else.

A block runs as one thread of control until an ``if`` with an ``else`` splits its threads into two
groups of whole warp groups (warp specialization: consumers and a producer). From there each group
is a role: its own generator over its branch, with its own loop variables and iteration record,
resumed by :func:`drive`. A role yields :data:`SWITCH` after each synchronisation it did (a point
where another role may run next) and a :class:`Blocked` when it waits for something only another
role can bring (an mbarrier phase, a named barrier). When every role that is left is blocked and
none has moved since, the block is deadlocked.

A role may fork (:class:`Fork`): a warpgroup loop splits its threads into one role a warp group, each
with the loop variable at its group's value; the forking role waits until they all end, then goes on
with the registers each computed.

Which role runs next is the schedule: ``eager`` runs the producer (the role that issues TMA loads)
whenever it can, so it gets as far ahead as the barriers allow; ``lazy`` runs it only when nothing
else can move; ``random`` picks among the roles that can move with a seeded generator.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

import numpy as np

from .protocol import ProtocolError

SCHEDULES = ("eager", "lazy", "random")


class Blocked:
    """Yielded by a role that cannot go on; ``error`` says why, should nothing ever unblock it."""

    __slots__ = ("error",)

    def __init__(self, error: ProtocolError):
        self.error = error


SWITCH = object()  # yielded after a synchronisation: another role may run now


class Fork:
    """Yielded by a role that splits into ``children`` (new :class:`Role` objects, not yet started);
    it resumes once they all end."""

    __slots__ = ("children",)

    def __init__(self, children: list):
        self.children = children


class UnknownSchedule(ValueError):
    """A schedule name that is not one of :data:`SCHEDULES`."""


def check_schedule(name: str) -> str:
    if name not in SCHEDULES:
        raise UnknownSchedule(f"unknown schedule {name!r}; use one of {', '.join(SCHEDULES)}")
    return name


@dataclass
class Role:
    """One thread of control: the threads in ``mask`` running ``gen`` with their own state."""

    name: str
    gen: Iterator[Any]
    mask: np.ndarray
    producer: bool
    env: dict
    iters: list
    step: Any
    blocked_at: Optional[int] = None  # progress count when it last blocked
    error: Optional[ProtocolError] = None
    done: bool = False
    moves: int = field(default=0)
    parent: Optional["Role"] = None  # the role that forked it
    children: list = field(default_factory=list)  # the roles it waits for (a Fork), while any runs


def drive(runner, roles: list[Role], schedule: str, rng: random.Random) -> None:
    """Run ``roles`` to their ends, interleaved by ``schedule``. ``runner`` is the block runner
    whose ``env``, ``iters`` and ``step`` are swapped to each role's while it runs."""
    try:
        _drive(runner, roles, schedule, rng)
    finally:  # a role left behind (deadlock, error) unwinds its loops now, in its own state
        for r in roles:
            if not r.done:
                runner.env, runner.iters, runner.step = r.env, r.iters, r.step
                r.gen.close()


def _drive(runner, roles: list[Role], schedule: str, rng: random.Random) -> None:
    progress = 0
    while True:
        alive = [r for r in roles if not r.done]
        if not alive:
            return
        running = [r for r in alive if not r.children]  # a forked role waits for its children
        ready = [r for r in running if r.blocked_at is None or r.blocked_at < progress]
        if not ready:
            raise _deadlock(running)
        role = _pick(ready, schedule, rng)
        runner.env, runner.iters, runner.step = role.env, role.iters, role.step
        try:
            out = next(role.gen)
        except StopIteration:
            role.done = True
            progress += 1
            out = None
        role.env, role.iters, role.step = runner.env, runner.iters, runner.step
        if role.done and role.parent is not None:
            _joined(runner, role.parent)
        if isinstance(out, Fork):
            role.children = out.children
            for c in out.children:
                c.parent = role
            roles.extend(out.children)
            progress += 1
        elif isinstance(out, Blocked):
            role.blocked_at, role.error = progress, out.error
        elif not role.done:
            role.blocked_at = None
            progress += 1


def _joined(runner, parent: Role) -> None:
    """Once every child of ``parent`` ended, it goes on with the registers each child's threads computed."""
    if not all(c.done for c in parent.children):
        return
    for c in parent.children:
        for reg in runner.p.reg_dtypes:
            parent.env[reg] = np.where(c.mask, c.env[reg], parent.env[reg])
    parent.children = []


def _pick(ready: list[Role], schedule: str, rng: random.Random) -> Role:
    if schedule == "random":
        return ready[rng.randrange(len(ready))]
    want_producer = schedule == "eager"
    preferred = [r for r in ready if r.producer == want_producer]
    return (preferred or ready)[0]


def _deadlock(blocked: list[Role]) -> ProtocolError:
    """The first blocked role's error, noting what the others wait for."""
    first = blocked[0].error
    others = "; ".join(f"the {r.name} role at {r.error.site.what}: {r.error.detail} [{r.error.site}]"
                       for r in blocked[1:] if r.error is not None)
    if others:
        first.args = (f"{first.args[0]} (every role is blocked; {others})",)
    return first
