"""Linear program -> self-contained CUDA C++ for sm_90a.

Input is the scheduler's :class:`cbrules.schedule.Step` tree; nothing here looks at the graph.
Shared buffers are carved out of one dynamic shared-memory block at aligned offsets; registers are
declared once at the top of the kernel; PTX comes from ``prelude.cu``.

Nothing reaches the text unchecked, even though the graph was verified: names pass through
:func:`ident`, numbers through :func:`as_int`, terms through :func:`c_term` (calls only from the
device-function table) and comment text through :func:`_comment`.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ..ir.graph import Param
from ..ir.limits import MAX_SHARED_BYTES
from ..ir.ops import (DTYPE_BYTES, DTYPES, FP8_DTYPES, HALF_DTYPES, LOOP_KINDS, SHFL_MODES, STORAGE_DTYPES, UNARY,
                      WARP_SIZE)
from ..schedule import Step
from ..ir.terms import Term

from . import hints as _hints
from . import mma as _mma
from . import registers as _registers
from . import stats as _stats
from .ctext import as_int, c_term, ident
from .errors import CodegenError

PRELUDE = (Path(__file__).with_name("prelude.cu")).read_text()
# helpers only warp-specialized kernels use: appended when the kernel calls them, so the source of
# every other kernel stays as it was
PRELUDE_ROLES = (Path(__file__).with_name("prelude_roles.cu")).read_text()
_ROLE_HELPERS = ("cb_elect_warp(", "cb_block_reduce_named<")
# bar.arrive: count towards a named barrier's next opening without waiting (a hand-over to the warp group
# that waits there with bar.sync id, count); its own prelude, so kernels without it keep their text
HANDOVER_PRELUDE = """__device__ __forceinline__ void cb_bar_arrive(unsigned id, unsigned count) {
  asm volatile("bar.arrive %0, %1;" :: "r"(id), "r"(count) : "memory");
}"""
# ex2.approx.ftz.f32 (op exp2_approx); its own prelude, so kernels without it keep their text
EX2_PRELUDE = """__device__ __forceinline__ float cb_ex2_approx(float x) {
  float y; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x)); return y;
}"""
# only kernels that use float16/bfloat16 carry these (every other kernel's text stays as it was)
HALF_PRELUDE = (Path(__file__).with_name("prelude_half.cu")).read_text()
FP8_PRELUDE = (Path(__file__).with_name("prelude_fp8.cu")).read_text()  # ... and float8_e4m3/e5m2
STORE_PRELUDE = (Path(__file__).with_name("prelude_store.cu")).read_text()  # ... and bulk-group TMA stores
SWIZZLE_PRELUDE = (Path(__file__).with_name("prelude_swizzle.cu")).read_text()  # ... and swizzled tiles
VECTOR_PRELUDE = (Path(__file__).with_name("prelude_vector.cu")).read_text()  # ... and vector accesses
TMA5_PRELUDE = (Path(__file__).with_name("prelude_tma5.cu")).read_text()  # ... and maps of rank 4 and 5
VECTOR_BYTES = (4, 8, 16)
REDUCE_SCRATCH_BYTES = 32 * 8
_UNARY_C = {"exp": "exp", "log": "log", "sqrt": "sqrt", "rsqrt": "rsqrt", "abs": "fabs",
            "tanh": "tanh", "erf": "erf", "exp2": "exp2", "log2": "log2"}
_BINARY_C = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
_COMBINE = {"sum": ("CbSum", "0"), "max": ("CbMax", "-__int_as_float(0x7f800000)"),
            "min": ("CbMin", "__int_as_float(0x7f800000)")}
# emitted only when a wait has a :backoff, so kernels without one keep their exact source
BACKOFF_WAIT = r"""// mbarrier_wait :backoff NS: sleep NS nanoseconds between polls of the barrier
__device__ __forceinline__ void cb_mbar_wait_backoff(unsigned bar, unsigned parity, unsigned ns) {
  unsigned done;
  for (;;) {
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                 " selp.u32 %0, 1, 0, p;\n}\n" : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    if (done) return;
    __nanosleep(ns);
  }
}"""


@dataclass(frozen=True)
class KernelSource:
    """What codegen hands to the compiler and the launcher."""

    name: str
    text: str
    params: tuple[Param, ...]
    block: tuple[int, int, int]
    grid: tuple[Term, ...]
    shared_bytes: int
    requires: tuple = ()  # (predicate over symbols, message[, code]) to check before each launch
    aligned: tuple = ()  # (tensor, bytes): its vector accesses need its address aligned so (the launcher checks)
    setmaxnreg: tuple = ()  # (count, threads) of each setmaxnreg: what it asks of the block's register pool
    l2_promotion: tuple = ()  # (tensor map, none|64B|128B|256B) the copies ask its encoding for


def _comment(text: Any) -> str:
    """Text that stays inside a ``//`` comment: control characters (a newline would end the comment
    and start a line of code), non-ASCII and backslashes (one at the end of a line continues the
    comment onto the next) are written as escapes."""
    return "".join(c if " " <= c <= "~" and c != "\\" else f"\\x{ord(c):02x}" if ord(c) < 256 else
                   f"\\u{ord(c):04x}" if ord(c) < 0x10000 else f"\\U{ord(c):08x}" for c in str(text))


def _dtype(dtype: Any) -> str:
    if dtype not in DTYPES:
        raise CodegenError(f"refusing to print dtype {dtype!r}: not one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


def _fn(name: str, dtype: str) -> str:
    return name + ("f" if dtype == "float32" else "")


class _Emitter:
    def __init__(self, program: Step, annotate: bool):
        self.k = program.attrs
        self.annotate = annotate
        self.lines: list[str] = []
        self.registers: dict[str, str] = {}
        self.shared: list[tuple[str, str, int]] = []  # (name, c type, byte offset)
        self.reg_arrays: dict[str, Step] = {}
        self.smem_bytes = 0
        self.uses_reduce = False
        self.vector_tensors: dict[str, int] = {}  # global tensor -> the widest vector access to it, in bytes
        self.mmas: list[dict] = []  # attributes of the mma nodes (their accumulators and instruction shapes)
        self._collect(program)

    # -------------------------------------------------------------- declarations
    def _carve(self, nbytes: int, align: int) -> int:
        off = -(-self.smem_bytes // align) * align
        self.smem_bytes = off + nbytes
        return off

    def _collect(self, program: Step) -> None:
        for s in program.walk():
            a = s.attrs
            if s.op == "alloc" and a["space"] == "shared":
                ctype, n = _dtype(a["dtype"]), DTYPE_BYTES[a["dtype"]]
                for d in a["shape"]:
                    n *= as_int(d, f"a dimension of buffer {a['buf']!r}", 1)
                align = as_int(a.get("align") or 16, "an alignment", 1)
                self.shared.append((ident(a["buf"]), ctype, self._carve(n, align)))
            elif s.op == "alloc" and a["space"] == "register":
                self.reg_arrays[ident(a["buf"])] = s
            elif "dst" in a and s.op not in ("store", "copy", "tma_load", "alloc"):
                self.registers.setdefault(ident(a["dst"]), a.get("dtype", "float32"))
                if s.op == "block_stats":
                    self.registers.setdefault(ident(a["dst_m2"]), "float32")
            if _stats.uses_scratch(s):
                self.uses_reduce = True
            if s.op == "mma":
                self.mmas.append(a)
        self.stats_last = _stats.last_scratch_user(program)
        if self.uses_reduce:
            self.reduce_offset = self._carve(REDUCE_SCRATCH_BYTES, 16)

    def signature(self) -> str:
        out = []
        for p in self.k["params"]:
            if p.kind == "tensor":
                const = "" if p.written else "const "
                out.append(f"{const}{_dtype(p.dtype)}* __restrict__ {ident(p.name)}")
            elif p.kind == "tmap":
                out.append(f"const __grid_constant__ CUtensorMap {ident(p.name)}")
            else:  # a symbol: int32, or a scalar of another dtype (k.scalar)
                out.append(f"{_dtype(p.dtype)} {ident(p.name)}")
        return ", ".join(out)

    # -------------------------------------------------------------- statements
    def emit(self, s: Step, depth: int) -> None:
        pad = "  " * depth
        a = s.attrs
        note = self._note(s)
        if s.op == "for":
            self._for(s, pad, note, depth)
            return
        if s.op == "if":
            self.lines.append(f"{pad}if ({c_term(a['pred'])}) {{{note}")
            for c in s.body:
                if c.op != "else":
                    self.emit(c, depth + 1)
            for c in s.body:  # the else branch (at most one) follows the then branch, wherever it is scheduled
                if c.op == "else":
                    self.lines.append(f"{pad}}} else {{{self._note(c)}")
                    for cc in c.body:
                        self.emit(cc, depth + 1)
            self.lines.append(f"{pad}}}")
            return
        if s.op == "else":
            raise CodegenError(f"node #{s.node}: an else branch outside an if")
        stmt = self.statement(s)
        if stmt:
            self.lines.append(f"{pad}{stmt}{note}")

    def _note(self, s: Step) -> str:
        """The trailing comment of a statement: its part, and with ``annotate`` its origin."""
        a = s.attrs
        note = f"  // {_comment(a['part'])}" if a.get("part") and s.op != "for" else ""
        if self.annotate and s.origin:
            o = s.origin
            note += _comment(f"  // {o['rule']} @ {o.get('at', '?')} #{s.node}" if o.get("rule")
                             else f"  // build @ {o.get('where', '?')} #{s.node}")
            if o.get("source"):
                note += _comment(f" (from {o['source']})")
        return note

    def _for(self, s: Step, pad: str, note: str, depth: int) -> None:
        a = s.attrs
        v, start, stop, step = ident(a["var"]), c_term(a["start"]), c_term(a["stop"]), c_term(a["step"])
        part = f"  // {_comment(a['part'])}" if a.get("part") else ""
        kind = a["kind"]
        if kind not in LOOP_KINDS:
            raise CodegenError(f"loop {v}: kind {kind!r} is not one of {', '.join(LOOP_KINDS)}")
        if kind.startswith(("thread-", "block-", "warpgroup")):
            builtin = "(threadIdx.x / 128)" if kind == "warpgroup" else \
                ("threadIdx." if kind.startswith("thread") else "blockIdx.") + kind[-1]
            self.lines.append(f"{pad}{{ const int {v} = {start} + {step} * (int){builtin};{part}{note}")
            self.lines.append(f"{pad}if ({v} < {stop}) {{")
            close = f"{pad}}} }}"
        else:
            if kind in ("unroll", "unswitch", "vectorize"):
                self.lines.append(f"{pad}#pragma unroll")
            self.lines.append(f"{pad}for (int {v} = {start}; {v} < {stop}; {v} += {step}) {{{part}{note}")
            close = f"{pad}}}"
        for c in s.body:
            self.emit(c, depth + 1)
        self.lines.append(close)

    def statement(self, s: Step) -> Optional[str]:
        """The C statement of a non-scope step (None for declarations hoisted to the top)."""
        if s.op == "block_stats":  # its closing sync depends on where it is
            return _stats.statement(s, _Checked(s.op, s.attrs), self)
        self.node = s.node  # for the forms that name their node in the kernel (a wait's timeout message)
        form = _STATEMENTS.get(s.op) or (_unary if s.op in _UNARY_C else _binary if s.op in _BINARY_C else None)
        if form is None:
            raise CodegenError(f"codegen has no form for op {s.op!r} (node #{s.node})")
        return form(s.op, _Checked(s.op, s.attrs), self)

    def elect_one(self) -> str:
        bx, by, bz = self.k["block"]
        cond = ["threadIdx.x < 32"] + (["threadIdx.y == 0"] if by > 1 else []) + (["threadIdx.z == 0"] if bz > 1 else [])
        return (f"__device__ __forceinline__ bool cb_elect_one() {{ return {' && '.join(cond)} && cb_elect_sync(); }}")


def emit(program: Step, annotate: bool = False) -> KernelSource:
    """CUDA C++ for a scheduled kernel; ``annotate`` appends the origin of each statement."""
    e = _Emitter(program, annotate)
    for c in program.body:
        e.emit(c, 1)
    k = program.attrs
    bx, by, bz = (as_int(d, "a block dimension", 1) for d in k["block"])
    decls = ["  extern __shared__ __align__(1024) unsigned char cb_smem[];"]
    decls += [f"  {t}* {n} = reinterpret_cast<{t}*>(cb_smem + {off});" for n, t, off in e.shared]
    decls += [f"  {_dtype(t)} {r} = 0;" for r, t in e.registers.items()]
    bounds = f"{bx * by * bz}" + (f", {as_int(k['min_blocks'], 'min_blocks', 1)}" if k.get("min_blocks") else "")
    roles = any(h in line for line in e.lines for h in _ROLE_HELPERS)
    dtypes = {p.dtype for p in k["params"]} | {s.attrs["dtype"] for s in program.walk() if s.op == "alloc"}
    async_stores = any(s.op == "tma_store_wait" or (s.op == "tma_store" and s.attrs.get("wait", "read") != "read")
                       for s in program.walk())
    preludes = [PRELUDE] + ([HALF_PRELUDE] if dtypes & set(HALF_DTYPES) else []) \
        + ([FP8_PRELUDE] if dtypes & set(FP8_DTYPES) else []) \
        + ([STORE_PRELUDE] if async_stores else []) \
        + ([SWIZZLE_PRELUDE] if any("cb_swizzle(" in line for line in e.lines) else []) \
        + ([VECTOR_PRELUDE] if any("cb_vcopy<" in line for line in e.lines) else []) \
        + ([TMA5_PRELUDE] if any(p.kind == "tmap" and len(p.box) > 3 for p in k["params"]) else []) \
        + ([PRELUDE_ROLES] if roles else []) \
        + ([HANDOVER_PRELUDE] if any("cb_bar_arrive(" in line for line in e.lines) else []) \
        + ([EX2_PRELUDE] if any("cb_ex2_approx(" in line for line in e.lines) else []) \
        + (_mma.helpers(e.mmas) if e.mmas else []) \
        + ([_mma.PACK_PRELUDE] if any("cb_pack_" in line for line in e.lines) else []) \
        + ([_mma.FP8_PACK_PRELUDE] if any("cb_pack_e" in line for line in e.lines) else []) \
        + ([_stats.STATS_PRELUDE] if any(_stats.HELPER in line for line in e.lines) else [])
    text = "\n".join([
        *preludes, e.elect_one(), *([BACKOFF_WAIT] if any("cb_mbar_wait_backoff(" in line for line in e.lines) else []),
        *_hints.helpers(program.walk(), e.lines), "",
        f'extern "C" __global__ void __launch_bounds__({bounds}) {ident(k["name"])}({e.signature()}) {{',
        *decls, *e.lines, "}", ""])
    if e.smem_bytes > MAX_SHARED_BYTES:
        raise CodegenError(f"kernel {k['name']}: {e.smem_bytes} bytes of shared memory, more than the "
                           f"{MAX_SHARED_BYTES} a block may have on sm_90; use smaller tiles or fewer stages")
    return KernelSource(k["name"], text, tuple(k["params"]), tuple(k["block"]), tuple(k["grid"]), e.smem_bytes,
                        tuple(k.get("requires", ())), tuple(sorted(e.vector_tensors.items())),
                        _registers.demands(program, bx * by * bz), _hints.l2_promotions(program.walk()))


# ------------------------------------------------------------------------------ statement table
class _Checked(dict):
    """A step's attributes as the statement forms read them: names come out through :func:`ident`,
    counts through :func:`as_int`, dtypes only when known."""

    _NAMES = ("dst", "src", "tmap", "barrier", "buf")
    _INTS = {"count": 1, "bytes": 0, "id": 0}

    def __init__(self, op: str, attrs: dict):
        super().__init__(attrs)
        self.op = op

    def __getitem__(self, key: str) -> Any:
        v = super().__getitem__(key)
        if key in self._NAMES and not (key == "src" and self.op == "reduce"):  # a reduce's src is a term
            return ident(v)
        if key in self._INTS:
            return as_int(v, f"{key}", self._INTS[key])
        if key == "dtype":
            _dtype(v)
        return v


def _args(a) -> list[str]:
    return [c_term(t) for t in a["args"]]


def _bar(a) -> str:
    return f"cb_smem_addr(&{a['barrier']}[{c_term(a['slot'])}])"


def _coords(a) -> str:
    return ", ".join(c_term(c) for c in reversed(a["coords"]))  # TMA wants innermost first


def _unary(o, a, e) -> str:
    return f"{a['dst']} = {_fn(_UNARY_C[o], a['dtype'])}({_args(a)[0]});"


def _binary(o, a, e) -> str:
    x, y = _args(a)
    return f"{a['dst']} = ({x}) {_BINARY_C[o]} ({y});"


# CUDA's intrinsics (NVRTC declares them without headers) and the C type of their lane argument
_SHFL_C = {"xor": ("__shfl_xor_sync", "int"), "down": ("__shfl_down_sync", "unsigned"),
           "up": ("__shfl_up_sync", "unsigned"), "idx": ("__shfl_sync", "int")}
assert set(_SHFL_C) == set(SHFL_MODES)


def _shfl(a) -> str:
    """A full-mask warp shuffle; the value is cast to the register's type so that the intrinsic's
    overload is the register's (a literal would pick double)."""
    width = as_int(a["width"], "a shuffle width", 1)
    if a["mode"] not in _SHFL_C or width > WARP_SIZE or width & (width - 1) or a["dtype"] in STORAGE_DTYPES:
        raise CodegenError(f"shfl into {a['dst']}: mode {a['mode']!r}, width {width}, dtype {a['dtype']!r}; expected "
                           f"{', '.join(SHFL_MODES)}, a power of two up to {WARP_SIZE} and a register type")
    fn, lane_type = _SHFL_C[a["mode"]]
    value, lane = _args(a)
    return f"{a['dst']} = {fn}(0xffffffffu, ({_dtype(a['dtype'])})({value}), ({lane_type})({lane}), {width});"


def _sigmoid(a) -> str:
    """1 / (1 + e^-x): the IEEE add and division around expf (whose 2 ulp dominate; ops.MATH_ERRORS)."""
    one = "1.0f" if a["dtype"] == "float32" else "1.0"
    return f"{a['dst']} = {one} / ({one} + {_fn('exp', a['dtype'])}(-({_args(a)[0]})));"


def _register_array(a) -> Optional[str]:
    if a["space"] != "register":
        return None  # shared buffers are carved out of dynamic shared memory at the top
    size = 1
    for d in a["shape"]:
        size *= as_int(d, f"a dimension of register array {a['buf']}", 1)
    # only an alignment above the element's own is printed (a vector copy's register array)
    align = a.get("align") or 1
    align = f"__align__({as_int(align, 'an alignment', 1)}) " if align > DTYPE_BYTES[a["dtype"]] else ""
    return f"{align}{DTYPES[a['dtype']]} {a['buf']}[{size}];"


def _reduce(o, a, e) -> str:
    if a["combine"] not in _COMBINE or a["kind"] not in ("serial", "block"):
        raise CodegenError(f"reduce into {a['dst']}: kind {a['kind']!r} / combine {a['combine']!r} unknown")
    functor, identity = _COMBINE[a["combine"]]
    ctype = DTYPES[a["dtype"]]
    if a["kind"] == "serial":
        return f"{a['dst']} = {functor}()({a['dst']}, {c_term(a['src'])});"
    if a.get("bar_id") is not None:  # over the threads before `count` only, through a named barrier
        return (f"{a['dst']} = cb_block_reduce_named<{ctype}>({c_term(a['src'])}, ({ctype}){identity}, "
                f"{functor}(), reinterpret_cast<{ctype}*>(cb_smem + {e.reduce_offset}), {as_int(a['bar_id'], 'a named barrier id', 1)}, "
                f"{as_int(a['count'], 'a named barrier thread count', 32)});")
    return (f"{a['dst']} = cb_block_reduce<{ctype}>({c_term(a['src'])}, ({ctype}){identity}, "
            f"{functor}(), reinterpret_cast<{ctype}*>(cb_smem + {e.reduce_offset}));")


def _copy(a, e) -> str:
    """One vector access; the bytes it moves come from the register-array side's dtype (the rules put
    a register array on one side)."""
    arrays = [e.reg_arrays.get(a[side]) for side in ("dst", "src")]
    array = next((r for r in arrays if r is not None), None)
    nbytes = a["count"] * DTYPE_BYTES[array.attrs["dtype"]] if array is not None else 0
    if nbytes not in VECTOR_BYTES:
        raise CodegenError(f"copy {a['src']} -> {a['dst']}: a vector access moves 4, 8 or 16 bytes between a "
                           f"register array and memory; this one moves {a['count']} elements "
                           + (f"({nbytes} bytes)" if array is not None else "with no register array on either side"))
    tensors = {p.name: p for p in e.k["params"] if p.kind == "tensor"}
    if a["dst"] in tensors and not tensors[a["dst"]].written:
        raise CodegenError(f"copy into tensor {a['dst']!r}, which the kernel does not write (its parameter is "
                           "const): only a tensor a store of the kernel writes can take a vector copy")
    for side in ("dst", "src"):
        if a[side] in tensors:
            e.vector_tensors[a[side]] = max(e.vector_tensors.get(a[side], 0), nbytes)
    return f"cb_vcopy<{nbytes}>(&{a['dst']}[{c_term(a['dst_index'])}], &{a['src']}[{c_term(a['src_index'])}]);"


def _flag(v: Any, what: str) -> bool:
    if not isinstance(v, bool):
        raise CodegenError(f"refusing to print {what} {v!r} into CUDA: it must be True or False")
    return v


def _tma_store(a) -> str:
    wait = a.get("wait", "read")
    if wait not in ("read", "none"):
        raise CodegenError(f"tma_store from {a['src']}: wait {wait!r} is not 'read' or 'none'")
    fn = "cb_tma_store" if wait == "read" else "cb_tma_store_async"
    if a.get("cache_hint") is not None:
        return _hints.tma_store(a, fn, _coords(a), c_term(a["offset"]))
    return f"{fn}(&{a['tmap']}, cb_smem_addr({a['src']} + {c_term(a['offset'])}), {_coords(a)});"


_STATEMENTS = {
    "alloc": lambda o, a, e: _register_array(a),
    "load": lambda o, a, e: f"{a['dst']} = {a['src']}[{c_term(a['index'])}];",
    "store": lambda o, a, e: f"{a['dst']}[{c_term(a['index'])}] = {c_term(a['value'])};",
    "copy": lambda o, a, e: _copy(a, e),
    "assign": lambda o, a, e: f"{a['dst']} = {c_term(a['value'])};",
    "neg": lambda o, a, e: f"{a['dst']} = -({_args(a)[0]});",
    "max": lambda o, a, e: f"{a['dst']} = cb_max({', '.join(_args(a))});",
    "min": lambda o, a, e: f"{a['dst']} = cb_min({', '.join(_args(a))});",
    "fma": lambda o, a, e: f"{a['dst']} = {_fn('fma', a['dtype'])}({', '.join(_args(a))});",
    "select": lambda o, a, e: "{} = ({}) ? ({}) : ({});".format(a["dst"], *_args(a)),
    "shfl": lambda o, a, e: _shfl(a),
    "sigmoid": lambda o, a, e: _sigmoid(a),
    "exp2_approx": lambda o, a, e: f"{a['dst']} = cb_ex2_approx({_args(a)[0]});",
    "reduce": _reduce,
    "tma_load": lambda o, a, e: _hints.tma_load(a, _bar(a), _coords(a), c_term(a["offset"]))
    if a.get("cache_hint") is not None else (f"cb_tma_load(cb_smem_addr({a['dst']} + {c_term(a['offset'])}), &{a['tmap']}, "
                              f"{_bar(a)}, {_coords(a)});"),
    "tma_store": lambda o, a, e: _tma_store(a),
    "tma_store_wait": lambda o, a, e: (f"cb_bulk_wait{'_read' if _flag(a['read'], 'read') else ''}"
                                    f"<{as_int(a['pending'], 'pending', 0)}>();"),
    "mbarrier_init": lambda o, a, e: f"cb_mbar_init({_bar(a)}, {a['count']});",
    "mbarrier_arrive": lambda o, a, e: f"cb_mbar_arrive({_bar(a)});",
    "mbarrier_arrive_expect_tx": lambda o, a, e: f"cb_mbar_arrive_expect_tx({_bar(a)}, {a['bytes']});",
    "mbarrier_wait": lambda o, a, e: _hints.wait(a, e.node, _bar(a), c_term(a["parity"])),
    "mbarrier_inval": lambda o, a, e: f"cb_mbar_inval({_bar(a)});",
    "syncthreads": lambda o, a, e: "__syncthreads();",
    "fence_proxy_async": lambda o, a, e: "cb_fence_proxy_async();",
    "fence_mbarrier_init": lambda o, a, e: "cb_fence_mbarrier_init();",
    "bar_sync": lambda o, a, e: f"cb_bar_sync({_bar_id(a)}, {a['count']});",
    "bar_arrive": lambda o, a, e: f"cb_bar_arrive({_bar_id(a)}, {a['count']});",
    "setmaxnreg": lambda o, a, e: _setmaxnreg(a),
    "mma": lambda o, a, e: _mma.statement(a),
    "cvt_pack": lambda o, a, e: _mma.pack_statement(a),
    "wgmma_fence": lambda o, a, e: "cb_wgmma_fence();",
    "wgmma_commit": lambda o, a, e: "cb_wgmma_commit();",
    # once no group is pending the accumulators are final: fence them so no read moves above the wait
    # (a fence while a group is in flight would make ptxas serialize the MMA)
    "wgmma_wait": lambda o, a, e: f"cb_wgmma_wait<{as_int(a['pending'], 'pending', 0)}>();"
                                  + (_mma.acc_fences(e.mmas) if a["pending"] == 0 else ""),
}

assert set(UNARY) <= set(_UNARY_C) | set(_STATEMENTS), "every unary op needs its C form"


def _bar_id(a) -> str:
    """A named barrier's id: an int 0..15, or a term (a warp group's own barrier, evaluated on the device)."""
    v = dict.__getitem__(a, "id")
    if isinstance(v, Term) and not (v.op == "const" and isinstance(v.value, int) and not isinstance(v.value, bool)):
        return f"(unsigned)({c_term(v)})"
    bar = as_int(v.value if isinstance(v, Term) else v, "a named barrier id", 0)
    if bar > 15:
        raise CodegenError(f"named barrier {bar}: the ids are 0..15")
    return str(bar)


def _setmaxnreg(a) -> str:
    action, count = a["action"], a["count"]
    if action not in ("inc", "dec") or not isinstance(count, int) or not (24 <= count <= 256 and count % 8 == 0):
        raise CodegenError(f"setmaxnreg.{action} {count!r}: the action is inc or dec and the count a multiple of 8 "
                           "in 24..256")
    return f'asm volatile("setmaxnreg.{action}.sync.aligned.u32 {count};");'
