"""FlashAttention forward ``o = softmax(scale * q @ k^T) @ v`` on the tensor cores, pipelined by the rules.

Tensors are ``[BH, L, D]`` (batch x heads flattened first; queries ``Lq``, keys ``Lk``), bfloat16 or
float16; the output has the inputs' dtype, the optional log-sum-exp ``lse`` [BH, Lq] is float32 (the
natural log of each row's sum of ``exp(scale * s)``, as torch's). A block owns ``bm`` query rows of one
(batch, head): ``bm / 64`` consumer warp groups of 64 rows each. It TMA-loads its Q tile once, before the
loop (a loop-invariant mma operand: the rules give it its own barrier, rules/mma.rules), then walks the key
tiles of ``bn`` keys in a circular-buffered loop that TMA-loads K and V ([bn, D] each, V in its natural
layout):

    S = Q K^T                    (shared A and B, K-major: one wgmma group; the fragment stays in registers)
    S = -inf past the keys (and, causal, above the diagonal: key > query)   select on the fragment, in
                                                                            the tiles that cross an edge
    m_new = max(m, rowmax(S) * scale * log2 e)                              fragment_reduce (2 shuffles)
    P = exp2(S * scale * log2 e - m_new);  l = l * exp2(m - m_new) + rowsum(P)  (the thread's own columns)
    O = O * exp2(m - m_new);  O += P V      (P rounded to bf16/f16 in registers: the register-A wgmma;
                                             V [bn, D] read MN-major through the transpose bit)

exp2 is the special function unit's ``ex2.approx.ftz`` (op ``exp2_approx``: exp2f without its
rescaling of denormal results, which cost three instructions an element; a weight below 2^-126 is 0). At the
end the kernel scales O by 1 / l (the four lanes of a row sum their partial l by two shuffles) and stores O
per thread, two neighbouring columns a store (and lse = (m + log2 l) * ln 2), rows past Lq not written. Causal (top-left aligned, as torch's
``is_causal``: key <= query) walks only the key tiles up to the block's last query row; blocks take query
tiles last-first, so the longest start first. Ragged Lq and Lk: the TMA loads zero-fill past the tensor's
end, the mask sends those keys to -inf.

``warp_specialize=True``: a producer warp group issues the K/V loads, the consumers (which load Q once
before their loop) compute; ``registers`` shares the register file (setmaxnreg, default 24 / 240). The
scores' mma completes before the threads read S; the output's stays in flight into the next iteration
and completes before the threads rescale O there (rules/mma.rules: mma-wait-read-in-loop,
mma-wait-before-carried-read). Head dim 256 takes 64-key tiles (``bn`` defaults to 64 there).

``persistent=P`` (warp-specialized, not causal): P blocks (one an SM: 132 on an H200) walk the
(head, query tile) pairs; the producer loads each tile's Q as well (a walk operand, rules/mma.rules: its
own barrier pair, freed after the key loop) and runs on into the next tile's K/V while the consumers
store the last one's output. Measured on the H200 it gains about 10 % at L = 1k (D = 64, 128), is even at
4k and loses 2-7 % at L = 16k and at D = 256, so it is not the default (docs/attention.md);
``cbrules.torch.attention`` takes it for short non-causal sequences.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Callable, Iterator, Optional

from ..errors import CbrulesError
from ..ir.builder import Kernel, blockIdx, ceil_div, circular_buffer
from ..ir.builder_mma import MMA_M
from ..ir.mma_layout import MMA_DTYPES
from ..ir.limits import MAX_SHARED_BYTES, REGISTERS_PER_BLOCK
from ..ir.ops import DTYPE_BYTES, FP8_DTYPES
from ..ir.terms import call, name

HEAD_DIMS = (64, 128, 256)  # 256 with 64-key tiles: its 64 x 256 output fragment is 128 registers a thread
BM, BN = 128, 128  # query rows a block (two consumer warp groups; three at D = 64), keys a tile (64 at D = 256)
PANEL = 64  # columns of D (and of V) one 128-byte-swizzled TMA box holds (FP8: 128)
KEY_TILES = (64, 80, 96, 128, 192, 256)  # keys a tile: whole k16 steps of P V; 80 and 96 fill D = 256's registers
FP8_KEY_TILES = (64, 128)  # FP8: a V^T tile row (bn keys) is one 64- or 128-byte swizzle span
SWIZZLES = {32: "32B", 64: "64B", 128: "128B"}
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
NEG_INF = float("-inf")


class AttentionError(CbrulesError, ValueError):
    """An attention kernel asked for with parameters it is not built for."""


def check(head_dim, dtype, bm, bn, stages, scale) -> None:
    """Refuse by name the parameters :func:`attention` is not built for (``stages`` None: not checked)."""
    if type(head_dim) is not int or head_dim not in HEAD_DIMS:
        raise AttentionError(f"attention: head_dim={head_dim!r}: built for {', '.join(map(str, HEAD_DIMS))}")
    if dtype not in MMA_DTYPES:
        raise AttentionError(f"attention: dtype {dtype!r}: the tensor cores take {', '.join(MMA_DTYPES)} here")
    if type(bm) is not int or bm not in (64, 128, 192, 256):
        raise AttentionError(f"attention: bm={bm!r}: 64 to 256 query rows, 64 (one consumer warp group) a step")
    tiles = FP8_KEY_TILES if dtype in FP8_DTYPES else KEY_TILES
    if type(bn) is not int or bn not in tiles:
        raise AttentionError(f"attention: bn={bn!r}: {', '.join(map(str, tiles))} keys a tile"
                             + (f" for {dtype} (V^T's rows of bn bytes, one 64- or 128-byte swizzle span)"
                                if dtype in FP8_DTYPES else ""))
    if head_dim == 256 and bn > 80:
        raise AttentionError(f"attention: head_dim=256 with bn={bn}: the 64 x 256 float32 output fragment is 128 "
                             f"registers a thread, the {bn}-key scores {bn // 2} more and P {bn // 4}, with the "
                             "addresses and row statistics past the 240 a consumer thread may hold; use bn=64 or 80")
    if isinstance(stages, int) and not isinstance(stages, bool):
        need = _tile_bytes(stages, head_dim, dtype, bm, bn)
        if need + 2048 > MAX_SHARED_BYTES:  # + the barriers and the tiles' 1024-byte alignment
            raise AttentionError(f"attention: {stages} stages of K and V tiles [{bn}, {head_dim}] and a Q tile "
                                 f"[{bm}, {head_dim}] need {need} bytes of shared memory, more than the "
                                 f"{MAX_SHARED_BYTES} a block may have; use fewer stages or a smaller bn")
    if scale is not None and not (isinstance(scale, (int, float)) and not isinstance(scale, bool)
                                  and math.isfinite(scale) and scale > 0):
        raise AttentionError(f"attention: scale={scale!r}: give a positive finite number (default 1/sqrt(D))")


def attention(stages=None, prefetch=None, war: Optional[str] = None, warp_specialize: bool = False,
              registers=None, dtype: str = "bfloat16", head_dim: int = 64, causal: bool = False,
              scale: Optional[float] = None, lse: bool = False, bm: Optional[int] = None, bn: Optional[int] = None,
              mask_mod: Optional[Callable] = None, key_blocks: Optional[Callable] = None,
              persistent: int = 0) -> Kernel:
    """The attention forward over ``q [BH, Lq, D]``, ``k, v [BH, Lk, D]`` into ``o [BH, Lq, D]`` (and
    ``lse [BH, Lq]`` with ``lse=True``); ``scale`` defaults to ``1 / sqrt(head_dim)``. See the module doc.

    FP8 (``dtype`` float8_e4m3 or float8_e5m2): the tensor cores read an FP8 B K-major only, so V comes
    transposed, ``vt [BH, D, Lv]`` (Lv >= Lk a multiple of 16, TMA's row pitch: rows padded past Lk with
    zeros where Lk is not; refused by name at launch if Lv < Lk), and the kernel takes the
    dequantization scales as float32 scalars ``scale_q``, ``scale_k``, ``scale_v`` (the inputs are
    ``x / scale_x`` rounded to FP8): ``o = softmax(scale * scale_q * scale_k * q @ k^T) @ v * scale_v``,
    o bfloat16. P is rounded to the same FP8 type for P @ V (FlashAttention-3's FP8 forward does the
    same), its pairs moved between the lanes of a row into the FP8 A operand's layout
    (:meth:`Kernel.fragment_convert`).

    Variants (examples/sliding_window_attention.py): ``mask_mod(e)`` returns the predicate that keeps a
    score element (``e.row`` its query, ``e.col`` its key; False sends it to -inf), on top of the keys'
    end and ``causal``; ``key_blocks(row0, key_tiles)`` returns ``(first, stop, partial)``: the key
    tiles [first, stop) the query tile from row ``row0`` visits (``key_tiles`` the ones it would
    visit otherwise) and ``partial(key0)``, the predicate of a tile that ``mask_mod`` may cut (the mask
    pass runs on those only; default: every tile, when ``mask_mod`` is given). A row none of whose keys
    is kept gets NaN, as in torch. ``persistent=P``: P blocks walk the query tiles (see the module doc)."""
    bm = default_bm(head_dim) if bm is None else bm
    bn = default_bn(head_dim) if bn is None else bn
    check(head_dim, dtype, bm, bn, stages, scale)
    check_persistent(persistent, warp_specialize, causal, key_blocks)
    stages = default_stages(head_dim, dtype, bm, bn) if stages is None else stages
    d = head_dim
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    c = scale * LOG2E  # scores in the log2 domain: exp(scale * s - m) = exp2(c * s - m')
    groups = bm // MMA_M
    fp8 = dtype in FP8_DTYPES
    panel = min(d, 128 // DTYPE_BYTES[dtype])  # columns of D in one K-major row of at most 128 bytes
    panels = d // panel
    swizzle = SWIZZLES[panel * DTYPE_BYTES[dtype]]
    k = Kernel("attention", block=128 * groups)
    bh, lq, lk = k.symbol("BH"), k.symbol("Lq"), k.symbol("Lk")
    q, kt = (k.tensor(nm, (bh, ln, d), dtype) for nm, ln in (("q", lq), ("k", lk)))
    # FP8: V transposed (K-major for P @ V, the only FP8 layout the tensor cores read), its rows Lv >= Lk keys
    # (Lv bytes: TMA needs a multiple of 16, so a caller may pad them; P is 0 past Lk)
    if fp8:
        lv = k.symbol("Lv")
        vt = k.tensor("vt", (bh, d, lv), dtype)
        k.require(lv.ge(lk), "FP8 attention: vt [BH, D, Lv] holds fewer keys (Lv) than k (Lk); its rows must cover "
                             "every key (pad them past Lk with zeros to a multiple of 16: TMA's row pitch)")
    else:
        vt = k.tensor("v", (bh, lk, d), dtype)
    o = k.tensor("o", (bh, lq, d), "bfloat16" if fp8 else dtype)
    lse_out = k.tensor("lse", (bh, lq), "float32") if lse else None
    if fp8:  # the dequantization scales: q k^T's into the exponent's factor, v's into the final 1 / l
        scale_q, scale_k, scale_v = (k.scalar(nm) for nm in ("scale_q", "scale_k", "scale_v"))
    q_map = k.tensor_map(q, box=(1, bm, panel), swizzle=swizzle)
    k_map = k.tensor_map(kt, box=(1, bn, panel), swizzle=swizzle)
    # Q and K in panels (a K-major row is one swizzle span): S = sum over panels of Q_p K_p^T
    q_t = [k.alloc(f"q_t{p}", "shared", dtype, (bm, panel), align=1024) for p in range(panels)]
    k_t = [k.alloc(f"k_t{p}", "shared", dtype, (bn, panel), align=1024) for p in range(panels)]
    if fp8:  # V^T [D, bn]: rows of bn keys (one 64- or 128-byte span), K-major B
        v_map = k.tensor_map(vt, box=(1, d, bn), swizzle=SWIZZLES[bn])
        v_t = k.alloc("v_t", "shared", dtype, (d, bn), align=1024)
    else:
        v_map = k.tensor_map(vt, box=(1, bn, PANEL), swizzle="128B")
        v_t = k.alloc("v_t", "shared", dtype, (bn, d), align=1024)  # [bn, D] as D/64 panels [bn, 64], MN-major B

    s = k.mma_accumulator(bm, bn, acc="s", groups=groups)
    out = k.mma_accumulator(bm, d, acc="o_acc", groups=groups)
    p_regs = k.mma_operand(s, dtype, dst="p")
    rows = (bm // groups // MMA_M) * 2  # rows a thread holds: two a 64-row block
    m_run = k.alloc("m_run", "register", "float32", (rows,))
    l_run = k.alloc("l_run", "register", "float32", (rows,))
    alpha = k.alloc("alpha", "register", "float32", (rows,))
    m_use = k.alloc("m_use", "register", "float32", (rows,))  # m, or 0 while a row has kept no key
    tile_max = k.alloc("s_max", "register", "float32", (rows,))
    l_inv = k.alloc("l_inv", "register", "float32", (rows,))
    if warp_specialize and registers is None:  # the consumers hold S, O and P: give them the producer's share
        registers = ws_registers(groups)
    cb = circular_buffer(stages, prefetch, war, warp_specialize, registers)
    tiles_q = ceil_div(lq, bm)

    def query_tile(tile, head):
        """One block's work on query tile ``tile`` of (batch, head) ``head``."""
        row0 = tile * bm
        key_tiles = ceil_div(lk, bn)
        if causal:  # keys up to the block's last query row
            key_tiles = call("min", key_tiles, ceil_div(row0 + bm, bn))
        first, partial = 0, None
        if key_blocks is not None:
            first, key_tiles, partial = key_blocks(row0, key_tiles)
        cs = k.assign(k.mul(c, k.mul(scale_q, scale_k)), dst="score_scale") if fp8 else c

        with k.loop("r0", rows, kind="unroll") as r:
            k.store(m_run, r, NEG_INF)
            k.store(l_run, r, 0.0)

        for p in range(panels):  # once, before the loop: the rules give these loads their own barrier
            k.tma_load(q_map, (head, row0, p * panel), q_t[p])
        with k.loop("t", key_tiles - first, circular_buffer=cb) as t:
            key0 = (first + t) * bn
            for p in range(panels):
                k.tma_load(k_map, (head, key0, p * panel), k_t[p])
            if fp8:
                k.tma_load(v_map, (head, 0, key0), v_t)
            else:
                for p in range(d // PANEL):
                    k.tma_load(v_map, (head, key0, p * PANEL), v_t, offset=p * bn * PANEL)
            for p in range(panels):
                k.mma(s, q_t[p], k_t[p], scale_d=0 if p == 0 else 1)

            def masked(e):
                keep = e.col.lt(lk)
                if causal:
                    keep = keep.and_(e.col.le(e.row))
                if mask_mod is not None:
                    keep = keep.and_(mask_mod(e))
                return k.select(keep, e.value, NEG_INF)
            # only the tiles that reach past the keys (the last) or above a query row (causal: the diagonal's)
            edge = (key0 + bn).gt(lk)
            if causal:
                edge = edge.or_((key0 + bn - 1).gt(row0))
            if mask_mod is not None:
                edge = edge.or_(partial(key0)) if partial is not None else None
            with (k.if_(edge) if edge is not None else _always()):
                k.fragment_map(s, masked, origin=(row0, key0))
            k.fragment_reduce(s, "row", "max", into=tile_max)
            with k.loop("r1", rows, kind="unroll") as r:
                old = k.load(m_run, r)
                new = k.max(old, k.mul(k.load(tile_max, r), cs))
                # a row with no kept key yet (-inf): its exponents stay -inf (0), not -inf - -inf (NaN)
                use = k.select(new.eq(NEG_INF), 0.0, new)
                k.store(alpha, r, k.exp2_approx(k.sub(old, use)))
                k.store(m_run, r, new)
                k.store(m_use, r, use)
            k.fragment_map(s, lambda e: k.exp2_approx(k.sub(k.mul(e.value, cs), k.load(m_use, _row_slot(e)))))
            _own_row_sums(k, s, l_run, alpha, bn, rows)
            k.fragment_map(out, lambda e: k.mul(e.value, k.load(alpha, _row_slot(e))))
            k.fragment_convert(s, p_regs)
            k.mma(out, p_regs, v_t, b_layout="nk" if fp8 else "kn")

        # the four lanes of a row hold its partial sums: two shuffles give each the row's l; O is scaled by
        # 1 / l, one division a row instead of one an element (the divisions were a fifth of the epilogue)
        with k.loop("r2", rows, kind="unroll") as r:
            part = k.load(l_run, r)
            for lane in (1, 2):
                part = k.add(part, k.shfl(part, lane, "xor"))
            k.store(l_run, r, part)
            k.store(l_inv, r, k.div(scale_v, part) if fp8 else k.div(1.0, part))
        k.fragment_map(out, lambda e: k.mul(e.value, k.load(l_inv, _row_slot(e))))
        k.fragment_store(out, o, (head, row0, 0))  # a thread's two neighbouring columns in one store
        if lse_out is not None:
            with k.fragment_elements(out, origin=(row0, 0)) as e:
                with k.if_(e.row.lt(lq).and_(e.tile_col.eq(0))):  # one thread and register a row (lane % 4 == 0)
                    slot = _row_slot(e)
                    k.store(lse_out, head * lq + e.row,
                            k.mul(k.add(k.load(m_run, slot), k.log2(k.load(l_run, slot))), LN2))

    if persistent:  # a block per SM walks the (head, query tile) pairs, the producer loading on across them
        k.grid(call("min", tiles_q * bh, persistent))
        with k.loop("walk", blockIdx.x, tiles_q * bh, persistent) as w:
            query_tile(w % tiles_q, w / tiles_q)
            k.mma_zero(out)  # for the next tile (its loop may visit no key tile)
    else:
        k.grid(tiles_q, bh)
        # causal: the longest query tiles (the last) first
        query_tile((tiles_q - 1 - blockIdx.x) if causal else blockIdx.x, name("blockIdx.y"))
    return k


def check_persistent(persistent, warp_specialize, causal, key_blocks) -> None:
    """Refuse by name a ``persistent`` walk the kernel cannot run."""
    if persistent in (0, None):
        return
    if not isinstance(persistent, int) or isinstance(persistent, bool) or not 0 < persistent < 2 ** 31:
        raise AttentionError(f"attention: persistent={persistent!r}: give the number of blocks that walk the query "
                             "tiles (one an SM: 132 on an H200), or 0 for a block a tile")
    if not warp_specialize:
        raise AttentionError(f"attention: persistent={persistent} needs warp_specialize=True: the producer warp group "
                             "loads each tile's Q and runs on into the next tile's K and V")
    if causal or key_blocks is not None:
        what = "causal=True" if causal else "key_blocks"
        raise AttentionError(f"attention: persistent={persistent} with {what}: the query tiles would visit different "
                             "numbers of key tiles, and the walk counts the key loop's slots on across its tiles, "
                             "which needs one trip count; drop persistent")


@contextmanager
def _always() -> Iterator[None]:
    yield


def default_stages(head_dim, dtype, bm, bn) -> int:
    """Slots of the K/V ring: 3 where they fit beside the Q tile (D = 64 and 128), else 2 (D = 256). A third
    slot lets the producer run a whole iteration ahead (measured on the H200 at D = 128: 494 -> 513 TFLOP/s
    at L = 4k, 529 -> 569 at 16k; causal 420 -> 453 and 473 -> 529)."""
    return 3 if _tile_bytes(3, head_dim, dtype, bm, bn) + 2048 <= MAX_SHARED_BYTES else 2


def _tile_bytes(stages, head_dim, dtype, bm, bn) -> int:
    """Shared bytes of ``stages`` slots of the K and V tiles [bn, D] and the Q tile [bm, D]."""
    return (stages * 2 * bn + bm) * head_dim * DTYPE_BYTES[dtype]


def default_bm(head_dim) -> int:
    """Query rows a block: 128 (two consumer warp groups), 192 at D = 64, whose small fragments leave the
    registers for a third group (measured on the H200: 344 -> 375 TFLOP/s at L = 4k)."""
    return 192 if head_dim == 64 else BM


def default_bn(head_dim) -> int:
    """Keys a tile: 128, or 64 at D = 256 (the registers of its output fragment)."""
    return 64 if head_dim == 256 else BN


def ws_registers(groups: int) -> tuple[int, int]:
    """(producer, consumer) registers a thread when warp-specialized: the producer warp group keeps 24
    (it only issues TMA loads), the ``groups`` consumer groups share the rest of the 65536 (REGISTERS_PER_BLOCK), at most 240
    each (setmaxnreg takes multiples of 8)."""
    consumer = min(240, (REGISTERS_PER_BLOCK // 128 - 24) // groups // 8 * 8)
    return 24, consumer


def _row_slot(e):
    """The thread's row slot of a fragment element: two rows a 64-row block (the half (r / 2) % 2 of
    register r), where fragment_reduce keeps a row's result too."""
    return e.block * 2 + (e.register / 2) % 2


def _own_row_sums(k: Kernel, s, l_run, alpha, bn: int, rows: int) -> None:
    """``l = l * alpha + the sum of the thread's own elements of each row of s``: the four lanes of a row
    each keep their partial sum, combined once after the loop (no shuffles per key tile)."""
    half = bn // 2
    with k.loop("ls_r", rows, kind="unroll") as r:
        total = "ls_total"
        k.assign(0.0, dst=total)
        with k.loop("ls_c", bn // 8, kind="unroll") as cc:
            with k.loop("ls_p", 2, kind="unroll") as pp:
                j, h = r / 2, r % 2
                k.reduce(k.load(s, j * half + cc * 4 + h * 2 + pp), kind="serial", combine="sum", dst=total)
        k.store(l_run, r, k.add(k.mul(k.load(l_run, r), k.load(alpha, r)), total))
