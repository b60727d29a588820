"""The vocabulary of node kinds: which attributes each op takes and what it reads and writes.

This table is the single source of truth for the graph checker (``verify``), the builder, the
dependence analysis and, later, the rule checker's "unknown op / attribute" messages.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from .terms import Term

SCOPES = ("kernel", "for", "if", "else")
# how deep scopes may nest (verify refuses deeper; codegen, the simplifier and the interpreter walk
# them recursively); a kernel as built gets half, so that the scopes rules wrap around stay within it
MAX_SCOPE_DEPTH = 200
BUILT_SCOPE_DEPTH = MAX_SCOPE_DEPTH // 2
LOOP_KINDS = ("serial", "unroll", "unswitch", "vectorize",
              "thread-x", "thread-y", "thread-z", "block-x", "block-y", "block-z", "warpgroup")
SPACES = ("global", "shared", "register")
DTYPES = {"float32": "float", "float64": "double", "int32": "int", "int64": "long long",
          "uint32": "unsigned", "uint64": "unsigned long long", "mbarrier": "unsigned long long",
          "float16": "cb_half", "bfloat16": "cb_bf16", "float8_e4m3": "cb_e4m3", "float8_e5m2": "cb_e5m2"}
DTYPE_BYTES = {"float32": 4, "float64": 8, "int32": 4, "int64": 8, "uint32": 4, "uint64": 8, "mbarrier": 8,
               "float16": 2, "bfloat16": 2, "float8_e4m3": 1, "float8_e5m2": 1}
# Storage-only types: tensors and shared buffers hold them, registers compute in float32 (a load
# converts up, a store rounds to nearest even), as the tensor cores' neighbours do on Hopper.
HALF_DTYPES = ("float16", "bfloat16")
# The 8-bit floats of Hopper's FP8 tensor cores (OCP FP8: e4m3 without infinities, largest 448; e5m2
# with them, largest 57344). A store rounds to nearest even and saturates to the largest finite value
# (cvt.rn.satfinite), so an out-of-range result never becomes NaN or infinity; NaN stays NaN.
FP8_DTYPES = ("float8_e4m3", "float8_e5m2")
STORAGE_DTYPES = HALF_DTYPES + FP8_DTYPES


def compute_dtype(dtype: str) -> str:
    """The register type a load of ``dtype`` produces: float32 for the storage types, else ``dtype``."""
    return "float32" if dtype in STORAGE_DTYPES else dtype
# the transcendental functions added for epilogues and softmax (issue 29): float registers only
MATH = ("tanh", "erf", "exp2", "log2", "sigmoid")
FLOAT_REGISTERS = ("float32", "float64")
UNARY = ("exp", "log", "sqrt", "rsqrt", "neg", "abs") + MATH + ("exp2_approx",)
# ops that compute in float32 registers only (a PTX instruction of that type, no double form)
FLOAT32_ONLY = ("exp2_approx",)
# What each math op computes in CUDA and how far from the exact result it may land (float32; float64
# registers call the double function). The bounds are the CUDA C Programming Guide's (appendix
# "Mathematical Functions", without --use_fast_math, which cbrules never passes; NVIDIA found them by
# extensive, not exhaustive, tests). For the MATH ops the interpreter computes the exact result rounded to
# the register's type (sigmoid: each step of its formula), so a GPU result lies within these of it.
MATH_ERRORS = {
    "exp": "expf(x): at most 2 ulp (double exp: 1 ulp)",
    "log": "logf(x): at most 1 ulp (double log: 1 ulp); log(0) = -inf, log(x < 0) = NaN",
    "sqrt": "sqrtf(x): correctly rounded; sqrt(x < 0) = NaN",
    "rsqrt": "rsqrtf(x) = 1/sqrt(x): at most 2 ulp (double rsqrt: 1 ulp); rsqrt(0) = inf, rsqrt(x < 0) = NaN",
    "tanh": "tanhf(x): at most 2 ulp (double tanh: 2 ulp); tanh(+-inf) = +-1",
    "erf": "erff(x): at most 2 ulp (double erf: 2 ulp); erf(+-inf) = +-1",
    "exp2": "exp2f(x) = 2**x: at most 2 ulp (double exp2: 1 ulp); overflows to inf from 128, "
            "underflows through the denormals to 0 from -150",
    "exp2_approx": "ex2.approx.ftz.f32 (float32 registers only): the special function unit's 2**x, the "
                   "instruction exp2f wraps without its rescaling of denormal results: at most 2 ulp (exp2f's bound) "
                   "where the result is at least 2**-126; below -126 the result flushes to +0 (exp2f: denormals to "
                   "-150); inf from 128",
    "log2": "log2f(x): at most 1 ulp (double log2: 1 ulp); log2(0) = -inf, log2(x < 0) = NaN",
    "sigmoid": "1.0f / (1.0f + expf(-x)): at most 5.5 ulp as bounded from expf's 2 ulp and the IEEE add and "
               "division (a relative error r costs up to r * 2**24 ulp); 1 above about 16.6, and 0 below -88.72, "
               "where expf(-x) overflows and the exact value is a denormal below 2**-126",
}
BINARY = ("add", "sub", "mul", "div", "max", "min")
REDUCE_COMBINE = ("sum", "max", "min")
# a warp shuffle's modes, as CUDA names them: __shfl_xor_sync, __shfl_down_sync, __shfl_up_sync, __shfl_sync
SHFL_MODES = ("xor", "down", "up", "idx")
WARP_SIZE = 32
SYNC_TOKEN = "sync"
# Attributes any node may carry: rules use them to tag nodes (e.g. a pipeline stage) for later rules.
COMMON_ATTRIBUTES = ("stage", "tag", "part")
# an mbarrier_wait's :backoff: nanoseconds to sleep between polls (PTX nanosleep sleeps at most ~1 ms)
MAX_BACKOFF_NS = 1_000_000  # the pseudo-resource that orders memory operations around barriers
# an mbarrier_wait's :timeout (nanoseconds of %globaltimer before it traps): at most about 18 minutes
MAX_WAIT_TIMEOUT_NS = 1 << 40
# L2 eviction priorities a TMA copy's :cache_hint names (createpolicy.fractional.L2::evict_*), and
# the L2 promotion of a tensor map (CU_TENSOR_MAP_L2_PROMOTION_*) a tma_load or tma_store may ask for
CACHE_HINTS = ("evict_first", "evict_last", "normal")
L2_PROMOTIONS = ("none", "64B", "128B", "256B")


@dataclass(frozen=True)
class OpSpec:
    """Required and optional attributes of one op; ``terms`` names the attributes holding terms."""

    required: tuple[str, ...]
    optional: tuple[str, ...] = ()
    terms: tuple[str, ...] = ()
    category: str = "compute"  # scope | memory | compute | sync
    defaults: Mapping[str, Any] = field(default_factory=dict)

    @property
    def attributes(self) -> tuple[str, ...]:
        return self.required + self.optional + COMMON_ATTRIBUTES


_BAR = ("barrier", "slot")
OPS: dict[str, OpSpec] = {
    # requires: (predicate term over symbols, message[, code]) entries the launcher checks before a launch
    # min_blocks: the kernel's __launch_bounds__ minimum of resident blocks (1 caps registers at entry,
    # which setmaxnreg needs)
    "kernel": OpSpec(("name", "params", "block", "grid"), ("symbols", "requires", "min_blocks"), category="scope"),
    "for": OpSpec(("var", "start", "stop", "step", "kind"), ("annotations",),
                  ("start", "stop", "step"), "scope", {"kind": "serial", "step": 1}),
    "if": OpSpec(("pred",), (), ("pred",), "scope"),
    # the else branch of the enclosing if: at most one, a direct child of the if (its place among the
    # if's children does not matter; code generation puts it after the then branch)
    "else": OpSpec((), (), (), "scope"),
    "alloc": OpSpec(("buf", "space", "dtype", "shape"), ("align",), category="memory"),
    # a tma_load without a barrier asks the rules to arrange its completion (circular buffering);
    # box is the hardware box, tile the logical tile it serves (a multiple of the box)
    # swizzle: the span in bytes (32, 64, 128) of the tensor map's swizzle pattern, absent for none
    # cache_hint: the copy's L2 eviction priority (an .L2::cache_hint policy); l2_promotion: the
    # promotion its tensor map is encoded with (every copy through one map must agree)
    "tma_load": OpSpec(("tmap", "coords", "dst", "offset", "bytes", "box"), ("barrier", "slot", "tile",
                       "circular_buffer", "swizzle", "cache_hint", "l2_promotion"), ("coords", "offset", "slot"),
                       "memory"),
    # wait="read" (default): the store's bulk group is committed and waited for until its source may
    # be reused; wait="none": committed only, a later tma_store_wait covers it
    "tma_store": OpSpec(("tmap", "coords", "src", "offset"), ("wait", "cache_hint", "l2_promotion"),
                        ("coords", "offset"), "memory",
                        {"wait": "read"}),
    # cp.async.bulk.wait_group[.read] pending: this thread's bulk stores, all but the newest `pending`
    # groups, have finished reading shared memory (read) or are complete
    "tma_store_wait": OpSpec(("pending", "read"), (), (), "sync"),
    "load": OpSpec(("dst", "src", "index", "dtype"), (), ("index",), "memory"),
    # tile: {tensor, map, coords, index, box, dtype}: this element is element `index` of the box of
    # tensor map `map` at `coords`; the tma-store rules then stage the tile and store it by TMA
    "store": OpSpec(("dst", "index", "value"), ("tile",), ("index", "value"), "memory"),
    # one vector access: count contiguous elements (4, 8 or 16 bytes) of src from src_index go to dst
    # from dst_index; one side is a register array, both indices are multiples of count
    "copy": OpSpec(("dst", "dst_index", "src", "src_index", "count"), (), ("dst_index", "src_index"), "memory"),
    "assign": OpSpec(("dst", "value", "dtype"), (), ("value",)),
    # a block reduction with bar_id/count syncs through named barrier bar_id over threads 0..count-1 only
    "reduce": OpSpec(("dst", "src", "kind", "combine", "dtype"), ("bar_id", "count"), ("src",)),
    "fma": OpSpec(("dst", "args", "dtype"), (), ("args",)),
    # the row statistics of a block in ONE numerically stable reduction: each thread's (mean, M2) of the
    # n elements it took (args; M2 = sum of (x - mean)^2, n the same for every thread) merged pairwise
    # over the block (Chan et al.): dst = the block's mean, dst_m2 its M2 (variance = M2 / (n * threads));
    # bar_id/count as a reduce's
    "block_stats": OpSpec(("dst", "dst_m2", "args", "n", "dtype"), ("bar_id", "count"), ("args",)),
    "mbarrier_init": OpSpec(_BAR + ("count",), (), ("slot",), "sync"),
    "mbarrier_arrive": OpSpec(_BAR, (), ("slot",), "sync"),
    "mbarrier_arrive_expect_tx": OpSpec(_BAR + ("bytes",), (), ("slot",), "sync"),
    # the wait mode: backoff (an int or a term) nanoseconds asleep between polls, doubling up to
    # backoff_max; spin polls before the first sleep; suspend_hint the try_wait's suspend-time hint;
    # timeout: trap with a message once the wait has lasted that many nanoseconds
    "mbarrier_wait": OpSpec(_BAR + ("parity",), ("backoff", "backoff_max", "spin", "suspend_hint", "timeout"),
                            ("slot", "parity", "backoff"), "sync"),
    "mbarrier_inval": OpSpec(_BAR, (), ("slot",), "sync"),
    "syncthreads": OpSpec((), (), (), "sync"),
    "fence_proxy_async": OpSpec((), (), (), "sync"),
    "fence_mbarrier_init": OpSpec((), (), (), "sync"),
    # id: an int, or a term (a warp group's own barrier: base + its index), 0..15 when it runs; kept out of
    # the term attributes, so that an int id stays an int in the graph
    "bar_sync": OpSpec(("id", "count"), (), (), "sync"),
    # bar.arrive id, count: this thread counts towards the barrier's next opening without waiting for it
    # (a hand-over: the threads that bar_sync on it go once count threads arrived or synced)
    "bar_arrive": OpSpec(("id", "count"), (), (), "sync"),
    # setmaxnreg.inc / .dec: a warp group's register budget becomes count (warp specialization)
    "setmaxnreg": OpSpec(("action", "count"), (), (), "sync"),
    # Warpgroup MMA (tensor cores, sm_90a). One node is a whole tile step C[BM,BN] (+)= A[BM,BK] @ B[BK,BN]
    # on `groups` consumer warp groups: A is shared [BM, BK] and B shared [BN, BK] (both K-major, K
    # contiguous), each row BK * 2 bytes = the `swizzle` span (32, 64 or 128) and laid out by a TMA load
    # with that swizzle; a_offset / b_offset are element offsets (stage slots). Warp group g
    # (threadIdx.x / 128) computes rows [g*BM/groups, (g+1)*BM/groups) as BM/groups/64 blocks of 64 rows;
    # block j, k-step s (BK/16 of them) is one wgmma.mma_async.m64n{BN}k16.f32.{dtype} with
    # descriptors at A + (g*BM/groups + 64j) rows + 32s bytes and B + 32s bytes. acc is a float32
    # register array of (BM/groups/64) * BN/2 elements a thread: block j's fragment at j*BN/2, register
    # r of it holding row 64j + 16*(warp%4) + lane/4 + 8*((r/2)%2), column 8*(r/4) + 2*(lane%4) + r%2.
    # scale_d (a term): 0 = the first k-step overwrites acc, else it accumulates (later k-steps always
    # accumulate). The node only ISSUES: acc and the shared tiles are in use until a wgmma_wait covers
    # its group (wgmma_commit); acc's registers are read as they were at the last wgmma_fence.
    # b_major "mn" (absent: "k"): B is a shared [BK, BN] tile instead, MN-major (N contiguous), read with
    # the transpose bit: BN / W panels [BK, W] one after the other, each TMA-loaded with the b_swizzle
    # span (W * 2 bytes, W = 16, 32 or 64) -- see cbrules.ir.mma_layout.b_tile_descriptor.
    # a_space "register": A is a packed register fragment (fragment_convert: uint32 pairs of 2-byte values in
    # the accumulator's thread/row map, a 64 x 16 chunk = 4 registers a thread), a_offset a register index;
    # absent: the shared tile above
    # dtype is A's type and B's unless b_dtype (absent: dtype) says otherwise: a mixed FP8 pair (e4m3 x e5m2);
    # FP8 tiles are K-major and one instruction covers k32 (32 bytes of a row, as k16 of a 2-byte type)
    "mma": OpSpec(("acc", "a", "b", "shape", "groups", "dtype", "swizzle"),
                  ("a_offset", "b_offset", "scale_d", "b_major", "b_swizzle", "a_space", "group0", "b_dtype"),
                  ("a_offset", "b_offset", "scale_d", "group0"), "memory", {"a_offset": 0, "b_offset": 0, "scale_d": 1}),
    # wgmma.fence.sync.aligned: register and shared-memory writes before it are seen by the mma after it
    "wgmma_fence": OpSpec((), (), (), "sync"),
    # wgmma.commit_group.sync.aligned: the warp group's mma issued since the last commit form one group
    "wgmma_commit": OpSpec((), (), (), "sync"),
    # wgmma.wait_group.sync.aligned pending: all but the newest `pending` groups of this warp group are
    # complete (their accumulators written, their shared tiles read)
    "wgmma_wait": OpSpec(("pending",), (), (), "sync"),
    # dst (a uint32 register) = args[0] and args[1] rounded to nearest even to `to` (bfloat16, float16) and
    # packed, args[0] in the low half (cvt.rn.bf16x2.f32 / f16x2): a register MMA operand's pair
    "cvt_pack": OpSpec(("dst", "args", "dtype", "to"), (), ("args",)),
}
for _op in UNARY + BINARY:
    OPS[_op] = OpSpec(("dst", "args", "dtype"), (), ("args",))
# dst = args[0] ? args[1] : args[2], per thread (a ragged tail's neutral element without an if per lane)
OPS["select"] = OpSpec(("dst", "args", "dtype"), (), ("args",))
# a warp shuffle with the full mask: dst = args[0] as the lane picked by mode from args[1] computed it, within
# segments of `width` lanes (a power of two up to 32); every lane of the warp must execute it together
OPS["shfl"] = OpSpec(("dst", "args", "mode", "width", "dtype"), (), ("args",), "compute", {"mode": "xor", "width": 32})

# one sentence per op, for `cbrules ops` and the rule author's guide (rules/README.md)
OP_DOCS: dict[str, str] = {
    "kernel": "the root: name, parameters, block and grid; requires holds (predicate, message) pairs the "
              "launcher checks before every launch; min_blocks is the second __launch_bounds__ value",
    "for": "a loop: var runs from start to stop (exclusive) by step; kind is serial, unroll, unswitch, vectorize "
           "or a thread/block axis, or warpgroup (each warp group of the block runs the body with var = start + "
           "step * its index, threadIdx.x / 128, where below stop); annotations carry requests such as circular_buffer",
    "if": "a scope its threads enter only where pred holds",
    "else": "the last child of an if: a scope the threads where the if's pred fails enter (one role of a "
            "warp-specialized kernel each)",
    "alloc": "a buffer buf in space global, shared or register, of dtype and shape (align in bytes)",
    "tma_load": "a TMA copy of one box of tensor map tmap at coords into dst + offset; without a barrier the "
                "rules arrange its completion (circular_buffer asks them to pipeline it); cache_hint "
                "(evict_first, evict_last, normal) is its L2 eviction priority, l2_promotion (none, 64B, 128B, "
                "256B) its tensor map's",
    "tma_store": "a TMA copy of one box from shared src + offset to tensor map tmap at coords; wait is what the "
                 "issuing thread waits for after it (read, or none: a later tma_store_wait); cache_hint and "
                 "l2_promotion as a tma_load's",
    "tma_store_wait": "the issuing thread waits until at most pending bulk stores are outstanding (read: "
                      "until their sources may be reused)",
    "load": "dst = src[index] (global, shared or register memory)",
    "store": "dst[index] = value; tile (tensor map, coords, element) marks an element of an output tile the "
             "rules may write with one TMA store",
    "copy": "dst[dst_index + k] = src[src_index + k] for k < count, as one 4-, 8- or 16-byte vector access "
            "(a register array on one side; the vectorize rules make it from a vectorize loop's element accesses)",
    "assign": "dst = value",
    "reduce": "dst = the combine (sum, max, min) of src over the block (kind block) or into dst (kind serial); "
              "with bar_id, over the first count threads through named barrier bar_id",
    "fma": "dst = args[0] * args[1] + args[2]",
    "block_stats": "dst, dst_m2 = the mean and M2 (sum of squared deviations) over the block of the threads' "
                   "own (mean, M2) = args, each of n elements, merged pairwise (no cancellation, one block "
                   "sync); with bar_id, over the first count threads through named barrier bar_id",
    "mbarrier_init": "the elected thread initialises barrier[slot] to expect count arrivals",
    "mbarrier_arrive": "this thread arrives on barrier[slot]",
    "mbarrier_arrive_expect_tx": "this thread arrives on barrier[slot] and arms it for bytes of TMA traffic",
    "mbarrier_wait": "wait until the phase of barrier[slot] with parity completes; backoff (an int or a term, "
                     "0..1000000) sleeps that many nanoseconds between polls, doubling up to backoff_max; spin "
                     "polls first without sleeping; suspend_hint is try_wait's suspend-time hint in ns; timeout "
                     "traps with a message after that many ns",
    "mbarrier_inval": "invalidate barrier[slot] so its memory may be reused",
    "syncthreads": "a block-wide barrier (__syncthreads)",
    "fence_proxy_async": "order this thread's generic-proxy shared memory accesses before later TMA accesses",
    "fence_mbarrier_init": "make barrier initialisation visible to the async proxy",
    "bar_sync": "a named barrier id for count threads",
    "bar_arrive": "arrive on named barrier id (of count threads) without waiting: the threads that bar_sync on "
                  "it pass once count threads have arrived",
    "setmaxnreg": "raise (action inc) or lower (action dec) this warp group's register cap to count",
    "select": "dst = args[1] where the predicate args[0] holds, else args[2] (per thread)",
    "mma": "issue acc (+)= a @ b on the tensor cores (wgmma m64nNk16): a tile of shape (BM, BN, BK) over groups "
           "consumer warp groups, A [BM, BK] and B [BN, BK] K-major shared tiles (+ a_offset / b_offset) with "
           "swizzle bytes a row, acc a float32 register fragment; scale_d 0 overwrites; done at a wgmma_wait; "
           "b_major mn: B a [BK, BN] MN-major tile of panels [BK, b_swizzle / 2] (the transpose bit); group0: "
           "the block's warp group that computes the tile's first rows (absent: 0); FP8 dtypes: m64nNk32, K-major "
           "only, b_dtype B's type where it differs from A's",
    "wgmma_fence": "order earlier register and shared writes before the warp group's next mma",
    "wgmma_commit": "close the group of mma this warp group issued since its last commit",
    "wgmma_wait": "wait until at most pending of this warp group's committed mma groups are incomplete",
    "cvt_pack": "dst (uint32) = args[0] and args[1] rounded to `to` (bfloat16 or float16), packed with args[0] in the "
                "low half: a pair of a register MMA operand; to an FP8 type (saturating), two bytes in the low half",
    "shfl": "dst = args[0] of another lane of this warp (all 32 lanes execute it together, full mask): lane "
            "^ args[1] (mode xor), lane + args[1] (down), lane - args[1] (up) or lane args[1] (idx), within "
            "segments of width lanes; a lane whose source falls outside its segment keeps its own value",
    **{u: f"dst = {u}(args[0])" + (f" ({'float registers; ' if u in MATH else ''}{MATH_ERRORS[u]})"
                                    if u in MATH_ERRORS else "") for u in UNARY},
    **{b: f"dst = {b}(args[0], args[1])" for b in BINARY},
}
COMMON_DOC = "stage, tag and part: any node may carry them; rules tag nodes with them for later rules"


def term_values(op: str, attrs: Mapping[str, Any]) -> list[Term]:
    """Every term held by a node (tuples of terms flattened)."""
    out: list[Term] = []
    for key in OPS[op].terms:
        v = attrs.get(key)
        if isinstance(v, Term):
            out.append(v)
        elif isinstance(v, tuple):
            out.extend(x for x in v if isinstance(x, Term))
    return out


def effects(op: str, attrs: Mapping[str, Any]) -> tuple[frozenset[str], frozenset[str]]:
    """(reads, writes) of one node, as resource names: ``reg:v``, ``mem:buf``, ``sync``.

    Memory operations read the sync token and synchronisation writes it, so memory traffic never
    moves across a barrier, while independent loads between two barriers stay unordered.
    """
    reads = {f"reg:{n}" for t in term_values(op, attrs) for n in t.names()}
    writes: set[str] = set()
    spec = OPS[op]
    if "dst" in attrs and spec.category == "compute":
        writes.add(f"reg:{attrs['dst']}")
        if op == "reduce" and attrs.get("kind") == "serial":
            reads.add(f"reg:{attrs['dst']}")  # an accumulation reads its own previous value
    if op == "load":
        writes.add(f"reg:{attrs['dst']}")
        reads |= {f"mem:{attrs['src']}", SYNC_TOKEN}
    elif op == "store":
        writes.add(f"mem:{attrs['dst']}")
        reads.add(SYNC_TOKEN)
    elif op == "copy":
        writes.add(f"mem:{attrs['dst']}")
        reads |= {f"mem:{attrs['src']}", SYNC_TOKEN}
    elif op == "tma_load":
        writes.add(f"mem:{attrs['dst']}")
        reads |= {f"mem:{attrs['tmap']}", SYNC_TOKEN}
        if attrs.get("barrier"):
            reads.add(f"mem:{attrs['barrier']}")
    elif op == "tma_store":
        writes.add(f"mem:{attrs['tmap']}")
        reads |= {f"mem:{attrs['src']}", SYNC_TOKEN}
    elif op == "mma":  # reads both tiles, accumulates into acc (a register array)
        reads |= {f"mem:{attrs['a']}", f"mem:{attrs['b']}", f"mem:{attrs['acc']}", SYNC_TOKEN}
        writes.add(f"mem:{attrs['acc']}")
    elif op == "reduce" and attrs.get("kind") == "block":
        writes.add(SYNC_TOKEN)  # a block reduction synchronises the block
    elif op == "block_stats":
        writes |= {f"reg:{attrs['dst_m2']}", SYNC_TOKEN}
    elif spec.category == "sync":
        writes.add(SYNC_TOKEN)
        reads.add(SYNC_TOKEN)
        if "barrier" in attrs:
            writes.add(f"mem:{attrs['barrier']}")
    # frozen: the graph keeps these very objects as the node's effects (frozenset() of one is itself)
    return frozenset(reads), frozenset(writes)


# every attribute effects() reads, per op: nodes whose values under these keys are the same objects
# have the same effects (the graph remembers each node's effects by them)
EFFECT_KEYS: dict[str, tuple[str, ...]] = {
    op: ("op", *spec.terms, "dst", "src", "tmap", "barrier", "kind", "a", "b", "acc", "dst_m2")
    for op, spec in OPS.items()}


def conflicts(a: tuple[set[str], set[str]], b: tuple[set[str], set[str]]) -> bool:
    """True when the two effect sets must keep their program order (RAW, WAR or WAW)."""
    (ra, wa), (rb, wb) = a, b
    return bool(wa & (rb | wb) or ra & wb)


def nearest_conflicts(seq: Sequence[tuple[set[str], set[str]]], at: int,
                      mine: tuple[set[str], set[str]]) -> tuple[set[int], set[int]]:
    """Positions in ``seq`` (effects of siblings in program order) that a node placed at ``at``
    must follow and precede: per resource, the nearest writer on each side and, when the node
    writes, the readers between it and that writer. Everything farther away is already ordered
    through those, so the depends edges stay linear in the number of siblings. The siblings are
    read outward from ``at`` only until every resource has met its writer (``seq`` may compute
    each item on demand)."""
    reads, writes = mine
    before: set[int] = set()
    after: set[int] = set()
    for span, out in ((range(at - 1, -1, -1), before), (range(at, len(seq)), after)):
        open_ = reads | writes  # resources still looking for their nearest writer on this side
        for i in span:
            if not open_:
                break
            their_reads, their_writes = seq[i]
            written = open_ & their_writes
            if written or writes and open_ & writes & their_reads:
                out.add(i)
            open_ -= written
    return before, after


def nearest_conflicts_among(seq: Sequence[int], effects_of: Callable[[int], tuple[set[str], set[str]]], at: int,
                            mine: tuple[set[str], set[str]], users: tuple[Mapping[str, set[int]], Mapping[str, set[int]]],
                            label: Mapping[int, int], crowded: int = 64) -> tuple[set[int], set[int]]:
    """:func:`nearest_conflicts` for a node placed at position ``at`` among siblings ``seq`` (ids in
    program order; ``effects_of`` reads a sibling's effects), returning sibling ids, and reading for
    each resource only the siblings that use it (``users``: resource -> sibling ids that use it, and
    that write it; ``label``: sibling id -> a number that orders the siblings as ``seq`` does; ids
    without one are not placed yet and are ignored). A resource used by more than ``crowded``
    siblings (the sync token) is scanned for as before: its writers are near."""
    reads, writes = mine
    using, writing = users
    before: set[int] = set()
    after: set[int] = set()
    crowd: set[str] = set()
    cut = label[seq[at]] if at < len(seq) else None  # the siblings labelled below it come before
    for r in reads | writes:
        who = using.get(r)
        if not who or r not in writes and not writing.get(r):
            continue  # no writer to find, and readers order nothing unless the new node writes it
        if len(who) > crowded:
            crowd.add(r)
            continue
        placed = sorted((label[c], c) for c in who if c in label)
        i = len(placed) if cut is None else bisect.bisect_left(placed, (cut,))
        for span, out in ((reversed(placed[:i]), before), (placed[i:], after)):
            for _, c in span:
                their_reads, their_writes = effects_of(c)
                if r in their_writes:
                    out.add(c)
                    break
                if r in their_reads and r in writes:
                    out.add(c)
    if crowd:
        lazy = _Lazy(seq, effects_of)
        b, a = nearest_conflicts(lazy, at, (reads & crowd, writes & crowd))
        before.update(seq[i] for i in b)
        after.update(seq[i] for i in a)
    return before, after


class _Lazy:
    """Siblings' effects as a sequence read on demand (a scan stops at the nearest writers)."""

    def __init__(self, seq: Sequence[int], effects_of: Callable[[int], tuple[set[str], set[str]]]):
        self.seq, self.effects_of = seq, effects_of

    def __len__(self) -> int:
        return len(self.seq)

    def __getitem__(self, i: int) -> tuple[set[str], set[str]]:
        return self.effects_of(self.seq[i])


class DependenceTracker:
    """Builds depends edges for siblings added in program order, in time linear in their number:
    per resource it remembers the last writer and the readers since, which are exactly the
    nearest conflicting predecessors of the next node."""

    def __init__(self) -> None:
        self.writer: dict[str, int] = {}
        self.readers: dict[str, list[int]] = {}

    def add(self, node: int, effects_of_node: tuple[set[str], set[str]]) -> set[int]:
        """Record ``node``; return the earlier siblings it must follow."""
        reads, writes = effects_of_node
        preds: set[int] = set()
        for r in reads | writes:
            if r in self.writer:
                preds.add(self.writer[r])
        for r in writes:
            preds.update(self.readers.get(r, ()))
        for r in reads - writes:
            self.readers.setdefault(r, []).append(node)
        for r in writes:
            self.writer[r] = node
            self.readers[r] = []
        preds.discard(node)
        return preds
