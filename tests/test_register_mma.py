"""The register-A warpgroup MMA on the CPU: a float32 fragment rounded and packed into the A operand of the
next MMA (S = Q K^T, P = f(S) in bfloat16/float16 registers, O += P V), executed from the packed registers and
the swizzled bytes, before and after lowering, against float64 numpy; the pack and the register layout against
the shared-memory form; NVRTC; the named refusals; mutations of the ordering rules caught by the checker."""
import ml_dtypes
import numpy as np
import pytest

from cbrules import api
from cbrules.ir.builder import BuildError, Kernel, blockIdx, ceil_div, circular_buffer
from cbrules.ir.mma_layout import fp8_operand_slot, fragment_coords, tma_tile_descriptor
from cbrules.reference.interp import run
from cbrules.reference.interp_mma import pack_pairs, register_operand, wgmma, wgmma_register_a
from cbrules.reference.mma_groups import AccumulatorInFlight, MissingWgmmaFence
from cbrules.rewrite.engine import LoweringError
from cbrules.ir.terms import byte_perm, swizzle_index
from rulekit import write_rules

STORAGE = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16, "float8_e4m3": ml_dtypes.float8_e4m3fn,
           "float8_e5m2": ml_dtypes.float8_e5m2}
SWIZZLE = {32: "32B", 64: "64B", 128: "128B"}
SIZE = {"bfloat16": 2, "float16": 2, "float8_e4m3": 1, "float8_e5m2": 1}


def _two_products(dtype="bfloat16", d=64, bl=64, stages=2, ws=False, scale=0.125, v_layout="nk"):
    """Per 64-row block of Q: for each 64-key tile, S = Q K^T, P = exp(scale * S) (0 outside the keys),
    O += P V with P the register operand (V given as V^T [d, L], K-major; v_layout "kn": V as [L, d],
    MN-major, one panel of d columns)."""
    k = Kernel("pv", block=128)
    m, keys = k.symbol("M"), k.symbol("L")
    v_shape = (d, keys) if v_layout == "nk" else (keys, d)
    q, kt, vt = (k.tensor(nm, shape, dtype) for nm, shape in (("q", (m, d)), ("k", (keys, d)), ("vt", v_shape)))
    o = k.tensor("o", (m, d), "float32")
    size = SIZE[dtype]
    q_map = k.tensor_map(q, box=(64, d), swizzle=SWIZZLE[size * d])
    k_map = k.tensor_map(kt, box=(bl, d), swizzle=SWIZZLE[size * d])
    v_map = k.tensor_map(vt, box=(d, bl) if v_layout == "nk" else (bl, d),
                         swizzle=SWIZZLE[size * (bl if v_layout == "nk" else d)])
    q_t = k.alloc("q_t", "shared", dtype, (64, d), align=1024)
    k_t = k.alloc("k_t", "shared", dtype, (bl, d), align=1024)
    v_t = k.alloc("v_t", "shared", dtype, (d, bl) if v_layout == "nk" else (bl, d), align=1024)
    k.grid(ceil_div(m, 64))
    row0 = blockIdx.x * 64
    s = k.mma_accumulator(64, bl, acc="s")
    out = k.mma_accumulator(64, d, acc="oacc")
    p = k.mma_operand(s, dtype)
    with k.loop("t", ceil_div(keys, bl), circular_buffer=circular_buffer(stages, warp_specialize=ws)) as t:
        k.tma_load(q_map, (row0, 0), q_t)
        k.tma_load(k_map, (t * bl, 0), k_t)
        k.tma_load(v_map, (0, t * bl) if v_layout == "nk" else (t * bl, 0), v_t)
        k.mma(s, q_t, k_t, scale_d=0)
        k.fragment_map(s, lambda e: k.select(e.inside(m, keys), k.exp(k.mul(e.value, scale)), 0.0),
                       origin=(row0, t * bl))
        k.fragment_convert(s, p)
        k.mma(out, p, v_t, b_layout=v_layout)
    k.fragment_store(out, o, (row0, 0))
    return k


def _inputs(shape, dtype, seed=0, v_layout="nk"):
    m, keys, d = shape
    rng = np.random.default_rng(seed)
    st = STORAGE[dtype]
    return {"q": rng.standard_normal((m, d)).astype(st), "k": rng.standard_normal((keys, d)).astype(st),
            "vt": rng.standard_normal((d, keys) if v_layout == "nk" else (keys, d)).astype(st),
            "o": np.full((m, d), np.nan, np.float32)}


def _want(args, dtype, scale=0.125, v_layout="nk"):
    s = args["q"].astype(np.float64) @ args["k"].astype(np.float64).T
    p = np.exp(scale * s).astype(np.float32)
    if SIZE[dtype] == 1:  # satfinite
        p = np.minimum(p, float(ml_dtypes.finfo(STORAGE[dtype]).max))
    p = p.astype(STORAGE[dtype]).astype(np.float64)  # P rounded like the pack
    v = args["vt"].astype(np.float64)
    return p @ (v.T if v_layout == "nk" else v)


@pytest.mark.parametrize("dtype,shape", [("bfloat16", (64, 64, 64)), ("bfloat16", (100, 152, 64)),
                                         ("float16", (100, 152, 64))], ids=str)
def test_register_operand_mma_before_and_after_lowering(dtype, shape):
    args = _inputs(shape, dtype)
    want = _want(args, dtype)
    for kernel in (_two_products(dtype), api.lower(_two_products(dtype))):
        got = run(kernel, args)["o"]
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * np.abs(want).max())


# FP8: the A operand's thread map differs from the accumulator's (four neighbouring columns a register), so
# fragment_convert moves bytes between the lanes of a row; the product must still be exact
@pytest.mark.parametrize("dtype,shape,d,bl", [("float8_e4m3", (64, 64, 128), 128, 64),
                                              ("float8_e4m3", (100, 304, 128), 128, 128),
                                              ("float8_e5m2", (70, 112, 64), 64, 64),
                                              ("float8_e4m3", (64, 96, 64), 64, 32)], ids=str)
def test_fp8_register_operand_mma_before_and_after_lowering(dtype, shape, d, bl):
    args = _inputs(shape, dtype, seed=4)
    want = _want(args, dtype, scale=0.05)
    for kernel in (_two_products(dtype, d=d, bl=bl, scale=0.05), api.lower(_two_products(dtype, d=d, bl=bl, scale=0.05))):
        got = run(kernel, args)["o"]
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * np.abs(want).max())


def test_fp8_register_operand_layout_and_pack():
    # each (row, column) of the [64, 32] A operand has one (thread, register, byte); the four lanes of a row
    # hold its 32 columns four neighbours a register (CUTLASS's ALayout_64x32)
    rows, cols = np.meshgrid(np.arange(64), np.arange(32), indexing="ij")
    t, r, b = fp8_operand_slot(rows, cols)
    assert len(set(zip(t.ravel(), r.ravel(), b.ravel()))) == 64 * 32
    assert (t[0, :4] == 0).all() and (b[0, :4] == [0, 1, 2, 3]).all() and t[0, 4] == 1 and r[0, 16] == 2
    assert t[8, 0] == 0 and r[8, 0] == 1 and t[16, 0] == 32
    # satfinite: past the largest finite value saturates, NaN stays NaN; lo in the low byte
    lo = np.array([1.0, 1000.0, np.nan, -0.0], np.float32)
    hi = np.array([-2.0, -1e9, 0.5, 448.0], np.float32)
    got = pack_pairs(lo, hi, "float8_e4m3")
    assert list(got) == [0xC038, 0xFE7E, 0x307F, 0x7E80]
    assert [hex(byte_perm(0x33221100, 0x77665544, s)) for s in (0x5410, 0x7632, 0x1054, 0x3276)] == \
        ["0x55441100", "0x77663322", "0x11005544", "0x33227766"]


def test_fp8_register_operand_compiles_without_spills():
    ck = api.compile(_two_products("float8_e4m3", d=128, bl=128, scale=0.05))
    text = ck.source.text
    assert "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3" in text and "{%64, %65, %66, %67}" in text
    assert "cvt.rn.satfinite.e4m3x2.f32" in text and "__shfl_sync" in text and "__byte_perm" in text
    r = ck.cubin.resources
    assert r.spill_stores == 0 and r.stack_bytes == 0


def test_narrow_key_tiles_and_three_stages():
    # 32 keys a tile: a 64-byte swizzled V^T row, two k16 steps of registers
    args = _inputs((70, 96, 64), "bfloat16", 1)
    got = run(api.lower(_two_products(bl=32, stages=3)), args)["o"]
    want = _want(args, "bfloat16")
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * np.abs(want).max())


def test_register_operand_with_v_in_its_natural_layout():
    # O += P V with V [L, d] row-major: B MN-major through the transpose bit, no V^T
    args = _inputs((100, 152, 64), "bfloat16", 2, v_layout="kn")
    want = _want(args, "bfloat16", v_layout="kn")
    for kernel in (_two_products(v_layout="kn"), api.lower(_two_products(v_layout="kn"))):
        got = run(kernel, args)["o"]
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * np.abs(want).max())
    assert "cb_wgmma_rs_n64_bf16_tb(" in api.generate(_two_products(v_layout="kn")).text  # compiled on the GPU


def test_the_pack_rounds_to_nearest_even_low_half_first():
    lo = np.array([1.0, 1 + 2 ** -8, 1 + 3 * 2 ** -8, -2.5], np.float32)  # ties go to even
    hi = np.array([-1.0, 3.0, 0.0, 65504.0], np.float32)
    got = pack_pairs(lo, hi, "bfloat16")
    want_lo = lo.astype(ml_dtypes.bfloat16).view(np.uint16).astype(np.uint32)
    want_hi = hi.astype(ml_dtypes.bfloat16).view(np.uint16).astype(np.uint32)
    assert (got == (want_lo | want_hi << 16)).all()
    assert got[1] & 0xFFFF == 0x3F80 and got[2] & 0xFFFF == 0x3F82  # 1 + 2^-8 -> 1.0, 1 + 3*2^-8 -> 1 + 2^-6
    assert (pack_pairs(hi, lo, "float16") >> 16 == lo.astype(np.float16).view(np.uint16)).all()


def test_register_a_equals_the_shared_form():
    # the same A [64, 16] once as packed registers (the accumulator's thread/row map) and once in a 32B-swizzled
    # shared tile through a descriptor: the two wgmma forms give the same product
    rng = np.random.default_rng(3)
    a = rng.standard_normal((64, 16)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((64, 16)).astype(ml_dtypes.bfloat16)
    t, r = np.meshgrid(np.arange(128), np.arange(8), indexing="ij")
    rows, cols = fragment_coords(t, r, 16)
    halves = a[rows, cols].astype(np.float32)
    regs = pack_pairs(halves[:, 0::2], halves[:, 1::2], "bfloat16")
    assert (register_operand(regs, "bfloat16") == a.astype(np.float32)).all()

    def smem(x):  # TMA's 32B-swizzled layout of a [rows, 16] bf16 tile
        flat = x.reshape(-1).view(np.uint16)
        out = np.zeros_like(flat)
        out[swizzle_index(np.arange(flat.size), 2, 32)] = flat
        return out
    acc = np.zeros((128, 32), np.float32)
    db = tma_tile_descriptor(0, 64, 32, "k")
    via_regs = wgmma_register_a(acc, regs, smem(b), db, n=64, dtype="bfloat16", scale_d=0)
    via_smem = wgmma(acc, smem(a), tma_tile_descriptor(0, 64, 32, "k"), smem(b), db, n=64, dtype="bfloat16", scale_d=0)
    assert np.array_equal(via_regs, via_smem)


def test_compiles_with_the_register_form_and_no_spills():
    ck = api.compile(_two_products())
    assert "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16" in ck.source.text
    assert "cb_wgmma_rs_n64_bf16(oacc + 0, s_bf16x2 + 0 + 4," in ck.source.text  # k-step 1: packed registers 4..7
    assert "cvt.rn.bf16x2.f32" in ck.source.text
    r = ck.cubin.resources
    assert r.spill_stores == 0 and r.stack_bytes == 0 and "C7518" not in ck.cubin.log


def test_a_warp_specialized_loop_is_refused_by_name():
    with pytest.raises(LoweringError) as e:
        api.lower(_two_products(ws=True))
    assert e.value.code == "mma-register-a-in-flight" and "s_bf16x2" in str(e.value)
    assert "rules/mma.rules" in str(e.value)


def test_builder_refusals():
    k = Kernel("t", block=128)
    s = k.mma_accumulator(64, 64, acc="s")
    other = k.mma_accumulator(64, 128, acc="other")
    with pytest.raises(BuildError, match="register MMA operand is"):
        k.mma_operand(s, "float32")
    with pytest.raises(BuildError, match="whole k32 chunks"):
        k.mma_operand(k.mma_accumulator(64, 48, acc="s48"), "float8_e4m3")
    p8 = k.mma_operand(s, "float8_e4m3")
    v8 = k.alloc("v8", "shared", "float8_e4m3", (64, 64), align=1024)
    with pytest.raises(BuildError, match="FP8 B K-major only"):
        k.mma(other, p8, v8, b_layout="kn")
    with pytest.raises(BuildError, match=r"must be a shared float8_e4m3 tile \[128, 64\]"):
        k.mma(other, p8, k.alloc("vb", "shared", "bfloat16", (128, 64), align=1024))
    p = k.mma_operand(s)
    with pytest.raises(BuildError, match="not a register operand"):
        k.fragment_convert(other, p)
    v = k.alloc("v", "shared", "bfloat16", (64, 32), align=1024)
    with pytest.raises(BuildError, match=r"must be a shared bfloat16 tile \[64, 64\]"):
        k.mma(s, p, v)
    k2 = Kernel("t2", block=256)
    wide = k2.mma_accumulator(128, 64, acc="wide")
    narrow = k2.mma_accumulator(256, 64, acc="narrow")
    p2 = k2.mma_operand(narrow)
    v2 = k2.alloc("v2", "shared", "bfloat16", (64, 64), align=1024)
    with pytest.raises(BuildError, match="one tile height"):
        k2.mma(wide, p2, v2)


# the mutation: every mma's fence at the top of the iteration, so the conversion into the register operand
# comes after it
FENCE_AT_ENTRY = """
(disable mma-fence-commit)
(graph-rule mut-fence-at-entry
  :doc "fence at the start of the iteration, not right before the mma"
  :phase cb-stage
  :after (cb-one-wait-per-stage mma-slot-operands mma-slot-operand-b)
  :match ((mma ?m :tag (absent))
          (nearest ?L (for) :around ?m))
  :rewrite ((insert-at-entry ?L (wgmma_fence :tag "cb-mma"))
            (insert-after ?m (wgmma_commit :tag "cb-mma"))
            (set ?m :tag "cb-mma")))
"""


@pytest.mark.parametrize("mutation,error", [(FENCE_AT_ENTRY, MissingWgmmaFence),
                                            ("(disable mma-wait-each-group)\n", AccumulatorInFlight)],
                         ids=["fence-before-the-rewrite", "no-wait"])
def test_ordering_mutations_are_caught(tmp_path, mutation, error):
    write_rules(tmp_path / "mut", mutation)
    kg = api.lower(_two_products(), rules=[str(tmp_path / "mut")])
    with pytest.raises(error) as e:
        run(kg, _inputs((64, 64, 64), "bfloat16"))
    if error is MissingWgmmaFence:
        assert "register operand s_bf16x2" in str(e.value)


def test_the_unmutated_rules_pass_with_the_same_harness(tmp_path):
    write_rules(tmp_path / "none", ";; no change\n")
    args = _inputs((64, 64, 64), "bfloat16")
    got = run(api.lower(_two_products(), rules=[str(tmp_path / "none")]), args)["o"]
    want = _want(args, "bfloat16")
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * np.abs(want).max())


# ----------------------------------------------------------------------------- a loop-invariant operand

def _invariant_q(ws=False, wait=True, write_in_loop=False, d=64):
    """O = Q (sum over key tiles t of K_t)^T: Q TMA-loaded once before the loop under a barrier of its own,
    each K tile by the circular-buffered loop."""
    k = Kernel("qk", block=128)
    m, tiles = k.symbol("M"), k.symbol("T")
    q, kt = k.tensor("q", (m, d), "bfloat16"), k.tensor("k", (tiles * 64, d), "bfloat16")
    o = k.tensor("o", (m, 64), "float32")
    q_map = k.tensor_map(q, box=(64, d), swizzle="128B")
    k_map = k.tensor_map(kt, box=(64, d), swizzle="128B")
    q_t = k.alloc("q_t", "shared", "bfloat16", (64, d), align=1024)
    k_t = k.alloc("k_t", "shared", "bfloat16", (64, d), align=1024)
    bar = k.alloc("q_bar", "shared", "mbarrier", (1,))
    k.grid(ceil_div(m, 64))
    row0 = blockIdx.x * 64
    with k.elect_one():
        k.mbarrier_init(bar, 0, count=1)
        k.fence_mbarrier_init()
    k.syncthreads()
    with k.elect_one():
        k.mbarrier_arrive_expect_tx(bar, 0, q_map.box_bytes)
        k.tma_load(q_map, (row0, 0), q_t, bar, slot=0)
    if wait:
        k.mbarrier_wait(bar, 0, parity=0)
    s = k.mma_accumulator(64, 64, acc="s")
    with k.loop("t", tiles, circular_buffer=circular_buffer(2, warp_specialize=ws)) as t:
        k.tma_load(k_map, (t * 64, 0), k_t)
        if write_in_loop:
            k.store(q_t, 0, 0.0)
        k.mma(s, q_t, k_t)
    if not wait:
        k.mbarrier_wait(bar, 0, parity=0)
    with k.elect_one():
        k.mbarrier_inval(bar, 0)
    k.fragment_store(s, o, (row0, 0))
    return k


def _invariant_args(m=100, tiles=5, seed=0):
    rng = np.random.default_rng(seed)
    bf = ml_dtypes.bfloat16
    args = {"q": rng.standard_normal((m, 64)).astype(bf), "k": rng.standard_normal((tiles * 64, 64)).astype(bf),
            "o": np.full((m, 64), np.nan, np.float32), "T": tiles}
    kv = args["k"].astype(np.float64).reshape(tiles, 64, 64).sum(axis=0)
    return args, args["q"].astype(np.float64) @ kv.T


@pytest.mark.parametrize("ws", [False, True])
def test_a_loop_invariant_operand_loaded_once_before_the_loop(ws):
    from cbrules.reference.interp import SCHEDULES
    args, want = _invariant_args()
    kg = api.lower(_invariant_q(ws=ws))
    for schedule in SCHEDULES if ws else SCHEDULES[:1]:
        np.testing.assert_allclose(run(kg, args, schedule=schedule)["o"], want, rtol=1e-5, atol=1e-3)


def test_an_invariant_operand_read_before_its_load_completes_is_caught():
    from cbrules.reference.protocol import RawHazard
    args, _ = _invariant_args()
    with pytest.raises(RawHazard, match="q_t"):
        run(api.lower(_invariant_q(wait=False)), args)


def test_an_operand_the_threads_write_in_the_loop_is_refused_by_name():
    with pytest.raises(LoweringError) as e:
        api.lower(_invariant_q(write_in_loop=True))
    assert e.value.code == "mma-written-operand" and "q_t" in str(e.value)


def test_a_rule_that_breaks_the_pack_or_the_operand_space_is_refused_by_name(tmp_path):
    from cbrules.errors import CbrulesError
    for attr, node, value in (("to", "cvt_pack", '"float32"'), ("a_space", "mma", '"shared"')):
        write_rules(tmp_path / attr, f"""
            (graph-rule mut-{attr}
              :doc "an attribute set to what codegen cannot print"
              :phase cb-stage
              :match (({node} ?n :{attr} (one-of "bfloat16" "register")))
              :rewrite ((set ?n :{attr} {value})))
            """)
        with pytest.raises(CbrulesError) as e:
            api.generate(_two_products(), rules=[str(tmp_path / attr)])
        assert attr in str(e.value) and "Traceback" not in str(e.value)
    # a shared A claimed to be registers
    write_rules(tmp_path / "claim", """
        (graph-rule mut-claim
          :doc "a shared A said to be registers"
          :phase cb-stage
          :match ((mma ?n :a "q_t" :a_space (absent)))
          :rewrite ((set ?n :a_space "register")))
        """)
    with pytest.raises(CbrulesError, match="must be a uint32 register array"):
        api.generate(_two_products(), rules=[str(tmp_path / "claim")])
