"""The values builder calls take and hand back: tensor and buffer handles, circular-buffer options, and
the checks every call applies to its arguments (ints, terms, choices), each error naming the author's
call site. Shared by :mod:`cbrules.ir.builder` and the fragment model (:mod:`.builder_mma`), which is
why it imports neither."""
from __future__ import annotations

import operator
import sys
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Union

from ..errors import CbrulesError
from ..shipped import shown
from . import option_schema
from .limits import MAX_BLOCK_THREADS
from .ops import DTYPE_BYTES
from .terms import BUILT_TERM_DEPTH, BUILT_TERM_PARTS, Term, TermLike, as_term, call, extent, fits, name

threadIdx = type("threadIdx", (), {a: name(f"threadIdx.{a}") for a in "xyz"})
blockIdx = type("blockIdx", (), {a: name(f"blockIdx.{a}") for a in "xyz"})
blockDim = type("blockDim", (), {a: name(f"blockDim.{a}") for a in "xyz"})
gridDim = type("gridDim", (), {a: name(f"gridDim.{a}") for a in "xyz"})


def ceil_div(a: TermLike, b: TermLike) -> Term:
    """``(a + b - 1) / b`` as a term."""
    return call("ceil_div", a, b)


def lanes(count: int, stride: int) -> list[Term]:
    """``threadIdx.x, threadIdx.x + stride, ...``: the ``count`` columns one thread takes of a tile
    ``count * stride`` wide, one in each ``stride``-wide group (a block of ``stride`` threads)."""
    return [threadIdx.x + c * stride if c else threadIdx.x for c in range(count)]


@dataclass(frozen=True)
class Buffer:
    """A handle on a global tensor or an allocated buffer."""

    name: str
    dtype: str
    shape: tuple
    space: str


@dataclass(frozen=True)
class TensorMap:
    """A handle on a TMA tensor-map parameter over a global tensor."""

    name: str
    tensor: Buffer
    box: tuple
    swizzle: str = "none"
    split: tuple = ()  # (dimension, inner extent) pairs: the box and coordinates are in the split view

    @property
    def box_bytes(self) -> int:
        n = DTYPE_BYTES[self.tensor.dtype]
        for b in self.box:
            n *= b
        return n


class BuildError(CbrulesError, ValueError):
    """A builder call given a value it cannot use; the message names the call and the fix."""


class StagingAlignmentError(BuildError):
    """A TMA store from a shared buffer that is not aligned as the TMA requires."""


def checked_int(value: Any, where: str, what: str, low: Optional[int] = None) -> int:
    """``value`` as an int (numpy ints too; bool, float and text refused), at least ``low``."""
    try:
        if isinstance(value, bool):
            raise TypeError
        v = operator.index(value)
    except TypeError:
        raise BuildError(f"{where}: {what} must be an int, got {value!r} ({type(value).__name__}); "
                         f"pass a whole number") from None
    if low is not None and v < low:
        raise BuildError(f"{where}: {what} must be at least {low}, got {v}")
    return v


def checked_ints(values: Any, where: str, what: str, low: Optional[int] = 1) -> tuple[int, ...]:
    """``values`` (a tuple or list) as ints, each at least ``low`` (:func:`checked_int`)."""
    if not isinstance(values, (tuple, list)):
        raise BuildError(f"{where}: {what} must be a tuple of ints, got {values!r}")
    return tuple(checked_int(v, where, f"{what}[{i}]", low) for i, v in enumerate(values))


def checked_choice(value: Any, where: str, what: str, options: Sequence[str]) -> str:
    """``value`` if it is one of the words ``options``, else a BuildError naming them."""
    if not isinstance(value, str) or value not in options:
        raise BuildError(f"{where}: {what} {value!r} is not one of {', '.join(options)}")
    return value


def checked_term(value: TermLike, where: str, what: str, low: Optional[int] = None) -> Term:
    """A size, bound or step: a term over symbols, or an int literal of at least ``low`` (a float
    would make C compare floats, a non-positive size negative memory)."""
    if isinstance(value, (Term, str)):
        return bounded_term(as_term(value), where, what)
    return as_term(checked_int(value, where, what, low))


def bounded_term(t: Term, where: str, what: str) -> Term:
    """``t``, unless it nests deeper or has more parts than a kernel as built may hold
    (:data:`cbrules.ir.terms.BUILT_TERM_DEPTH`, ``BUILT_TERM_PARTS``): a BuildError."""
    if fits(t, BUILT_TERM_DEPTH, BUILT_TERM_PARTS):
        return t
    parts, height = extent(t)  # the figures for the message
    size = f"nested more than {BUILT_TERM_DEPTH} operators deep" if height > BUILT_TERM_DEPTH else \
        f"of more than {BUILT_TERM_PARTS} parts as printed ({parts})"
    raise BuildError(f"{where}: {what} is an expression {size}, more than the generated code and the "
                     "simplifier take; build it in steps (a value into a register with k.add / k.mul, or a "
                     "loop instead of a long chain of + or *)")


def checked_cb_options(options: Any, where: str) -> dict:
    """The circular-buffer options as the rules read them, each checked against its type in the options
    schema (:mod:`.option_schema`; its ranges are the rules' to check, by name)."""
    if not isinstance(options, dict):
        raise BuildError(f"{where}: circular_buffer must be a dict from circular_buffer(...), got {options!r}")
    out = dict(options)
    schema = option_schema.options()
    for key, value in options.items():
        opt = schema.get(key)
        if opt is None:
            continue  # not an option (a rule folder may read keys of its own)
        problem = opt.type_problem(value)
        if problem:
            raise BuildError(f"{where}: circular_buffer {key} {problem}")
        out[key] = opt.normalized(value)
    return out


AUTO = option_schema.AUTO  # stages/prefetch chosen by the rules (cb-auto-stages, cb-auto-prefetch)


def circular_buffer(stages: Union[int, str], prefetch: Union[int, str, None] = None, war: Optional[str] = None,
                    warp_specialize: bool = False, registers: Optional[tuple[int, int]] = None,
                    strict_trip_count: bool = False, pingpong: Union[bool, int] = False) -> dict:
    """Options of a circular-buffered loop: ``stages`` S, ``prefetch`` P (negative counts from S),
    ``war`` = "sync" (block sync ends each main iteration) or "mbarrier" (empty barriers).
    Only the options given are recorded: the rules fill in the rest with the defaults the options schema
    declares (``rules/options.rules``, printed by ``cbrules options``: prefetch S-1, war "sync", or
    "mbarrier" when warp-specialized), so a rule folder can change a default. ``stages="auto"`` lets the rules choose S from the bytes a stage loads, the shared memory a
    block may use at the occupancy target, the trip count when known, and a cap (see the trace for
    why); ``prefetch="auto"`` is S-1.

    ``warp_specialize``: a producer warp group of 128 threads, added after the block's threads, issues
    the loads while the block's own threads (the consumers) compute; WAR protection is then the empty
    barriers and the producer runs up to S tiles ahead.
    ``registers=(producer, consumer)`` adds register sharing (``setmaxnreg``) between the roles.
    Any trip count runs, fewer than S and 0 included (the rules predicate the prologue's loads past
    the end); ``strict_trip_count=True`` refuses a trip count below S instead (code ``short-loop``:
    at lowering when it is known, else at launch).
    ``pingpong=True`` (or a count G >= 2 of consumer warp groups; True is 2), for a warp-specialized loop in
    a serial loop that walks independent tiles (a persistent block): the kernel is written for one group
    of consumers (the block's threads); the rules run G such groups, group g taking tiles g, g+G, ... of
    the walk, and hand the tensor cores from one group to the next through named barriers once its loop
    has issued its work, so one group's epilogue runs under the next one's loop (rules/ws_pingpong.rules).
    A value of the wrong type (the schema's ``:type``) is a :class:`BuildError` here; the rules check the
    ranges and refuse bad ones with a named error."""
    given = {"stages": stages, "prefetch": prefetch, "war": war}
    opts = {k: v for k, v in given.items() if v is not None}
    if warp_specialize or registers is not None:  # absent otherwise: annotations stay as they were
        opts["warp_specialize"] = warp_specialize
        opts["registers"] = registers
    if strict_trip_count is not False:  # absent otherwise, as above; a non-bool is refused below
        opts["strict_trip_count"] = strict_trip_count
    if pingpong is not False:  # absent otherwise, as above (True: the schema's count, 2)
        opts["pingpong"] = pingpong
    return checked_cb_options(opts, "circular_buffer(...)")


def tile_inside(tile: dict, shape: tuple) -> Term:
    """The test that element ``tile['index']`` (row-major in the box) of the box at ``tile['coords']`` lies
    inside a tensor of ``shape``."""
    rest, pred = tile["index"], None
    for d in reversed(range(len(tile["box"]))):
        within = rest % tile["box"][d] if d else rest
        rest = rest / tile["box"][d]
        t = (tile["coords"][d] + within).lt(shape[d])
        pred = t if pred is None else t.and_(pred)
    return pred


def call_site() -> str:
    """``file:line`` of the kernel author's call into the builder (every builder error names it)."""
    f = sys._getframe(1)
    # the author's line: skip the builder's own modules (builder, builder_mma, builder_values) and contextlib
    while f is not None and (f.f_globals.get("__name__", "").startswith("cbrules.ir.builder")
                             or f.f_globals.get("__name__", "") == "contextlib"):
        f = f.f_back
    if f is None:
        return "?"
    return f"{shown(f.f_code.co_filename)}:{f.f_lineno}"


ADDRESSABLE = ("tensor", "buffer")  # what load and store may address


def launch_dims(x, where: str) -> tuple[int, int, int]:
    """A block shape given as an int or 1 to 3 ints, as three ints (missing ones 1), within CUDA's thread limit."""
    t = tuple(x) if isinstance(x, (tuple, list)) else (x,)
    if not 1 <= len(t) <= 3:
        raise BuildError(f"{where}: block {x!r} must have 1 to 3 dimensions")
    dims = checked_ints(t, where, "block") + (1,) * (3 - len(t))
    if dims[0] * dims[1] * dims[2] > MAX_BLOCK_THREADS:
        raise BuildError(f"{where}: block {x!r} has {dims[0] * dims[1] * dims[2]} threads, more than the "
                         f"{MAX_BLOCK_THREADS} a CUDA block may have")
    return dims  # type: ignore[return-value]
