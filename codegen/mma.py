"""CUDA for the warpgroup-MMA nodes (mma, wgmma_fence, wgmma_commit, wgmma_wait).

An ``mma`` node is a whole tile step; it becomes, for each 64-row block j of the warp group's rows and
each k-step s of 16 (FP8: 32), one ``wgmma.mma_async.sync.aligned.m64n{BN}k16.f32.{bf16|f16}`` (FP8:
``m64n{BN}k32.f32.{e4m3|e5m2}.{e4m3|e5m2}``) whose shared-memory matrix descriptors point at A + (rows of
the warp group + 64 j) rows + 32 s bytes and B + 32 s bytes
(K-major tiles whose rows are one swizzle span: REFERENCE §7). An MN-major B (``b_major`` "mn": a
[BK, BN] tile of panels) takes the model's descriptor of it (:func:`cbrules.ir.mma_layout.b_tile_descriptor`:
LBO steps panels along N, SBO 8 K rows, a k-step 16 K rows) and a helper with the tnspB immediate set. The
instruction helpers are generated per (N, dtype, B major-ness) the kernel uses and appended to the prelude;
nothing else changes for other kernels.
"""
from __future__ import annotations

from typing import Any

from ..ir.mma_layout import MN_SPANS, TRANSPOSE, b_tile_descriptor, k_step, tma_tile_descriptor
from ..ir.ops import DTYPE_BYTES, FP8_DTYPES
from .ctext import as_int, c_term, ident
from .errors import CodegenError

_PTX_TYPE = {"bfloat16": "bf16", "float16": "f16", "float8_e4m3": "e4m3", "float8_e5m2": "e5m2"}
_HALF_PTX = ("bf16", "f16")  # the types a register A and the transpose immediates take
_SPANS = (32, 64, 128)  # the swizzle spans a K-major tile row may have (one row = one span)
MMA_M, MMA_K = 64, 16

FENCE_PRELUDE = r"""// warpgroup MMA ordering (wgmma.fence / commit_group / wait_group)
__device__ __forceinline__ void cb_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void cb_wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> __device__ __forceinline__ void cb_wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory");
}
// keeps the compiler from moving reads or writes of accumulator registers across an asynchronous MMA
template <int N> __device__ __forceinline__ void cb_fence_acc(float* d) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i]) :: "memory");
}
// a shared-memory matrix descriptor: the start address (bits 0-13, in 16-byte units) over the
// constant fields (leading / stride byte offsets, base offset, swizzle mode), given as two halves
__device__ __forceinline__ unsigned long long cb_wgmma_desc(unsigned addr, unsigned hi, unsigned lo) {
  return ((unsigned long long)hi << 32 | lo) | (unsigned long long)((addr & 0x3FFFF) >> 4);
}"""


def descriptor_fields(rows: int, swizzle: int) -> int:
    """The constant bits of the matrix descriptor of a K-major tile of ``rows`` rows, each one
    ``swizzle``-byte span (leading and stride byte offsets, base offset, swizzle mode): the model's
    descriptor (:func:`cbrules.ir.mma_layout.tma_tile_descriptor`) at start address 0."""
    if swizzle not in _SPANS:
        raise CodegenError(f"mma: swizzle {swizzle!r} is not a span of 32, 64 or 128 bytes")
    return tma_tile_descriptor(0, rows, swizzle, "k").encode()


def start_offset(first_row: int, swizzle: int, rows: int, kstep: int) -> int:
    """Bytes from the tile's start to k-step ``kstep`` of the 64 rows from ``first_row`` (the model's
    descriptor start, so codegen and the interpreter agree on every instruction's operand)."""
    return tma_tile_descriptor(first_row * swizzle, rows, swizzle, "k", kstep).start


def helper_name(n: int, dtype: str, b_major: str = "k", b_dtype: str | None = None) -> str:
    """The prelude function of one m64n{n}k16 (FP8: k32) wgmma with B ``b_major`` (``_tb``: B transposed,
    MN-major) and B of ``b_dtype`` where it differs from A's ``dtype`` (a mixed FP8 pair: ``_e4m3_e5m2``)."""
    mixed = f"_{_PTX_TYPE[b_dtype]}" if b_dtype not in (None, dtype) else ""
    return f"cb_wgmma_n{n}_{_PTX_TYPE[dtype]}{mixed}" + ("_tb" if TRANSPOSE[b_major] else "")


def instruction_helper(n: int, dtype: str, b_major: str = "k", b_dtype: str | None = None) -> str:
    """``cb_wgmma_n{n}_{type}[_tb](d, desc_a, desc_b, scale_d)``: one m64n{n}k16 wgmma into the n/2 floats
    at d; its tnspB immediate is B's major-ness (:data:`cbrules.ir.mma_layout.TRANSPOSE`), tnspA 0. FP8
    (``b_dtype`` B's type, default A's): m64n{n}k32 with no transpose immediates (FP8 is K-major only)."""
    ta, tb = _PTX_TYPE[dtype], _PTX_TYPE[b_dtype or dtype]
    regs = n // 2
    outs = ", ".join(f"%{i}" for i in range(regs))
    operands = ", ".join(f'"+f"(d[{i}])' for i in range(regs))
    transpose = f", {TRANSPOSE['k']}, {TRANSPOSE[b_major]}" if ta in _HALF_PTX else ""
    return (f"__device__ __forceinline__ void {helper_name(n, dtype, b_major, b_dtype)}(float* d, "
            f"unsigned long long da, unsigned long long db, int scale_d) {{\n"
            f'  asm volatile("{{\\n .reg .pred p;\\n setp.ne.b32 p, %{regs + 2}, 0;\\n"\n'
            f'               " wgmma.mma_async.sync.aligned.m64n{n}k{k_step(dtype)}.f32.{ta}.{tb} {{{outs}}}, %{regs}, '
            f'%{regs + 1}, p, 1, 1{transpose};\\n}}\\n"\n'
            f"               : {operands}\n"
            f'               : "l"(da), "l"(db), "r"(scale_d) : "memory");\n}}')


def register_a_name(n: int, dtype: str, b_major: str = "k") -> str:
    """The prelude function of one m64n{n}k16 (FP8: k32) wgmma with A from registers (``_tb``: B MN-major)."""
    return f"cb_wgmma_rs_n{n}_{_PTX_TYPE[dtype]}" + ("_tb" if TRANSPOSE[b_major] else "")


def register_a_helper(n: int, dtype: str, b_major: str = "k") -> str:
    """``cb_wgmma_rs_n{n}_{type}[_tb](d, a, desc_b, scale_d)``: one m64n{n}k16 wgmma whose A is the four
    packed registers at a (REFERENCE §8: no transpose immediate for A, which registers hold K-major; tnspB
    is B's major-ness). FP8: m64n{n}k32, four bytes a register, no transpose immediate at all."""
    t = _PTX_TYPE[dtype]
    regs = n // 2
    outs = ", ".join(f"%{i}" for i in range(regs))
    operands = ", ".join(f'"+f"(d[{i}])' for i in range(regs))
    a_regs = ", ".join(f"%{regs + i}" for i in range(4))
    transpose = f", {TRANSPOSE[b_major]}" if t in _HALF_PTX else ""
    return (f"__device__ __forceinline__ void {register_a_name(n, dtype, b_major)}(float* d, const unsigned* a, "
            f"unsigned long long db, int scale_d) {{\n"
            f'  asm volatile("{{\\n .reg .pred p;\\n setp.ne.b32 p, %{regs + 5}, 0;\\n"\n'
            f'               " wgmma.mma_async.sync.aligned.m64n{n}k{k_step(dtype)}.f32.{t}.{t} {{{outs}}}, '
            f'{{{a_regs}}}, %{regs + 4}, p, 1, 1{transpose};\\n}}\\n"\n'
            f"               : {operands}\n"
            f'               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d) : "memory");\n}}')


# cvt.rn.{bf16x2,f16x2}.f32 d, hi, lo: the first source lands in the upper half
PACK_PRELUDE = r"""// two floats rounded to nearest even and packed, the first in the low half (a register MMA operand's pair)
__device__ __forceinline__ unsigned cb_pack_bf16x2(float lo, float hi) {
  unsigned d; asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo)); return d;
}
__device__ __forceinline__ unsigned cb_pack_f16x2(float lo, float hi) {
  unsigned d; asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo)); return d;
}"""
# cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32 d, hi, lo: two bytes in the low half (a register FP8 operand's pair)
FP8_PACK_PRELUDE = "\n".join(
    f"""__device__ __forceinline__ unsigned cb_pack_{t}x2(float lo, float hi) {{
  unsigned short d; asm("cvt.rn.satfinite.{t}x2.f32 %0, %1, %2;" : "=h"(d) : "f"(hi), "f"(lo)); return d;
}}""" for t in ("e4m3", "e5m2"))


def pack_statement(a: Any) -> str:
    """The C statement of a cvt_pack node."""
    if a["to"] not in _PTX_TYPE or len(a["args"]) != 2:
        raise CodegenError(f"cvt_pack into {a['dst']}: to {a['to']!r} with {len(a['args'])} operand(s); expected "
                           f"two floats to one of {', '.join(_PTX_TYPE)}")
    lo, hi = (c_term(t) for t in a["args"])
    return f"{ident(a['dst'])} = cb_pack_{_PTX_TYPE[a['to']]}x2({lo}, {hi});"


def check(a: Any) -> tuple[int, int, int, int, int, str]:
    """(BM, BN, BK, groups, swizzle, dtype) of an mma node, each checked before it reaches the text."""
    shape = a["shape"]
    if not (isinstance(shape, tuple) and len(shape) == 3):
        raise CodegenError(f"mma into {a['acc']}: shape {shape!r} is not (BM, BN, BK)")
    bm, bn, bk = (as_int(v, "an mma tile dimension", 1) for v in shape)
    groups = as_int(a["groups"], "mma groups", 1)
    swizzle = as_int(a["swizzle"], "mma swizzle", 1)
    dtype = a["dtype"]
    if dtype not in _PTX_TYPE:
        raise CodegenError(f"mma into {a['acc']}: dtype {dtype!r} is not one of {', '.join(_PTX_TYPE)}")
    b_dtype = a.get("b_dtype")
    if b_dtype is not None and not (b_dtype in FP8_DTYPES and dtype in FP8_DTYPES and b_dtype != dtype):
        raise CodegenError(f"mma into {a['acc']}: b_dtype {b_dtype!r} with dtype {dtype!r}; only a mixed FP8 pair "
                           f"({' x '.join(FP8_DTYPES)}) names B's type apart")
    if dtype in FP8_DTYPES and (a.get("b_major", "k") != "k" or a.get("a_space") is not None and b_dtype):
        raise CodegenError(f"mma into {a['acc']}: an FP8 mma reads B K-major (no transposed B), and with A from "
                           "registers both operands have one type")
    # a register A with an MN-major B has no K-major shared row: its K is any number of k16 steps
    k_rows = a.get("a_space") is None or a.get("b_major", "k") == "k"
    if bm % (MMA_M * groups) or bn % 8 or not 8 <= bn <= 256 or bk % k_step(dtype) \
            or (k_rows and bk * DTYPE_BYTES[dtype] != swizzle) or swizzle not in _SPANS:
        raise CodegenError(f"mma into {a['acc']}: tile {shape} over {groups} warp groups with swizzle {swizzle} is "
                           f"not a whole number of m64nNk{k_step(dtype)} instructions on one-span rows")
    return bm, bn, bk, groups, swizzle, dtype


def b_operand(a: Any) -> tuple[str, int]:
    """(major-ness, swizzle span) of an mma node's B tile: K-major with the A rows' span unless the node
    says ``b_major`` "mn" with its ``b_swizzle``, each checked before it reaches the text."""
    major = a.get("b_major", "k")
    if major not in TRANSPOSE:
        raise CodegenError(f"mma into {a['acc']}: b_major {major!r} is not one of {', '.join(TRANSPOSE)}")
    if major == "k":
        if a.get("b_swizzle") is not None:
            raise CodegenError(f"mma into {a['acc']}: b_swizzle {a['b_swizzle']!r} on a K-major B, whose rows have "
                               "the A rows' swizzle; drop it or give b_major 'mn'")
        return major, as_int(a["swizzle"], "mma swizzle", 1)
    span = as_int(a.get("b_swizzle"), "mma b_swizzle", 1)
    bn, bk = a["shape"][1], a["shape"][2]
    if span not in MN_SPANS or bn % (span // 2) or bk % MMA_K:
        raise CodegenError(f"mma into {a['acc']}: an MN-major B tile [{bk}, {bn}] of panels with {span!r}-byte "
                           f"rows is not whole panels of {' / '.join(map(str, MN_SPANS))}-byte rows")
    return major, span


def statement(a: Any) -> str:
    """The C block of one mma node."""
    bm, bn, bk, groups, swizzle, dtype = check(a)
    if a.get("a_space") is not None:
        return _register_a_statement(a, (bm, bn, bk, groups, swizzle, dtype))
    b_major, b_span = b_operand(a)
    acc, at, bt = ident(a["acc"]), ident(a["a"]), ident(a["b"])
    rows = bm // groups
    fields_a = descriptor_fields(bm, swizzle)
    fields_b = b_tile_descriptor(0, bn, bk, b_span, b_major).encode()
    fn = helper_name(bn, dtype, b_major, a.get("b_dtype"))
    scale = c_term(a["scale_d"])
    # the warp group's place among the tile's groups: its index in the block, less group0 where the block
    # runs several tiles at once (ping-pong), so the generated text of other kernels stays as it was
    group = "(int)threadIdx.x / 128" if a.get("group0") is None else f"(int)threadIdx.x / 128 - ({c_term(a['group0'])})"
    lines = [f"{{ const unsigned cb_a = cb_smem_addr({at} + {c_term(a['a_offset'])}) + "
             f"({group}) * {rows * swizzle};",
             f"  const unsigned cb_b = cb_smem_addr({bt} + {c_term(a['b_offset'])});"]
    for j in range(rows // MMA_M):
        for s in range(bk // k_step(dtype)):
            sd = scale if s == 0 else "1"
            da = f"cb_wgmma_desc(cb_a + {start_offset(j * MMA_M, swizzle, bm, s)}, {_halves(fields_a)})"
            db = f"cb_wgmma_desc(cb_b + {b_tile_descriptor(0, bn, bk, b_span, b_major, s).start}, {_halves(fields_b)})"
            lines.append(f"  {fn}({acc} + {j * (bn // 2)}, {da}, {db}, {sd});")
    return "\n".join(lines) + " }"


def _register_a_statement(a: Any, shape: tuple) -> str:
    """An mma whose A is a packed register operand: block j, k-step s reads its registers
    a_offset + j * BK/4 + 4 s .. + 3 (FP8: j * BK/8, k32 steps; the thread's own rows: no warp-group
    offset); B as in :func:`statement`."""
    bm, bn, bk, groups, swizzle, dtype = shape
    if a["a_space"] != "register":
        raise CodegenError(f"mma into {a['acc']}: a_space {a['a_space']!r} is not 'register'")
    b_major, b_span = b_operand(a)
    acc, at, bt = ident(a["acc"]), ident(a["a"]), ident(a["b"])
    fields_b = b_tile_descriptor(0, bn, bk, b_span, b_major).encode()
    fn = register_a_name(bn, dtype, b_major)
    scale, a_off = c_term(a["scale_d"]), c_term(a["a_offset"])
    per_block = bk * DTYPE_BYTES[dtype] // 8  # A registers a thread holds for one 64-row block
    lines = [f"{{ const unsigned cb_b = cb_smem_addr({bt} + {c_term(a['b_offset'])});"]
    for j in range(bm // groups // MMA_M):
        for s in range(bk // k_step(dtype)):
            db = f"cb_wgmma_desc(cb_b + {b_tile_descriptor(0, bn, bk, b_span, b_major, s).start}, {_halves(fields_b)})"
            lines.append(f"  {fn}({acc} + {j * (bn // 2)}, {at} + {a_off} + {j * per_block + 4 * s}, {db}, "
                         f"{scale if s == 0 else '1'});")
    return "\n".join(lines) + " }"


def _halves(bits: int) -> str:
    return f"{bits >> 32}, {bits & 0xFFFFFFFF}"


def helpers(mmas: list[Any]) -> list[str]:
    """The prelude text a kernel with these mma nodes (attribute mappings) needs."""
    shapes = sorted({(a["shape"][1], a["dtype"], a.get("b_major", "k"), a.get("b_dtype") or "")
                     for a in mmas if a.get("a_space") is None})
    register_a = sorted({(a["shape"][1], a["dtype"], a.get("b_major", "k")) for a in mmas
                         if a.get("a_space") is not None})
    return [FENCE_PRELUDE] + [instruction_helper(n, d, b, bd or None) for n, d, b, bd in shapes] \
        + [register_a_helper(n, d, b) for n, d, b in register_a]


def acc_fences(mmas: list[Any]) -> str:
    """Operand fences over every accumulator the kernel's mma nodes write."""
    sizes = {}
    for a in mmas:
        bm, bn, groups = a["shape"][0], a["shape"][1], a["groups"]
        sizes[ident(a["acc"])] = (bm // groups // MMA_M) * (bn // 2)
    return "".join(f" cb_fence_acc<{n}>({acc});" for acc, n in sorted(sizes.items()))
