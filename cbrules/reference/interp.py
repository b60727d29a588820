"""A reference interpreter for kernel graphs, before or after lowering, on numpy inputs.

``run(kernel, args)`` executes the scheduled linear program block by block. Within a block every
register is a numpy array with one value per thread; an ``if`` narrows the mask of active threads
and only active threads write. Each op means what :mod:`cbrules.codegen.cuda` makes it mean in CUDA:
C arithmetic, ``float`` rounding, ``fmaf``, the warp-shuffle tree of the block reduction,
``elect.sync`` on warp 0, TMA boxes with out-of-bounds zero fill. While it runs, the barrier
protocol is checked by :mod:`cbrules.reference.protocol` (deadlock, RAW, WAR, tx bytes, init/inval, arrival
counts). Threads of a block run in lockstep, in program order, except where an if/else splits them
into groups of whole warps (warp specialization), or a warpgroup loop gives each warp group its own
copy of its body (ping-pong consumer groups): from there each group is a role of its own,
interleaved with the others by a schedule (:mod:`cbrules.reference.interp_roles`), each blocking on the
mbarrier waits and named barriers it reaches until another role makes them pass.

A ``tma_load`` without a barrier (a kernel before lowering) copies at once: it has no completion
mechanism yet, so every read after it sees its data.
"""
from __future__ import annotations

import math
import os
import random
from typing import Any, Mapping, Optional, Union

import numpy as np

from ..ir.bind import NP_DTYPES, BlocksLike, bind, select_blocks
from ..ir.builder import Kernel
from ..ir.graph import BUILTINS, KernelGraph
from .hazards import DivergentShuffle
from .hwsim import (block_reduce, block_stats, inside_box, read_box, shfl_source, swizzled, tensor_view,
                    unswizzled, write_box)
from ..ir.attributes import attribute_problem
from ..ir.limits import SWIZZLE_SPAN
from ..ir.mma_layout import (MMA_DTYPES, MMA_K, MMA_M, MN_SPANS, TRANSPOSE, WARPGROUP, MmaLayoutError,
                             b_tile_descriptor, b_tile_elements, fragment_slot, tma_tile_descriptor)
from ..ir.ops import DTYPE_BYTES, MAX_BACKOFF_NS, UNARY, WARP_SIZE
from ..ir.terms import swizzle_index
from . import interp_mma
from .hazards import TmaIssueError
from .interp_memory import MisalignedVector, NonUniform, OutOfBounds, saturated
from .interp_mma import (MmaIssueError, fragments_to_matrix, operand_addresses, pack_pairs, register_operand, wgmma,
                         wgmma_register_a)
from .interp_roles import SCHEDULES, SWITCH, Blocked, Fork, Role, check_schedule, drive
from ..errors import CbrulesError
from .protocol import BlockProtocol, DivergentSync, ElectError, InterpError, ProtocolError, Site
from ..schedule import Step, schedule
from ..ir.terms import Term
from .vterms import C_BINARY, CACHE, Lanes, TermError, c_div, compile_term

__all__ = ["run", "prepare", "Program", "InterpError", "InterpBudgetError", "OutOfBounds", "NonUniform",
           "DivergentShuffle", "SCHEDULES"]

KernelLike = Union[Kernel, KernelGraph]
_COMBINE = {"sum": C_BINARY["+"],
            "max": lambda a, b: np.where(C_BINARY[">"](a, b), a, b),
            "min": lambda a, b: np.where(C_BINARY["<"](a, b), a, b)}


def _rounded(fn):
    """``fn`` in float64, rounded to the operand's type (float32: the correctly rounded result but for
    rare double roundings; the GPU's function lies within ops.MATH_ERRORS of it)."""
    def go(x: np.ndarray) -> np.ndarray:
        return np.asarray(fn(x.astype(np.float64)), np.float64).astype(x.dtype)
    return go


_ERF = np.frompyfunc(math.erf, 1, 1)  # numpy has no erf; math.erf is accurate to a few float64 ulp


def _sigmoid(x: np.ndarray) -> np.ndarray:
    """As codegen writes it, 1 / (1 + exp(-x)), each step rounded to x's type."""
    one = x.dtype.type(1)
    return one / (one + _rounded(np.exp)(-x))


def _exp2_flushed(x: np.ndarray) -> np.ndarray:
    """ex2.approx.ftz.f32 as the interpreter computes it: 2**x rounded to float32, results below 2**-126
    (a denormal) flushed to +0 (the GPU's lies within ops.MATH_ERRORS of it)."""
    y = _rounded(np.exp2)(x)
    return np.where(y < np.float32(2.0 ** -126), np.float32(0), y).astype(x.dtype)


_UNARY_NP = {"exp": np.exp, "log": np.log, "sqrt": np.sqrt, "rsqrt": lambda x: x.dtype.type(1) / np.sqrt(x),
             "abs": np.abs, "neg": np.negative, "tanh": _rounded(np.tanh), "erf": _rounded(_ERF),
             "exp2": _rounded(np.exp2), "log2": _rounded(np.log2), "sigmoid": _sigmoid,
             "exp2_approx": _exp2_flushed}
assert set(_UNARY_NP) == set(UNARY), "every unary op needs its meaning"
_ARITH = {"add": "+", "sub": "-", "mul": "*"}
# after these a role yields: another role may run next (and may now be able to)
_SWITCH_OPS = frozenset(("mbarrier_init", "mbarrier_arrive", "mbarrier_arrive_expect_tx", "mbarrier_wait",
                         "mbarrier_inval", "syncthreads", "bar_sync", "bar_arrive", "reduce", "block_stats",
                         "tma_load"))


# Statements one block may execute: the CPU checker's cases run at most about 2,000 a block
# (two_pass at S=16, 64 trips), a statement in 50-500 us; a loop whose stop a rule set to 2e9 would
# run for days. CBRULES_INTERP_STATEMENTS changes it.
MAX_BLOCK_STATEMENTS = 20_000
STATEMENTS_VAR = "CBRULES_INTERP_STATEMENTS"


def statement_budget() -> int:
    """Statements a block may execute: ``$CBRULES_INTERP_STATEMENTS`` if set (a positive integer),
    else :data:`MAX_BLOCK_STATEMENTS`."""
    text = os.environ.get(STATEMENTS_VAR, "").strip()
    if not text:
        return MAX_BLOCK_STATEMENTS
    if not text.isdigit() or not 0 < int(text) <= 10 ** 12:
        raise InterpBudgetError.config(text)
    return int(text)


class InterpBudgetError(InterpError):
    """A block executed more statements than the interpreter's budget (a loop that would run too long)."""

    code = "interp-budget"

    @staticmethod
    def config(text: str) -> CbrulesError:
        return CbrulesError(f"{STATEMENTS_VAR}={text[:40]!r}: give a positive integer (statements a block may "
                            f"execute; default {MAX_BLOCK_STATEMENTS})")


class UnmodelledTerm(InterpError):
    """A term the interpreter has no meaning for (a function it does not model), found before running."""


class Program:
    """A scheduled kernel with its allocations, register types and compiled terms."""

    def __init__(self, kg: KernelGraph):
        self.kg = kg
        self.root = schedule(kg)
        self.allocs: dict[str, dict] = {}
        self.reg_dtypes: dict[str, np.dtype] = {}
        tma_dsts = set()
        self.fns: dict[int, dict[str, Any]] = {}
        steps = list(self.root.walk())
        # names fixed for a whole block; a loop variable or register that shadows one is not
        shadowing = {s.attrs.get("var") for s in steps} | {s.attrs.get(k) for s in steps for k in ("dst", "dst_m2")}
        invariant = frozenset(set(BUILTINS) | {p.name for p in kg.params().values() if p.kind == "symbol"}) - shadowing
        for s in steps:
            a = s.attrs
            if s.op == "alloc":
                if a["buf"] in self.allocs:
                    raise InterpError(f"buffer {a['buf']!r} is allocated twice", self.site(s, (0, 0, 0), ()))
                self.allocs[a["buf"]] = a
            elif "dst" in a and s.op not in ("store", "copy", "tma_load"):
                self.reg_dtypes.setdefault(a["dst"], np.dtype(NP_DTYPES[a.get("dtype", "float32")]))
                if s.op == "block_stats":
                    self.reg_dtypes.setdefault(a["dst_m2"], np.dtype(np.float32))
            if s.op == "tma_load":
                tma_dsts.add(a["dst"])
            try:
                self.fns[s.node] = {k: self._compile(v, invariant) for k, v in a.items()
                                    if k in ("start", "stop", "step", "pred", "index", "value", "args", "src",
                                             "src_index", "dst_index",
                                             "coords", "offset", "slot", "parity", "a_offset", "b_offset",
                                             "scale_d", "id", "group0") or k == "backoff" and isinstance(v, Term)}
            except TermError as e:
                raise UnmodelledTerm(f"{e}; the interpreter cannot run this kernel", self.site(s, (0, 0, 0), ())) \
                    from None
        self.tma_dsts = tma_dsts
        # the buffers the async proxy reads: their generic stores need the writers' proxy fences
        self.async_srcs = frozenset(s.attrs["src"] for s in steps if s.op == "tma_store") | frozenset(
            s.attrs[k] for s in steps if s.op == "mma" for k in ("a", "b"))
        # a lowered kernel (mbarriers or wgmma ordering ops) runs its mma asynchronously, checked; before
        # lowering an mma completes at once. `accumulators`: the register arrays whose accesses are checked
        self.mma_async = any(s.op.startswith("wgmma_") for s in steps) or any(
            a["space"] == "shared" and a["dtype"] == "mbarrier" for a in self.allocs.values())
        self.accumulators = frozenset(s.attrs["acc"] for s in steps if s.op == "mma" and self.mma_async) | frozenset(
            s.attrs["a"] for s in steps if s.op == "mma" and self.mma_async and s.attrs.get("a_space") == "register")

    @staticmethod
    def _compile(v, invariant: frozenset):
        if isinstance(v, Term):
            return compile_term(v, invariant)
        if isinstance(v, tuple) and all(isinstance(x, Term) for x in v):
            return tuple(compile_term(x, invariant) for x in v)
        return None

    def site(self, s: Step, block: tuple, iteration: tuple) -> Site:
        return Site(s.node, self.kg.describe(s.node) if s.node in self.kg else f"#{s.node} {s.op}", block, iteration)


def prepare(kernel: KernelLike) -> Program:
    """The kernel scheduled and compiled for :func:`run` (reuse it to run one graph many times;
    the graph must not change afterwards)."""
    return Program(kernel.graph if isinstance(kernel, Kernel) else kernel)


def run(kernel: Union[KernelLike, Program], args: Mapping[str, Any], symbols: Optional[Mapping[str, int]] = None,
        blocks: BlocksLike = None, schedule: str = "eager", seed: int = 0,
        partial: Optional[dict] = None) -> dict[str, np.ndarray]:
    """Interpret ``kernel`` (a kernel, a graph or a :func:`prepare`-d program) on ``args`` (numpy
    arrays by parameter name, symbols optional) and return the tensors it writes (fresh arrays; the
    inputs are not modified).

    ``blocks``: ``None`` runs the whole grid, ``"sample"`` the first, middle and last block, or a
    list of blocks (linear indices or ``(x, y, z)``). ``schedule`` (``eager``, ``lazy`` or ``random``
    with ``seed``) interleaves the roles of a warp-specialized kernel. Raises
    :class:`cbrules.ir.bind.LaunchError` for arguments the launcher would refuse,
    :class:`cbrules.reference.protocol.ProtocolError` subclasses for protocol violations and
    :class:`InterpError` for other faults, each naming node and iteration. ``partial``, if given,
    receives the written tensors as they stand when the run ends, also when it raises (what a
    failed check still compares with numpy).
    """
    kg = kernel.kg if isinstance(kernel, Program) else kernel.graph if isinstance(kernel, Kernel) else kernel
    check_schedule(schedule)
    bound = bind(kg, args, symbols)  # first: a refused launch costs no scheduling
    prog = kernel if isinstance(kernel, Program) else Program(kg)
    ex = _BlockRunner(prog, bound.tensors, bound.symbols, bound.grid, set(bound.written), schedule, seed)
    try:
        for b in select_blocks(bound.grid, blocks):
            ex.run_block(b)
    finally:
        if partial is not None:
            partial.update({n: bound.tensors[n] for n in bound.written})
    return {n: bound.tensors[n] for n in bound.written}


class _BlockRunner:
    """Executes a program block by block: registers, masks, loops and compute ops; memory, TMA and
    barrier ops (each hands :mod:`cbrules.reference.protocol` what it needs to check, and checks indices
    itself); the tensor-core ops, on :mod:`cbrules.reference.interp_mma`'s model."""

    def __init__(self, prog: Program, tensors: dict, symbols: dict, grid: tuple, written: set,
                 schedule: str = "eager", seed: int = 0):
        self.p, self.tensors, self.written = prog, tensors, written
        self.schedule, self.rng, self.in_roles = schedule, random.Random(seed), False
        self.budget = self.left = statement_budget()
        self.flat = {n: a.reshape(-1) for n, a in tensors.items()}
        k = prog.root.attrs
        self.bdim = tuple(k["block"])
        bx, by, bz = self.bdim
        self.T = T = bx * by * bz
        tid = np.arange(T)
        self.tx, self.ty, self.tz = tid % bx, (tid // bx) % by, tid // (bx * by)
        self.warp0 = tid < min(32, T)
        self.elect_cond = (self.tx < 32) & (self.ty == 0) & (self.tz == 0)
        self.base_env = {**symbols, "blockDim.x": bx, "blockDim.y": by, "blockDim.z": bz,
                         "gridDim.x": grid[0], "gridDim.y": grid[1], "gridDim.z": grid[2],
                         "threadIdx.x": self.tx, "threadIdx.y": self.ty, "threadIdx.z": self.tz}
        bars, shared = {}, {}
        for name, a in prog.allocs.items():
            size = int(np.prod(a["shape"]))
            if a["space"] == "shared" and a["dtype"] == "mbarrier":
                bars[name] = size
            elif a["space"] == "shared":
                shared[name] = (np.dtype(NP_DTYPES[a["dtype"]]), size, name in prog.tma_dsts, name in prog.async_srcs)
        self.proto = BlockProtocol(T, bars, shared)
        self.handlers = {op: getattr(self, "_" + op) for op in
                         ("for", "if", "load", "store", "copy", "assign", "fma", "reduce", "block_stats", "tma_load", "tma_store", "tma_store_wait",
                          "mbarrier_init", "mbarrier_arrive", "mbarrier_arrive_expect_tx", "mbarrier_wait",
                          "mbarrier_inval", "syncthreads", "bar_sync", "bar_arrive", "setmaxnreg", "mma", "wgmma_fence", "fence_proxy_async",
                          "wgmma_commit", "wgmma_wait")}
        self.handlers["alloc"] = lambda s, mask: None
        # publishes inits to the TMA unit, but orders no data accesses across proxies
        self.handlers["fence_mbarrier_init"] = lambda s, mask: self.proto.proxy_fence(np.nonzero(mask)[0], data=False)
        for op in UNARY:
            self.handlers[op] = self._unary
        for op in ("add", "sub", "mul", "div", "max", "min"):
            self.handlers[op] = self._binary
        self.handlers["select"] = self._select
        self.handlers["cvt_pack"] = self._cvt_pack
        self.handlers["shfl"] = self._shfl

    # ---------------------------------------------------------------- driver
    def run_block(self, block: tuple) -> None:
        self.block, self.iters, self.step = block, [], self.p.root
        self.left = self.budget
        self.proto.reset()
        self.env = dict(self.base_env)
        self.env[CACHE] = {}
        self.env.update({"blockIdx.x": block[0], "blockIdx.y": block[1], "blockIdx.z": block[2]})
        for r, dt in self.p.reg_dtypes.items():  # codegen declares every register "= 0" at the top
            self.env[r] = np.zeros(self.T, dt)
        self.regarrays = {n: np.zeros((self.T, int(np.prod(a["shape"]))), NP_DTYPES[a["dtype"]])
                          for n, a in self.p.allocs.items() if a["space"] == "register"}
        body = self.exec_body(self.p.root.body, np.ones(self.T, bool))
        for out in body:
            if isinstance(out, Blocked):  # one thread of control: nothing else can unblock it
                body.close()
                raise out.error
        self.step = self.p.root
        self.proto.finish(self.site)

    def exec_body(self, steps, mask: np.ndarray):
        """Run ``steps`` on the threads in ``mask``: a generator that yields where a role may give
        way (:data:`SWITCH`) or must wait (:class:`Blocked`)."""
        for s in steps:
            self.step = s
            self.left -= 1
            if self.left < 0:
                raise self._over_budget()
            handler = self.handlers.get(s.op)
            if handler is None:
                raise InterpError(f"the interpreter has no meaning for op {s.op!r}", self.site())
            try:
                r = handler(s, mask)  # None, or a generator for scopes and for what may block
                if r is not None:
                    yield from r
            except TermError as e:
                raise InterpError(str(e), self.site()) from None
            if self.in_roles and s.op in _SWITCH_OPS:
                yield SWITCH

    def _over_budget(self) -> InterpBudgetError:
        loops = ", ".join(f"{var}={i}" for var, i, _ in self.iters if not isinstance(i, str)) or "none"
        return InterpBudgetError(
            f"the block executed more than {self.budget} statements (the interpreter's budget; loop iterations "
            f"now: {loops}): a loop runs far longer than the checker's small problems need, most likely a stop a "
            f"rule set; raise {STATEMENTS_VAR} if the kernel really runs this long", self.site())

    def site(self) -> Site:
        return self.p.site(self.step, self.block, tuple(tuple(x) for x in self.iters))

    def lanes(self, mask: np.ndarray) -> Lanes:
        return Lanes(mask, self._elect)

    def _elect(self, mask: np.ndarray, warp: Optional[int] = None) -> np.ndarray:
        if warp is None:
            what, group, cand = "elect_one()", self.warp0, mask & self.elect_cond
        else:
            group = (np.arange(self.T) // 32) == warp
            what, cand = f"elect_warp({warp})", mask & group
        out = np.zeros(self.T, bool)
        if not cand.any():
            return out
        if not np.array_equal(cand, group):
            missing = np.nonzero(group & ~cand)[0]
            raise ElectError(f"{what} (elect.sync with a full mask) is reached by only part of warp "
                             f"{0 if warp is None else warp} (thread {missing[0] if missing.size else '?'} of the "
                             "warp does not reach it)", self.site())
        out[np.argmax(cand)] = True
        return out

    def ev(self, s: Step, key: str, mask: np.ndarray):
        return self.p.fns[s.node][key](self.env, self.lanes(mask))

    def uniform(self, v, mask: np.ndarray, what: str) -> int:
        if isinstance(v, np.ndarray):
            vals = v[mask] if v.ndim else v.reshape(1)
            if vals.size == 0:
                raise NonUniform(f"{what} has no active thread to take it from", self.site())
            if (vals != vals[0]).any():
                raise NonUniform(f"{what} differs across the active threads ({vals.min()} .. {vals.max()}); "
                                 "the block must agree on it", self.site())
            v = vals[0]
        return int(v)

    def per_lane(self, v, lanes: np.ndarray) -> np.ndarray:
        """A scalar or per-thread value, picked out for ``lanes``."""
        return v[lanes] if isinstance(v, np.ndarray) and v.ndim else np.full(lanes.size, v)

    def set_reg(self, dst: str, value, mask: np.ndarray) -> None:
        dt = self.p.reg_dtypes[dst]
        self.env[dst] = np.where(mask, value, self.env[dst]).astype(dt, copy=False)

    # ---------------------------------------------------------------- scopes
    def _for(self, s: Step, mask: np.ndarray) -> None:
        a, var = s.attrs, s.attrs["var"]
        saved = self.env.get(var)
        kind = a["kind"]
        start, step = self.ev(s, "start", mask), self.ev(s, "step", mask)
        if kind == "warpgroup":
            yield from self._warpgroups(s, mask, start, step)
            return
        self.iters.append([var, None, a.get("part")])
        try:
            if kind.startswith(("thread-", "block-")):
                axis = {"x": 0, "y": 1, "z": 2}[kind[-1]]
                idx = (self.tx, self.ty, self.tz)[axis] if kind.startswith("thread") else self.block[axis]
                v = C_BINARY["+"](start, C_BINARY["*"](step, idx))
                self.env[var] = v
                self.iters[-1][1] = v if not isinstance(v, np.ndarray) else "threadIdx"
                inner = mask & np.asarray(C_BINARY["<"](v, self.ev(s, "stop", mask)), bool)
                if inner.any():
                    yield from self.exec_body(s.body, inner)
                return
            lo = self.uniform(start, mask, f"start of loop {var}")
            st = self.uniform(step, mask, f"step of loop {var}")
            i = lo
            while True:
                self.env[var] = i
                # the bound is re-evaluated each iteration, as the C for loop does
                if i >= self.uniform(self.ev(s, "stop", mask), mask, f"stop of loop {var}"):
                    break
                if st <= 0:
                    raise InterpError(f"loop {var} steps by {st} and would never end", self.site())
                self.iters[-1][1] = i
                yield from self.exec_body(s.body, mask)
                self.step = s
                i += st
        finally:
            self.iters.pop()
            if saved is None:
                self.env.pop(var, None)
            else:
                self.env[var] = saved

    def _warpgroups(self, s: Step, mask: np.ndarray, start, step):
        """A warpgroup loop: each warp group of ``mask`` runs the body with var = start + step * its index
        (where below stop), as a role of its own (a fork of the running role, or the block's roles)."""
        var, group = s.attrs["var"], self.tx // 128  # threadIdx.x / 128, as codegen writes it
        lo, st = self.uniform(start, mask, f"start of loop {var}"), self.uniform(step, mask, f"step of loop {var}")
        stop = self.uniform(self.ev(s, "stop", mask), mask, f"stop of loop {var}")
        branches = []
        for g in np.unique(group[mask]):
            mine = mask & (group == g)
            if (~mask & (group == g)).any():
                raise DivergentSync(f"warpgroup loop {var} is reached by {int(mine.sum())} of the threads of warp "
                                    f"group {g} (threadIdx.x / 128); a warp group enters it whole", self.site())
            v = lo + st * int(g)
            if v < stop:
                branches.append((s.body, mine, {var: v}, [var, v, s.attrs.get("part")]))
        if not branches:
            return
        if not self.in_roles:
            self._run_roles(branches)
            return
        yield Fork([self._role(*b) for b in branches])

    def _role(self, steps, mask: np.ndarray, patch: dict, it: Optional[list] = None) -> Role:
        """A role running ``steps`` on ``mask`` from the present state (``patch`` on its registers)."""
        producer = any(x.op == "tma_load" for st in steps for x in st.walk())
        lanes = np.nonzero(mask)[0]
        name = f"{'producer' if producer else 'consumer'} (threads {lanes[0]}..{lanes[-1]})"
        iters = [list(x) for x in self.iters] + ([list(it)] if it else [])
        return Role(name, self.exec_body(steps, mask), mask, producer, {**self.env, **patch}, iters, self.step)

    def _if(self, s: Step, mask: np.ndarray):
        pred = np.asarray(self.ev(s, "pred", mask), bool)
        inner, rest = mask & pred, mask & ~pred
        then = [c for c in s.body if c.op != "else"]
        other = [c for c in s.body if c.op == "else"]
        if other and not self.in_roles and _whole_warps(inner) and _whole_warps(rest):
            self._run_roles(((then, inner, {}), (other[0].body, rest, {})))
            return
        if inner.any():
            yield from self.exec_body(then, inner)
        if other and rest.any():
            yield from self.exec_body(other[0].body, rest)

    def _run_roles(self, branches) -> None:
        """The branches of an if/else on different warps run as concurrent roles, to their ends."""
        parent = (self.env, self.iters, self.step)
        roles = [self._role(*b) for b in branches]
        self.in_roles = True
        try:
            drive(self, roles, self.schedule, self.rng)
        finally:
            self.in_roles = False
            self.env, self.iters, self.step = parent
        for r in roles:  # registers are per thread: each role's threads keep what they computed
            for reg in self.p.reg_dtypes:
                self.env[reg] = np.where(r.mask, r.env[reg], self.env[reg])

    def _setmaxnreg(self, s: Step, mask: np.ndarray) -> None:
        groups = mask[: self.T // 128 * 128].reshape(-1, 128) if self.T % 128 == 0 else None
        if groups is None or (groups.any(axis=1) & ~groups.all(axis=1)).any():
            raise ProtocolError(f"setmaxnreg.{s.attrs['action']} is executed by {int(mask.sum())} thread(s) that "
                                "are not whole warp groups of 128; each warp group runs it all together",
                                self.site())

    # ---------------------------------------------------------------- compute
    def _assign(self, s: Step, mask: np.ndarray) -> None:
        self.set_reg(s.attrs["dst"], self.ev(s, "value", mask), mask)

    def _unary(self, s: Step, mask: np.ndarray) -> None:
        (x,) = self.p.fns[s.node]["args"]
        dt = np.dtype(NP_DTYPES[s.attrs["dtype"]])
        v = np.asarray(x(self.env, self.lanes(mask)))
        v = v.astype(dt) if s.op != "neg" else v  # expf(x) takes a float; -(x) keeps x's type
        with np.errstate(all="ignore"):  # C math does not trap: log(-1) is NaN, rsqrt(0) inf
            self.set_reg(s.attrs["dst"], _UNARY_NP[s.op](v), mask)

    def _binary(self, s: Step, mask: np.ndarray) -> None:
        x, y = (f(self.env, self.lanes(mask)) for f in self.p.fns[s.node]["args"])
        op = s.op
        if op in _ARITH:
            v = C_BINARY[_ARITH[op]](x, y)
        elif op == "div":
            v = c_div(x, y)
        else:
            v = _COMBINE[op](x, y)
        self.set_reg(s.attrs["dst"], v, mask)

    def _select(self, s: Step, mask: np.ndarray) -> None:
        p, x, y = (f(self.env, self.lanes(mask)) for f in self.p.fns[s.node]["args"])
        dt = np.dtype(NP_DTYPES[s.attrs["dtype"]])
        self.set_reg(s.attrs["dst"], np.where(np.asarray(p, bool), np.asarray(x, dt), np.asarray(y, dt)), mask)

    def _shfl(self, s: Step, mask: np.ndarray) -> None:
        """Each lane reads the value its source lane computed (:func:`hwsim.shfl_source`); every lane of
        each warp that reaches it must be active (the full mask)."""
        if self.T % WARP_SIZE:
            raise DivergentShuffle(f"a warp shuffle needs whole warps; the block has {self.T} threads", self.site())
        warps = mask.reshape(-1, WARP_SIZE)
        split = warps.any(axis=1) & ~warps.all(axis=1)
        if split.any():
            w = int(np.argmax(split))
            missing = w * WARP_SIZE + int(np.argmin(warps[w]))
            raise DivergentShuffle(f"a warp shuffle (full mask 0xffffffff) is reached by {int(warps[w].sum())} of the "
                                   f"{WARP_SIZE} lanes of warp {w} (thread {missing} does not reach it, e.g. inside an "
                                   "if that splits the warp); every lane must execute it together: move it out of "
                                   "the if and select the values after it", self.site())
        value, lane = (f(self.env, self.lanes(mask)) for f in self.p.fns[s.node]["args"])
        dt = np.dtype(NP_DTYPES[s.attrs["dtype"]])
        v = np.broadcast_to(np.asarray(value).astype(dt), (self.T,))
        tid = np.arange(self.T)
        src = shfl_source(tid % WARP_SIZE, self.per_lane(lane, tid), s.attrs["mode"], int(s.attrs["width"]))
        self.set_reg(s.attrs["dst"], v[tid - tid % WARP_SIZE + src], mask)

    def _fma(self, s: Step, mask: np.ndarray) -> None:
        x, y, z = (f(self.env, self.lanes(mask)) for f in self.p.fns[s.node]["args"])
        dt = np.dtype(NP_DTYPES[s.attrs["dtype"]])
        if dt == np.float32:
            # fmaf rounds once; here the float32 product is exact in float64 and only the sum is
            # rounded (to float64, then float32: a double rounding that differs only on rare ties)
            v = (np.float64(1) * np.asarray(x, np.float32) * np.asarray(y, np.float32)
                 + np.asarray(z, np.float32)).astype(np.float32)
        else:
            v = np.asarray(x, dt) * np.asarray(y, dt) + np.asarray(z, dt)
        self.set_reg(s.attrs["dst"], v, mask)

    def _reduce(self, s: Step, mask: np.ndarray) -> None:
        a = s.attrs
        src = self.ev(s, "src", mask)
        comb = _COMBINE[a["combine"]]
        if a["kind"] == "serial":
            self.set_reg(a["dst"], comb(self.env[a["dst"]], src), mask)
            return
        if a.get("bar_id") is not None:
            self._named_reduce(s, src, comb, mask)
            return
        if not mask.all():
            raise DivergentSync("a block reduction is reached by only some threads", self.site())
        dt = np.dtype(NP_DTYPES[a["dtype"]])
        v = np.broadcast_to(np.asarray(src).astype(dt), (self.T,))
        if self.T % 32:
            raise InterpError(f"a block reduction needs whole warps; the block has {self.T} threads", self.site())
        self.set_reg(a["dst"], block_reduce(v, a["combine"], comb), mask)
        self.proto.sync_all()  # the generated reduction passes partial results through __syncthreads

    def _block_stats(self, s: Step, mask: np.ndarray) -> None:
        """The block's (mean, M2) from every thread's (over threads 0..count-1 with a named barrier)."""
        a = s.attrs
        mean, m2 = (np.broadcast_to(np.asarray(f(self.env, self.lanes(mask)), np.float32), (self.T,))
                    for f in self.p.fns[s.node]["args"])
        count = int(a["count"]) if a.get("bar_id") is not None else self.T
        if count % 32 or count > self.T or mask.sum() != count or not mask[:count].all():
            raise DivergentSync(f"block statistics over threads 0..{count - 1} are reached by {int(mask.sum())} "
                                "thread(s)", self.site())
        if (count // 32) & (count // 32 - 1):
            raise InterpError(f"block statistics need a power-of-two count of warps; {count} threads", self.site())
        out_mean, out_m2 = np.zeros(self.T, np.float32), np.zeros(self.T, np.float32)
        out_mean[:count], out_m2[:count] = block_stats(mean[:count], m2[:count], int(a["n"]))
        self.set_reg(a["dst"], out_mean, mask)
        self.set_reg(a["dst_m2"], out_m2, mask)
        if count == self.T:
            self.proto.sync_all()  # the partials pass through __syncthreads
        else:
            self.proto.clocks.sync_lanes(np.arange(count))

    def _named_reduce(self, s: Step, src, comb, mask: np.ndarray) -> None:
        """A block reduction over threads 0 .. count-1 through named barrier ``bar_id``."""
        a = s.attrs
        count = int(a["count"])
        if count % 32 or count > self.T or mask.sum() != count or not mask[:count].all():
            raise DivergentSync(f"a block reduction over threads 0..{count - 1} (named barrier {a['bar_id']}) is "
                                f"reached by {int(mask.sum())} thread(s)", self.site())
        dt = np.dtype(NP_DTYPES[a["dtype"]])
        v = np.broadcast_to(np.asarray(src).astype(dt), (self.T,))[:count]
        out = np.empty(self.T, dt)
        out[:count] = block_reduce(np.ascontiguousarray(v), a["combine"], comb)
        self.set_reg(a["dst"], out, mask)
        self.proto.clocks.sync_lanes(np.arange(count))  # the reduction passes values through shared memory

    # ------------------------------------------------------------------ memory, TMA and barrier ops
    # ---------------------------------------------------------------- memory
    def _target(self, name: str, idx: np.ndarray, lanes: np.ndarray, what: str):
        """(kind, array) of the buffer ``name`` after checking ``idx`` is inside it."""
        if name in self.regarrays:
            kind, arr = "register", self.regarrays[name]
            size = arr.shape[1]
        elif name in self.proto.shared:
            kind, arr = "shared", self.proto.shared[name]
            size = arr.data.size
        elif name in self.flat:
            kind, arr = "global", self.flat[name]
            size = arr.size
        else:
            raise InterpError(f"{what} {name!r}, which is neither a tensor nor an allocated buffer", self.site())
        bad = np.nonzero((idx < 0) | (idx >= size))[0]
        if bad.size:
            raise OutOfBounds(f"thread {lanes[bad[0]]} {what} {name}[{idx[bad[0]]}], outside its {size} "
                              "elements", self.site())
        return kind, arr

    def _index(self, s: Step, mask: np.ndarray, lanes: np.ndarray) -> np.ndarray:
        idx = self.per_lane(self.ev(s, "index", mask), lanes)
        if idx.dtype.kind not in "iub":
            raise InterpError(f"index {s.attrs['index']} is not an integer", self.site())
        return idx.astype(np.int64)

    def _read(self, kind: str, arr, idx, lanes: np.ndarray):
        """The values ``lanes`` read at ``idx`` of a register array, a shared buffer (protocol-checked)
        or a global tensor."""
        if kind == "register":
            return arr[lanes, idx]
        if kind == "shared":
            self.proto.read(arr, idx, lanes, self.site)
            return arr.data[idx]
        return arr[idx]

    def _load(self, s: Step, mask: np.ndarray) -> None:
        lanes = np.nonzero(mask)[0]
        idx = self._index(s, mask, lanes)
        kind, arr = self._target(s.attrs["src"], idx, lanes, "reads")
        if kind == "register" and s.attrs["src"] in self.p.accumulators:
            self.proto.mma.register_access(s.attrs["src"], lanes, False, self.site)
        vals = self._read(kind, arr, idx, lanes)
        dst = s.attrs["dst"]
        new = self.env[dst].copy()
        new[lanes] = vals
        self.env[dst] = new

    def _store(self, s: Step, mask: np.ndarray) -> None:
        lanes = np.nonzero(mask)[0]
        idx = self._index(s, mask, lanes)
        name = s.attrs["dst"]
        kind, arr = self._target(name, idx, lanes, "writes")
        vals = self.per_lane(self.ev(s, "value", mask), lanes)
        if kind == "register":
            if name in self.p.accumulators:
                self.proto.mma.register_access(name, lanes, True, self.site)
            arr[lanes, idx] = vals
        elif kind == "shared":
            self.proto.write(arr, idx, lanes, self.site, s.node)
            arr.data[idx] = saturated(vals, arr.data.dtype)
        else:
            if name not in self.written:
                raise InterpError(f"stores to tensor {name!r}, which the kernel does not mark written "
                                  "(codegen declares it const)", self.site())
            arr[idx] = saturated(vals, arr.dtype)

    def _copy(self, s: Step, mask: np.ndarray) -> None:
        """A vector access: each thread moves ``count`` contiguous elements at once (element by element
        here, with every index, RAW and store-in-flight check of a plain load and store)."""
        a, lanes = s.attrs, np.nonzero(mask)[0]
        n = int(a["count"])
        at = {}
        for side in ("src", "dst"):
            idx = self.per_lane(self.ev(s, f"{side}_index", mask), lanes).astype(np.int64)
            bad = np.nonzero(idx % n)[0]
            if bad.size:
                raise MisalignedVector(f"thread {lanes[bad[0]]} copies {n} elements at {a[side]}[{idx[bad[0]]}]: "
                                       f"a vector access starts at a multiple of its {n} elements", self.site())
            at[side] = idx
        kinds = {side: self._target(a[side], at[side] + n - 1, lanes, "reads" if side == "src" else "writes")
                 for side in ("src", "dst")}
        dtypes = {side: (arr.data if kind == "shared" else arr).dtype for side, (kind, arr) in kinds.items()}
        if dtypes["src"] != dtypes["dst"]:
            raise MisalignedVector(f"copies {dtypes['src']} elements of {a['src']} into {dtypes['dst']} buffer "
                                   f"{a['dst']}: a vector access moves bits, both sides need one type", self.site())
        if kinds["dst"][0] == "global" and a["dst"] not in self.written:
            raise InterpError(f"stores to tensor {a['dst']!r}, which the kernel does not mark written "
                              "(codegen declares it const)", self.site())
        for k in range(n):
            (skind, src), (dkind, dst) = kinds["src"], kinds["dst"]
            si, di = at["src"] + k, at["dst"] + k
            vals = self._read(skind, src, si, lanes)
            if dkind == "register":
                dst[lanes, di] = vals
            elif dkind == "shared":
                self.proto.write(dst, di, lanes, self.site, s.node)
                dst.data[di] = vals
            else:
                dst[di] = vals

    def _tma_load(self, s: Step, mask: np.ndarray) -> None:
        a, lanes = s.attrs, np.nonzero(mask)[0]
        fns = self.p.fns[s.node]
        env, ln = self.env, self.lanes(mask)
        tmap = self.p.kg.params()[a["tmap"]]
        dst = self.proto.shared.get(a["dst"])
        if dst is None:
            raise InterpError(f"TMA destination {a['dst']!r} is not a shared buffer", self.site())
        box = tuple(tmap.box)
        box_elems = int(np.prod(box))
        itemsize = DTYPE_BYTES[tmap.dtype]
        if a.get("barrier"):
            u = lanes[0]
            pick = lambda v: int(v[u]) if isinstance(v, np.ndarray) and v.ndim else int(v)  # noqa: E731
            if lanes.size > 1:
                raise TmaIssueError(f"{lanes.size} threads issue this TMA load (completing on {a['barrier']}); "
                                    "issue it from one elected thread", self.site(), a["barrier"],
                                    pick(fns["slot"](env, ln)))
            coords = [pick(f(env, ln)) for f in fns["coords"]]
            lo = pick(fns["offset"](env, ln))
            slot = pick(fns["slot"](env, ln))
            self._smem_range(dst, lo, box_elems)
            sid = self.proto.slot_id(a["barrier"], slot, self.site)
            data = read_box(self._global(tmap), coords, box)
            if a.get("swizzle"):  # the box lands in the swizzled layout the hardware writes
                data = swizzled(data, itemsize, int(a["swizzle"]), lo, dst.name, self.site)
            self.proto.mma.tma_written(dst, lo, box_elems, int(a.get("swizzle") or 0))
            self.proto.tma_load(sid, s.node, dst, lo, data, box_elems * itemsize, int(u), self.site)
            return
        # before lowering: the logical load of the whole tile, dense row-major, done at once (the
        # rules split a tile wider than the box into boxes; here it means what the kernel reads)
        coords = [self.uniform(f(env, ln), mask, "TMA coordinate") for f in fns["coords"]]
        lo = self.uniform(fns["offset"](env, ln), mask, "TMA offset")
        tile = tuple(a.get("tile") or box)
        self._smem_range(dst, lo, int(np.prod(tile)))
        data = read_box(self._global(tmap), coords, tile)
        self.proto.tma_load(None, s.node, dst, lo, data, data.size * itemsize, int(lanes[0]), self.site)

    def _smem_range(self, buf, lo: int, n: int) -> None:
        if lo < 0 or lo + n > buf.data.size:
            raise OutOfBounds(f"TMA box of {n} elements at {buf.name}[{lo}] runs outside its {buf.data.size} "
                              "elements", self.site())

    def _tma_store(self, s: Step, mask: np.ndarray) -> None:
        a, lanes = s.attrs, np.nonzero(mask)[0]
        tmap = self.p.kg.params()[a["tmap"]]
        src = self.proto.shared.get(a["src"])
        if src is None:
            raise InterpError(f"TMA store source {a['src']!r} is not a shared buffer", self.site())
        fns, ln = self.p.fns[s.node], self.lanes(mask)
        coords = [self.uniform(f(self.env, ln), mask, "TMA coordinate") for f in fns["coords"]]
        lo = self.uniform(fns["offset"](self.env, ln), mask, "TMA offset")
        n = int(np.prod(tmap.box))
        self._smem_range(src, lo, n)
        span = SWIZZLE_SPAN[tmap.swizzle]
        align = int(self.p.allocs[src.name].get("align") or 0)
        if span and align % (8 * span):  # the hardware anchors the pattern on the address, not the buffer
            raise InterpError(f"a TMA store with {span}B swizzle reads {src.name}, allocated {align}-byte aligned: "
                              f"its slots must start on the {8 * span}-byte pattern (align the buffer to it)",
                              self.site())
        # the shared element holding each logical element of the box (a swizzled map reads it swizzled)
        place = swizzle_index(np.arange(n), DTYPE_BYTES[tmap.dtype], span) if span else np.arange(n)
        tensor = self._global(tmap)
        inside = np.zeros(tuple(tmap.box), bool)
        inside_box(inside, coords, tensor.shape)
        sent = lo + place[inside.ravel()]  # the shared elements that reach the tensor
        self.proto.async_read(src, sent, lanes[:1], f"the TMA store #{s.node} issued by thread {lanes[0]}", self.site)
        if a.get("wait", "read") != "read":  # a bulk group left in flight: the protocol tracks its reads
            if lanes.size > 1:
                raise TmaIssueError(f"{lanes.size} threads issue this TMA store; issue it from one elected thread",
                                    self.site())
            self.proto.bulk_store(s.node, src, lo, lo + n, sent, int(lanes[0]), self.site)
        self.proto.read(src, np.arange(lo, lo + n), np.full(n, lanes[0]), self.site, plain=False)  # the TMA unit reads
        data = src.data[lo:lo + n]
        if span:
            data = unswizzled(data, DTYPE_BYTES[tmap.dtype], span, lo, src.name, self.site)
        write_box(tensor, coords, data.reshape(tmap.box))

    def _global(self, tmap) -> np.ndarray:
        """The tensor of ``tmap`` in the map's dimensions (its split view, if it has one)."""
        return tensor_view(self.tensors[tmap.tensor], tmap.name, tmap.split, self.site)

    def _tma_store_wait(self, s: Step, mask: np.ndarray) -> None:
        self.proto.bulk_wait(np.nonzero(mask)[0], int(s.attrs["pending"]), bool(s.attrs["read"]))

    # ---------------------------------------------------------------- synchronisation
    def _syncthreads(self, s: Step, mask: np.ndarray):
        if self.in_roles:  # each role reaches it on its own: barrier 0 waits for the whole block
            return self._named_barrier(0, self.T, mask)
        if not mask.all():
            raise DivergentSync(f"__syncthreads() is reached by {int(mask.sum())} of {self.T} threads",
                                self.site())
        self.proto.sync_all()
        return None

    def _bar_sync(self, s: Step, mask: np.ndarray):
        return self._named_barrier(self._bar_id(s, mask), int(s.attrs["count"]), mask)

    def _bar_arrive(self, s: Step, mask: np.ndarray) -> None:
        """``bar.arrive id, count``: counts towards the barrier's opening; the threads go on at once."""
        self.proto.bar_arrive(self._bar_id(s, mask), int(s.attrs["count"]), np.nonzero(mask)[0], self.site,
                              wait=False)

    def _bar_id(self, s: Step, mask: np.ndarray) -> int:
        """A named barrier's id: an int, or a term the active threads agree on."""
        bar = s.attrs["id"]
        return int(bar) if isinstance(bar, int) else self.uniform(self.ev(s, "id", mask), mask, "named barrier id")

    def _named_barrier(self, bar: int, count: int, mask: np.ndarray):
        """``bar.sync bar, count``: None once it opened, else a generator blocking until it does."""
        token = self.proto.bar_arrive(bar, count, np.nonzero(mask)[0], self.site)
        if self.proto.bar_passed(token):
            return None
        return self._until(lambda: self.proto.bar_passed(token), lambda: self.proto.bar_error(token, self.site))

    @staticmethod
    def _until(passed, error):
        """Block (yield) until ``passed()``; ``error()`` says why, should it never pass."""
        while not passed():
            yield Blocked(error())

    def _slots(self, s: Step, mask: np.ndarray, extra: Optional[str] = None):
        """(barrier slot id, value of ``extra``, lanes) groups of the active threads."""
        lanes = np.nonzero(mask)[0]
        slots = self.per_lane(self.ev(s, "slot", mask), lanes).astype(np.int64)
        vals = self.per_lane(self.ev(s, extra, mask), lanes).astype(np.int64) if extra else np.zeros_like(slots)
        for sl, v in sorted({(int(a), int(b)) for a, b in zip(slots, vals)}):
            yield self.proto.slot_id(s.attrs["barrier"], sl, self.site), v, lanes[(slots == sl) & (vals == v)]

    def _fence_proxy_async(self, s: Step, mask: np.ndarray) -> None:
        self.proto.proxy_fence(np.nonzero(mask)[0])

    def _mbarrier_init(self, s: Step, mask: np.ndarray) -> None:
        for sid, _, lanes in self._slots(s, mask):
            self.proto.init(sid, lanes, int(s.attrs["count"]), self.site)

    def _mbarrier_arrive(self, s: Step, mask: np.ndarray) -> None:
        for sid, _, lanes in self._slots(s, mask):
            self.proto.arrive(sid, lanes, 0, self.site)

    def _mbarrier_arrive_expect_tx(self, s: Step, mask: np.ndarray) -> None:
        for sid, _, lanes in self._slots(s, mask):
            self.proto.arrive(sid, lanes, int(s.attrs["bytes"]), self.site)

    def _mbarrier_wait(self, s: Step, mask: np.ndarray):
        """None when every thread's wait succeeds at once, else a generator blocking until they do."""
        # a :backoff sleeps between polls: it changes when the wait returns, never what it observes,
        # so only its value is checked (codegen prints it into __nanosleep)
        # (a term is computed per thread, as the device does); backoff_max, spin and suspend_hint
        # change only timing too, and a wait that would time out is the deadlock reported below
        backoff = s.attrs.get("backoff")
        why = None if backoff is None else attribute_problem("mbarrier_wait", "backoff", backoff)
        if why is None and "backoff" in self.p.fns[s.node]:
            ns = self.per_lane(self.ev(s, "backoff", mask), np.nonzero(mask)[0])
            bad = ns[(ns < 0) | (ns > MAX_BACKOFF_NS)] if ns.size else ns
            why = f"{backoff} is {int(bad[0])} on a thread" if bad.size else None
        if why:
            raise InterpError(f"mbarrier_wait :backoff {why}; give 0..{MAX_BACKOFF_NS} nanoseconds", self.site())
        left = [(sid, parity % 2, lanes) for sid, parity, lanes in self._slots(s, mask, "parity")]
        left = [g for g in left if not self.proto.try_wait(g[0], g[2], g[1], self.site)]
        if not left:
            return None

        def passed() -> bool:
            left[:] = [g for g in left if not self.proto.try_wait(g[0], g[2], g[1], self.site)]
            return not left
        return self._until(passed, lambda: self.proto.wait_error(left[0][0], left[0][1], self.site))

    def _mbarrier_inval(self, s: Step, mask: np.ndarray) -> None:
        for sid, _, lanes in self._slots(s, mask):
            self.proto.inval(sid, lanes, self.site)

    # ------------------------------------------------------------------ tensor-core ops
    # ``mma`` executes what codegen unrolls it into: warp group g of ``groups`` computes rows
    # [g * BM/groups, (g+1) * BM/groups) of the tile, as 64-row blocks j; block j, k-step s is one
    # m64n{BN}k16 wgmma whose A descriptor starts at ``a_offset`` + row g * BM/groups + 64j of the A tile
    # plus 32 s bytes, B's at ``b_offset`` plus 32 s bytes (both K-major, rows of ``swizzle`` bytes as
    # TMA wrote them: cbrules.ir.mma_layout.tma_tile_descriptor; an MN-major B, ``b_major`` "mn",
    # through cbrules.ir.mma_layout.b_tile_descriptor and the transpose bit), and whose fragment is
    # registers [j * BN/2, (j+1) * BN/2) of ``acc``. In a lowered kernel (one with mbarriers or wgmma
    # ordering ops) it is asynchronous and checked by cbrules.reference.mma_groups.MmaGroups; before
    # lowering it completes at once, like a TMA load without a barrier.
    def _warp_groups(self, s: Step, mask: np.ndarray):
        """(warp group, its 128 threads) of the active threads; a partial warp group is an error."""
        lanes = np.nonzero(mask)[0]
        for g in np.unique(lanes // WARPGROUP):
            mine = lanes[lanes // WARPGROUP == g]
            if mine.size != WARPGROUP:
                raise DivergentSync(f"{s.op} is executed by {mine.size} of the {WARPGROUP} threads of warp group {g}; "
                                    "a warp group executes it all together (.sync.aligned)", self.site())
            yield int(g), mine

    def _cvt_pack(self, s: Step, mask: np.ndarray) -> None:
        lo, hi = (f(self.env, self.lanes(mask)) for f in self.p.fns[s.node]["args"])
        self.set_reg(s.attrs["dst"], pack_pairs(np.broadcast_to(lo, (self.T,)), np.broadcast_to(hi, (self.T,)),
                                                s.attrs["to"]), mask)

    def _issuing_groups(self, s: Step, mask: np.ndarray, groups: int):
        """(warp group of the block, its place among the tile's groups, its threads, a_offset, b_offset,
        scale_d) of each warp group issuing mma ``s``, the offsets and scale uniform over the group. The
        MMA groups are tracked per warp group of the block; the place differs where the block runs
        several tiles at once (``group0``: the tile's first warp group)."""
        for wg, lanes in self._warp_groups(s, mask):
            m = np.zeros(self.T, bool)
            m[lanes] = True
            g = wg
            if s.attrs.get("group0") is not None:
                g -= self.uniform(self.ev(s, "group0", m), m, f"mma group0 in warp group {wg}")
            if not 0 <= g < groups:
                raise MmaIssueError(f"warp group {g} issues an mma of a tile on warp groups 0..{groups - 1}",
                                    self.site())
            yield (wg, g, lanes, *(self.uniform(self.ev(s, k, m), m, f"mma {k} in warp group {g}")
                                   for k in ("a_offset", "b_offset", "scale_d")))

    def _mma(self, s: Step, mask: np.ndarray) -> None:
        a = s.attrs
        if a.get("a_space") == "register":
            self._mma_register_a(s, mask)
            return
        bm, bn, bk = (int(x) for x in a["shape"])
        groups, span, dtype = int(a["groups"]), int(a["swizzle"]), a["dtype"]
        b_dtype = a.get("b_dtype") or dtype
        b_major, b_span = self._b_layout(a, span)
        rows = bm // groups
        acc = self.regarrays.get(a["acc"])
        tiles = [self.proto.shared.get(a[k]) for k in ("a", "b")]
        size = DTYPE_BYTES.get(dtype)  # bytes of an element: 2, or 1 for FP8 (both operands alike)
        if acc is None or acc.shape[1] != (rows // MMA_M) * bn // 2 or dtype not in MMA_DTYPES or any(
                t is None or t.data.dtype.itemsize != size for t in tiles):
            raise MmaIssueError(f"an mma of {dtype} tile ({bm}, {bn}, {bk}) on {groups} warp group(s) needs a float32 "
                                f"register array {a['acc']!r} of {(rows // MMA_M) * bn // 2} elements a thread and "
                                f"shared {size}-byte tiles {a['a']!r}, {a['b']!r}", self.site())
        tile_a, tile_b = tiles
        kk = interp_mma.k_step(dtype)
        for wg, g, lanes, a_off, b_off, scale_d in self._issuing_groups(s, mask, groups):
            if not self.p.mma_async:
                self._mma_logical(acc, lanes, (tile_a, a_off + g * rows * bk), (tile_b, b_off), (rows, bn, bk), scale_d,
                                  b_tile_elements(bn, bk, b_span, b_major), kk)
                continue
            try:
                steps = [(j, ks, tma_tile_descriptor(size * a_off + (g * rows + MMA_M * j) * span, bm, span, "k", ks),
                          b_tile_descriptor(size * b_off, bn, bk, b_span, b_major, ks))
                         for j in range(rows // MMA_M) for ks in range(bk // kk)]
                # the elements it reads (byte address / element size), for the protocol checks
                reads = [(tile, np.concatenate([operand_addresses(d[w], rows_of, trans, t).ravel()
                                                for d in steps]) // size)
                         for tile, w, rows_of, trans, t in ((tile_a, 2, MMA_M, 0, dtype),
                                                            (tile_b, 3, bn, TRANSPOSE[b_major], b_dtype))]
                for tile, idx in reads:  # a descriptor that reaches past the tile: named here, before any read
                    out = idx[(idx < 0) | (idx >= tile.data.size)]
                    if out.size:
                        raise MmaIssueError(f"an mma reads {tile.name}[{int(out[0])}], outside its {tile.data.size} "
                                            "elements: check the descriptors' start address, LBO and SBO",
                                            self.site())
                self.proto.mma.issue(s.node, wg, lanes, a["acc"], reads, span if b_span == span else (span, b_span),
                                     self.site)
                frags = acc[lanes]
                for j, ks, da, db in steps:  # scale-d applies to k-step 0; later ones accumulate
                    cols = slice(j * bn // 2, (j + 1) * bn // 2)
                    # the 64-bit descriptors codegen prints, decoded again by the instruction
                    frags[:, cols] = wgmma(frags[:, cols], tile_a.data, da.encode(), tile_b.data, db.encode(), n=bn,
                                           dtype=dtype, scale_d=int(bool(scale_d) or ks > 0),
                                           trans_b=TRANSPOSE[b_major], b_dtype=b_dtype)
            except MmaLayoutError as e:
                raise MmaIssueError(str(e), self.site()) from None
            acc[lanes] = frags

    def _b_layout(self, a, span: int) -> tuple[str, int]:
        """(major-ness, swizzle span) of an mma's B: an MN-major B is panels of b_swizzle-byte rows read
        through the transpose bit; refused by name where the two disagree (as codegen does)."""
        b_major = a.get("b_major", "k")
        b_span = int(a.get("b_swizzle", span))
        if b_major not in TRANSPOSE or (b_major == "mn") != ("b_swizzle" in a) or \
                b_major == "mn" and b_span not in MN_SPANS:
            raise MmaIssueError(f"an mma with b_major {b_major!r} and b_swizzle {a.get('b_swizzle')!r}: B is 'k' "
                                f"(a [BN, BK] tile, no b_swizzle) or 'mn' (a [BK, BN] tile of panels whose rows are "
                                f"b_swizzle = {' / '.join(map(str, MN_SPANS))} bytes)", self.site())
        return b_major, b_span

    def _mma_register_a(self, s: Step, mask: np.ndarray) -> None:
        """An mma whose A is packed registers: block j, k-step s reads registers a_offset + j*R + 4s .. + 3
        of each thread of the warp group (R = BK/4 registers a block, FP8 BK/8: k32 steps), B as a shared
        tile in either layout (see :meth:`_mma`; FP8: K-major)."""
        a = s.attrs
        bm, bn, bk = (int(x) for x in a["shape"])
        groups, span, dtype = int(a["groups"]), int(a["swizzle"]), a["dtype"]
        b_major, b_span = self._b_layout(a, span)
        rows = bm // groups
        acc, regs = self.regarrays.get(a["acc"]), self.regarrays.get(a["a"])
        tile_b = self.proto.shared.get(a["b"])
        if dtype not in MMA_DTYPES:
            raise MmaIssueError(f"an mma with A from registers of dtype {dtype!r}: one of {', '.join(MMA_DTYPES)}",
                                self.site())
        size, kk = DTYPE_BYTES[dtype], interp_mma.k_step(dtype)
        if acc is None or acc.shape[1] != (rows // MMA_M) * bn // 2 or regs is None or regs.dtype != np.uint32 \
                or tile_b is None or tile_b.data.dtype.itemsize != size:
            raise MmaIssueError(f"an mma of {dtype} tile ({bm}, {bn}, {bk}) with A from registers needs float32 "
                                f"register array {a['acc']!r}, uint32 register array {a['a']!r} and a shared "
                                f"{size}-byte tile {a['b']!r}", self.site())
        per_block = bk * size // 8  # registers of A a thread holds for one 64-row block
        for wg, g, lanes, a_off, b_off, scale_d in self._issuing_groups(s, mask, groups):
            first, last = a_off, a_off + (rows // MMA_M) * per_block
            if first < 0 or last > regs.shape[1]:
                raise MmaIssueError(f"an mma reads registers {a['a']}[{first}:{last}], outside its {regs.shape[1]}",
                                    self.site())
            frags = acc[lanes]
            try:
                if self.p.mma_async:
                    descs = [b_tile_descriptor(size * b_off, bn, bk, b_span, b_major, ks) for ks in range(bk // kk)]
                    idx = np.concatenate([operand_addresses(d, bn, TRANSPOSE[b_major], dtype).ravel()
                                          for d in descs]) // size
                    out = idx[(idx < 0) | (idx >= tile_b.data.size)]
                    if out.size:
                        raise MmaIssueError(f"an mma reads {tile_b.name}[{int(out[0])}], outside its "
                                            f"{tile_b.data.size} elements", self.site())
                    self.proto.mma.issue(s.node, wg, lanes, a["acc"], [(tile_b, idx)], b_span, self.site,
                                         operand=a["a"])
                else:  # before lowering the tile lies dense as its TMA boxes
                    descs, elements = None, b_off + b_tile_elements(bn, bk, b_span, b_major)
                    if elements.min() < 0 or elements.max() >= tile_b.data.size:
                        raise MmaIssueError(f"an mma reads {tile_b.name} from element {b_off}, past its "
                                            f"{tile_b.data.size} elements", self.site())
                for j in range(rows // MMA_M):
                    cols = slice(j * bn // 2, (j + 1) * bn // 2)
                    for ks in range(bk // kk):
                        r0 = a_off + j * per_block + 4 * ks
                        sd = int(bool(scale_d) or ks > 0)
                        if descs is not None:
                            frags[:, cols] = wgmma_register_a(frags[:, cols], regs[lanes, r0:r0 + 4], tile_b.data,
                                                              descs[ks].encode(), n=bn, dtype=dtype, scale_d=sd,
                                                              trans_b=TRANSPOSE[b_major])
                        else:
                            bt = tile_b.data[elements[:, ks * kk:(ks + 1) * kk]].astype(np.float64)
                            self._register_a_logical(frags, cols, regs[lanes, r0:r0 + 4], bt, dtype, sd)
            except MmaLayoutError as e:
                raise MmaIssueError(str(e), self.site()) from None
            acc[lanes] = frags

    def _register_a_logical(self, frags, cols, a_regs, bt: np.ndarray, dtype: str, scale_d: int) -> None:
        """One k16 step before lowering: A from the packed registers, B's [BN, 16] elements ``bt``."""
        bn = bt.shape[0]
        at = register_operand(a_regs, dtype).astype(np.float64)
        tile = fragments_to_matrix(frags[:, cols], bn) if scale_d else np.zeros((MMA_M, bn), np.float32)
        tile = tile + (at @ bt.T).astype(np.float32)
        rr, cc = np.meshgrid(np.arange(MMA_M), np.arange(bn), indexing="ij")
        t, r = fragment_slot(rr, cc, bn)
        block = frags[:, cols]
        block[t, r] = tile
        frags[:, cols] = block

    def _mma_logical(self, acc: np.ndarray, lanes: np.ndarray, a, b, shape, scale_d, b_elements: np.ndarray,
                     kk: int = MMA_K) -> None:
        """Before lowering: the tiles lie dense as their TMA boxes (a TMA load without a barrier copies the
        logical box), so the warp group's product of its ``rows`` of A (from element ``a_off``) and B
        (element (n, k) at ``b_off + b_elements[n, k]``: row-major [BN, BK], or MN-major panels) is taken
        on them directly, rounded like the tensor cores' k-steps."""
        (tile_a, a_off), (tile_b, b_off) = a, b
        rows, bn, bk = shape
        for tile, lo, n in ((tile_a, a_off, rows * bk), (tile_b, b_off, bn * bk)):
            if lo < 0 or lo + n > tile.data.size:
                raise MmaIssueError(f"an mma reads {tile.name}[{lo}:{lo + n}], outside its {tile.data.size} elements",
                                    self.site())
        bt = tile_b.data[b_off + b_elements].astype(np.float64)
        frags = acc[lanes]
        for j in range(rows // MMA_M):
            r0 = a_off + MMA_M * j * bk
            at = tile_a.data[r0:r0 + MMA_M * bk].reshape(MMA_M, bk).astype(np.float64)
            cols = slice(j * bn // 2, (j + 1) * bn // 2)
            tile = fragments_to_matrix(frags[:, cols], bn) if scale_d else np.zeros((MMA_M, bn), np.float32)
            for ks in range(0, bk, kk):  # one instruction's k-step (16, or 32 for FP8) at a time
                tile = tile + (at[:, ks:ks + kk] @ bt[:, ks:ks + kk].T).astype(np.float32)
            rr, cc = np.meshgrid(np.arange(MMA_M), np.arange(bn), indexing="ij")
            t, r = fragment_slot(rr, cc, bn)
            frags[t, j * bn // 2 + r] = tile
        acc[lanes] = frags

    def _wgmma_fence(self, s: Step, mask: np.ndarray) -> None:
        for _, lanes in self._warp_groups(s, mask):
            self.proto.mma.fence(lanes)

    def _wgmma_commit(self, s: Step, mask: np.ndarray) -> None:
        for g, _ in self._warp_groups(s, mask):
            self.proto.mma.commit(g)

    def _wgmma_wait(self, s: Step, mask: np.ndarray) -> None:
        for g, lanes in self._warp_groups(s, mask):
            self.proto.mma.wait(g, lanes, int(s.attrs["pending"]))


def _whole_warps(mask: np.ndarray) -> bool:
    """Some threads, and every warp either wholly in ``mask`` or wholly out of it."""
    if not mask.any() or mask.size % 32:
        return False
    w = mask.reshape(-1, 32)
    return bool((w.all(axis=1) | ~w.any(axis=1)).all())
