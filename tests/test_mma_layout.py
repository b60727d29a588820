"""B in both layouts on the tensor cores, on the CPU: ``k.mma(..., b_layout="kn")`` reads a [BK, BN] tile
(B given as a row-major [K, N]) MN-major through the instruction's transpose bit, its panels [BK, W] one TMA
box each. The lowered kernel interpreted from the swizzled bytes against numpy at ragged shapes (both
layouts, both 16-bit types, every panel span); the CUDA's descriptors and transpose immediate against the
shared model (:func:`cbrules.ir.mma_layout.b_tile_descriptor`, ``TRANSPOSE``) and its NVRTC compile;
mutations of the transpose bit and of LBO/SBO caught as wrong results; every refusal by name."""
import re
from dataclasses import replace

import ml_dtypes
import numpy as np
import pytest

from cbrules import api
from cbrules.check import Checker
from cbrules.codegen.errors import CodegenError
from cbrules.cli import main
from cbrules.ir import mma_layout
from cbrules.ir.builder import BuildError, Kernel, ceil_div, circular_buffer
from cbrules.ir.mma_layout import MMA_K, TRANSPOSE, MmaLayoutError, b_tile_descriptor, mn_major_span
from cbrules.kernels import KERNELS
from cbrules.kernels.matmul_tc import MatmulTileError, matmul_tc
from cbrules.kernels.specs import UnsupportedVariantError, with_b_layout
from cbrules.reference.interp import run
from cbrules.reference.interp_mma import MmaIssueError
from cbrules.reference.mma_groups import SwizzleMismatch
from cbrules.rewrite.engine import LoweringError
from rulekit import write_rules
from test_mma_check import WRONG_SWIZZLE

NP = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
WS = dict(warp_specialize=True, registers=(40, 232))
SPEC = KERNELS["matmul_tc"]
KN = with_b_layout(SPEC, "kn")


def _problem(m, n, kk, dtype, b_layout, seed=0, out_dtype=None):
    """(inputs with c poisoned, float64 reference): b is [K, N] for kn, [N, K] for nk."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, kk)).astype(NP[dtype])
    b = rng.standard_normal((kk, n)).astype(NP[dtype])
    want = a.astype(np.float64) @ b.astype(np.float64)
    return {"a": a, "b": b if b_layout == "kn" else np.ascontiguousarray(b.T),
            "c": np.full((m, n), np.nan, NP.get(out_dtype or dtype, np.float32))}, want


def _interpreted(kernel, args):
    return run(api.lower(kernel), args)["c"].astype(np.float64)


def _close(got, want, dtype, kk):
    rtol, atol = SPEC.tolerances((0, 0, kk), dtype)
    assert not np.isnan(got).any()  # poisoned: every element written
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


# (bm, bn, bk, groups, out_dtype): B spans 128 (bn 128, 64 columns a panel), 64 (bn 96: 3 panels of 32;
# a float32 output, whose 32-column store boxes divide 96) and 32 (bn 48)
TILES = {"128x128x64": (128, 128, 64, 2, None), "64x96x32": (64, 96, 32, 1, "float32"),
         "64x48x16": (64, 48, 16, 1, None), "64x64x64": (64, 64, 64, 1, None)}
CASES = [("kn", "bfloat16", "128x128x64"), ("kn", "float16", "128x128x64"), ("kn", "bfloat16", "64x96x32"),
         ("kn", "float16", "64x48x16"), ("kn", "float16", "64x64x64"), ("nk", "bfloat16", "64x96x32"),
         ("nk", "float16", "64x48x16"), ("nk", "bfloat16", "64x64x64")]


@pytest.mark.parametrize("b_layout, dtype, tile", CASES, ids=["-".join(c) for c in CASES])
def test_interpreted_from_the_swizzled_bytes_equals_numpy(b_layout, dtype, tile):
    """Ragged M, N and K (partial and whole panels past N, K past the last tile zero-filled), two or
    more K tiles so that every stage slot is refilled; bn == bk (64x64x64) is given explicitly."""
    bm, bn, bk, groups, out_dtype = TILES[tile]
    m, n, kk = bm + 6, bn + 24, 3 * bk - 8
    args, want = _problem(m, n, kk, dtype, b_layout, out_dtype=out_dtype)
    k = matmul_tc(stages=2, dtype=dtype, out_dtype=out_dtype, bm=bm, bn=bn, bk=bk, groups=groups, b_layout=b_layout)
    _close(_interpreted(k, args), want, out_dtype or dtype, kk)


def test_warp_specialized_persistent_kn_equals_numpy():
    args, want = _problem(130, 200, 120, "bfloat16", "kn", seed=1)
    k = matmul_tc(stages=3, bm=64, bn=64, bk=32, groups=1, persistent=3, b_layout="kn", **WS)
    _close(_interpreted(k, args), want, "bfloat16", 120)


def test_checker_compares_lowered_unlowered_and_numpy_for_kn():
    """What ``cbrules check matmul_tc --b-layout kn --stages 3`` runs, for one trip count past S; one
    checker for both layouts keeps their kernels and inputs apart (one name, two variants)."""
    checker = Checker(blocks="sample", dtype="float16")
    for spec in (KN, SPEC):
        res = checker.check(spec, 4, 3)
        assert res.ok and res.status == "ok", f"{spec.factory}: {res.status} {res.detail}"


def test_nk_spec_is_the_built_in_and_kn_changes_inputs_reference_and_kernel():
    assert with_b_layout(SPEC, "nk") is SPEC
    args = KN.make_inputs((70, 40, 24), np.random.default_rng(0), "bfloat16")
    assert args["b"].shape == (24, 40)
    np.testing.assert_allclose(KN.expected(args)["c"], args["a"].astype(np.float64) @ args["b"].astype(np.float64))
    b = next(p for p in KN.build((70, 40, 24), dtype="bfloat16", stages=2).graph.kernel()["params"] if p.name == "b")
    assert tuple(map(str, b.shape)) == ("K", "N")
    with pytest.raises(UnsupportedVariantError, match="matmul_tc only"):
        with_b_layout(KERNELS["single_dim"], "kn")


# ----------------------------------------------------------------------------- the CUDA against the model

_DESC_B = re.compile(r"cb_wgmma_desc\(cb_b \+ (\d+), (\d+), (\d+)\)")


@pytest.mark.parametrize("bn, bk", [(256, 64), (96, 32), (48, 16)])
def test_generated_b_descriptors_and_transpose_bit_are_the_models(bn, bk):
    """Each B descriptor the CUDA builds is :func:`b_tile_descriptor`'s for its k-step (LBO = one panel
    [BK, W], SBO = 8 K rows of W * 2 bytes, start + 16 K rows a k-step), and the instruction's tnspB
    immediate is ``TRANSPOSE["mn"]``; K-major kernels keep their helper and immediates."""
    out = "float32" if bn == 96 else None  # its 32-column store boxes divide 96
    text = api.generate(matmul_tc(stages=2, bm=64, bn=bn, bk=bk, groups=1, b_layout="kn", out_dtype=out)).text
    span = mn_major_span(bn)
    calls = _DESC_B.findall(text)
    assert calls and len(calls) % (bk // MMA_K) == 0
    for i, (off, hi, lo) in enumerate(calls):
        want = b_tile_descriptor(0, bn, bk, span, "mn", i % (bk // MMA_K))
        assert (int(hi) << 32 | int(lo)) | (int(off) >> 4) == want.encode(), i
        assert want.lbo == bk * span and want.sbo == 8 * span
    assert f"m64n{bn}k16.f32.bf16.bf16" in text and f"p, 1, 1, 0, {TRANSPOSE['mn']};" in text
    assert f"cb_wgmma_n{bn}_bf16_tb(" in text and f"void cb_wgmma_n{bn}_bf16(" not in text
    nk = api.generate(matmul_tc(stages=2, bm=64, bn=bn, bk=bk, groups=1, out_dtype=out)).text
    assert "p, 1, 1, 0, 0;" in nk and "_tb" not in nk


def test_cli_compiles_kn_with_nvrtc_without_spills_or_serialized_wgmma(capsys):
    assert main(["compile", "matmul_tc", "--b-layout", "kn", "--stages", "4", "--warp-specialize",
                 "--registers", "40,232"]) == 0
    captured = capsys.readouterr()
    out = captured.out  # the CUDA; the summary goes to stderr
    assert "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16" in out and "p, 1, 1, 0, 1;" in out
    assert "0/0 B spill stores/loads" in captured.err
    # four boxes [64, 64] of B a stage, each to its own panel of the slot
    assert len(re.findall(r"cb_tma_load\(cb_smem_addr\(b_tile \+ ", out)) == 4


def test_float16_kn_variant_compiles_without_spills():
    ck = api.compile(matmul_tc(stages=3, dtype="float16", bn=128, bk=32, b_layout="kn"))
    r = ck.cubin.resources
    assert r.spill_stores == 0 and r.spill_loads == 0 and "C7518" not in ck.cubin.log
    assert "m64n128k16.f32.f16.f16" in ck.source.text


# ----------------------------------------------------------------------------- mutations: wrong results

def _kn_case(bn=128, bk=32, k_tiles=2):
    args, want = _problem(70, bn + 24, k_tiles * bk - 8, "bfloat16", "kn", seed=4)
    return matmul_tc(stages=2, bm=64, bn=bn, bk=bk, groups=1, b_layout="kn"), args, want


def _differs(got, want):
    bad = ~np.isclose(got, want, rtol=1e-2, atol=1e-2)
    return bad.mean()


@pytest.mark.parametrize("bn, bk", [(128, 32), (64, 64)])
def test_control_of_the_mutations_is_right(bn, bk):
    k, args, want = _kn_case(bn, bk)
    _close(_interpreted(k, args), want, "bfloat16", 2 * bk - 8)


def test_a_wrong_transpose_bit_gives_a_wrong_result(monkeypatch):
    """The shared fact flipped: codegen prints tnspB 0 for the MN-major tile and the interpreter reads
    it K-major, so the product differs from numpy (as on the GPU)."""
    monkeypatch.setitem(TRANSPOSE, "mn", 0)
    # one K tile: read K-major, [64, 64] panels reach into the second slot, which no load writes (no
    # hazard to name): a wrong product
    k, args, want = _kn_case(64, 64, k_tiles=1)
    assert "p, 1, 1, 0, 0;" in api.generate(k).text
    assert _differs(_interpreted(k, args), want) > 0.5
    k, args, want = _kn_case(128, 32)  # read K-major, this one runs past its slot: named, not a crash
    with pytest.raises(MmaIssueError, match=r"reads b_tile\[\d+\], outside its 8192 elements.*LBO and SBO"):
        _interpreted(k, args)


@pytest.mark.parametrize("wrong", ["lbo-sbo-swapped", "lbo-half-a-panel", "sbo-one-row"])
def test_a_wrong_leading_or_stride_byte_offset_gives_a_wrong_result(monkeypatch, wrong):
    """The MN-major descriptor's fields wrong where codegen and the interpreter take them from."""
    right = mma_layout.tma_tile_descriptor
    change = {"lbo-sbo-swapped": lambda d: replace(d, lbo=d.sbo, sbo=d.lbo),
              "lbo-half-a-panel": lambda d: replace(d, lbo=d.lbo // 2),
              "sbo-one-row": lambda d: replace(d, sbo=d.sbo // 8)}[wrong]

    def mutated(start, box_rows, span, major, kstep=0):
        d = right(start, box_rows, span, major, kstep)
        return change(d) if major == "mn" else d
    monkeypatch.setattr(mma_layout, "tma_tile_descriptor", mutated)
    k, args, want = _kn_case()
    text = api.generate(k).text
    fields = b_tile_descriptor(0, 128, 32, 128, "mn").encode()
    assert f"{fields >> 32}, {fields & 0xFFFFFFFF})" in text  # the mutated fields are what the CUDA prints
    assert _differs(_interpreted(k, args), want) > 0.2


def test_an_mma_reading_its_b_panels_in_another_swizzle_is_named(tmp_path):
    # test_mma_check's mutation of A's swizzle, on B's panels
    # the engine's re-check after cb-stage would refuse it first: what is tested here is the interpreter
    write_rules(tmp_path / "mut", "(disable mma-reject-swizzle-mn-b mma-reject-mn-b-box)\n" + WRONG_SWIZZLE.replace(":swizzle ", ":b_swizzle "))
    k, args, _ = _kn_case()
    with pytest.raises(SwizzleMismatch, match=r"reads b_tile\[\d+\] as a tile with 64B swizzle, but the TMA load "
                                              r"that wrote it used 128B swizzle"):
        run(api.lower(k, rules=[tmp_path / "mut"]), args)


@pytest.mark.parametrize("major, span", [('"k"', 128), ('"mn"', 48), ('"nm"', 128)])
def test_an_mma_node_with_a_b_layout_it_cannot_read_is_refused_by_name(tmp_path, major, span):
    """A rule that leaves B's major-ness and span disagreeing: the interpreter and codegen refuse it."""
    write_rules(tmp_path / "mut", f"""
        (disable mma-reject-swizzle-mn-b mma-reject-mn-b-box)  ; else the engine's re-check after cb-stage refuses it first
        (graph-rule mut-b-major
          :doc "B's layout attributes changed after the checks"
          :phase cb-stage
          :after (mma-fence-commit)
          :match ((mma ?m :b_swizzle 128 :tag "cb-mma"))
          :rewrite ((set ?m :b_major {major} :b_swizzle {span})))
        """)
    k, args, _ = _kn_case()
    kg = api.lower(k, rules=[tmp_path / "mut"])
    with pytest.raises(MmaIssueError, match=f"an mma with b_major {major[1:-1]!r} and b_swizzle {span}"):
        run(kg, args)
    with pytest.raises(CodegenError, match="mma into acc: (an MN-major B tile|b_swizzle|b_major)"):
        api.generate(k, rules=[tmp_path / "mut"])


# ----------------------------------------------------------------------------- refusals

def _kn_kernel(box=(64, 64), swizzle="128B", tile=None, bn=128):
    k = Kernel("t", block=128)
    m, n, kk = k.symbol("M"), k.symbol("N"), k.symbol("K")
    a, b = k.tensor("a", (m, kk), "bfloat16"), k.tensor("b", (kk, n), "bfloat16")
    a_map = k.tensor_map(a, box=(64, 64), swizzle="128B")
    b_map = k.tensor_map(b, box=box, swizzle=swizzle)
    a_t = k.alloc("a_t", "shared", "bfloat16", (64, 64), align=1024)
    b_t = k.alloc("b_t", "shared", "bfloat16", (64, bn), align=1024)
    acc = k.mma_accumulator(64, bn)
    with k.loop("t", ceil_div(kk, 64), circular_buffer=circular_buffer(2)) as t:
        k.tma_load(a_map, (0, t * 64), a_t)
        for p in range(bn // box[1] if tile is None else 1):
            k.tma_load(b_map, (t * 64, p * box[1]), b_t, offset=p * box[0] * box[1], tile=tile)
        k.mma(acc, a_t, b_t, b_layout="kn")
    return k


def test_the_refusal_kernel_lowers_as_written():
    kg = api.lower(_kn_kernel())
    assert {kg[n].get("b_major") for n in kg.nodes("mma")} == {"mn"}  # in each part of the pipelined loop


@pytest.mark.parametrize("kw, code, needle", [
    (dict(swizzle="64B", box=(64, 32)), "mma-swizzle", "panels whose rows are 128-byte swizzle spans, but"),
    (dict(box=(32, 64)), "mma-b-panel", "reads b_t as an MN-major tile of panels (64, 64)"),
    (dict(tile=(64, 128)), "mma-b-panel", "loads tile (64, 128) in boxes (64, 64)"),
])
def test_b_panels_loaded_otherwise_than_the_mma_reads_them_are_refused_by_rule(kw, code, needle):
    with pytest.raises(LoweringError) as e:
        api.lower(_kn_kernel(**kw))
    assert e.value.code == code and needle in str(e.value) and "rules/mma.rules" in str(e.value), str(e.value)


def test_builder_refusals():
    k = Kernel("t", block=128)
    a = k.alloc("a_t", "shared", "bfloat16", (64, 32), align=1024)
    b_nk = k.alloc("b_nk", "shared", "bfloat16", (128, 32), align=1024)
    b_kn = k.alloc("b_kn", "shared", "bfloat16", (32, 128), align=1024)
    acc = k.mma_accumulator(64, 128)
    with pytest.raises(BuildError, match=r"b_layout='nt': give 'nk' .* or 'kn'"):
        k.mma(acc, a, b_nk, b_layout="nt")
    with pytest.raises(BuildError, match=r"and b \[128, 32\] .*; b is the kn layout's tile: pass b_layout='kn'"):
        k.mma(acc, a, b_kn)
    with pytest.raises(BuildError, match=r"and b \[32, 128\] .*B given as \[K, N\]\); b is the nk layout's"):
        k.mma(acc, a, b_nk, b_layout="kn")
    acc8 = k.mma_accumulator(64, 8, acc="acc8")
    b8 = k.alloc("b8", "shared", "bfloat16", (32, 8), align=1024)
    with pytest.raises(BuildError, match="bn = 8 columns: its panels are 16, 32 or 64 columns"):
        k.mma(acc8, a, b8, b_layout="kn")
    with pytest.raises(MmaLayoutError, match="multiple of 16"):
        mn_major_span(24)
    assert [mn_major_span(n) for n in (256, 192, 96, 32, 48, 16)] == [128, 128, 64, 64, 32, 32]


def test_matmul_tc_and_cli_refusals(capsys):
    with pytest.raises(MatmulTileError, match="b_layout='tn'"):
        matmul_tc(b_layout="tn")
    with pytest.raises(MatmulTileError, match="b_layout='kn' with bn=8"):
        matmul_tc(b_layout="kn", bn=8)
    assert main(["compile", "single_dim", "--b-layout", "kn", "--quiet"]) == 1
    assert "applies to the built-in matmul_tc only" in capsys.readouterr().err
    assert main(["compile", "matmul_tc", "--b-layout", "mn"]) == 2  # argparse: not a choice
