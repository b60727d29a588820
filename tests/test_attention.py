"""The built-in attention kernel on the CPU: the interpreter against a float64 numpy reference at small
shapes (outputs NaN-poisoned), lowered without and with warp specialization; the rules' loop-invariant
operand (Q loaded once, its own barrier), the refusals by name, mutations of the new ordering rules
caught by the checker; the CLI's compile (NVRTC) and check. The full grid of the CPU interpreter
(L in 1, 17, 64, 200 x D in 64, 128 x causal x S in 2, 3) is marked slow (CBRULES_SLOW=1 runs it)."""
import re

import numpy as np
import pytest

from cbrules import api
from cbrules.check import Checker
from cbrules.cli import main
from cbrules.kernels import KERNELS
from cbrules.kernels.attention import AttentionError, attention
from cbrules.kernels.specs import attention_reference
from cbrules.reference.hazards import InterpError
from cbrules.reference.interp import run
from cbrules.reference.mma_groups import AccumulatorInFlight
from cbrules.rewrite.engine import LoweringError
from rulekit import write_rules

SPEC = KERNELS["attention"]
TOL = {"bfloat16": 1.5e-2, "float16": 4e-3}  # P and O rounded to the dtype (2^-8 / 2^-11 of values up to ~4)


def _case(bh, lq, lk, d, causal, dtype="bfloat16", lse=True, seed=0, scale=None, **options):
    """(outputs of the lowered kernel, float64 reference) at [bh, lq / lk, d]."""
    spec = SPEC.variant(head_dim=d, causal=causal, lse=lse, scale=scale)
    args = spec.make_inputs((bh, lq, lk), np.random.default_rng(seed), dtype)
    kg = api.lower(attention(head_dim=d, causal=causal, dtype=dtype, lse=lse, scale=scale, **options))
    with np.errstate(divide="ignore", invalid="ignore"):  # lanes of no row (the producer) divide 0 by 0
        got = run(kg, args)
    o, row_lse = attention_reference(args["q"], args["k"], args["v"], scale or d ** -0.5, causal)
    return got, {"o": o, "lse": row_lse}


def _assert_close(got, want, dtype, lse=True):
    o = np.asarray(got["o"]).astype(np.float64)
    assert not np.isnan(o).any(), "an output element was not written"
    np.testing.assert_allclose(o, want["o"], rtol=TOL[dtype], atol=TOL[dtype])
    if lse:
        np.testing.assert_allclose(got["lse"], want["lse"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape,d,causal,dtype,options", [
    ((1, 1, 1), 64, False, "bfloat16", dict(stages=2)),
    ((2, 17, 17), 64, True, "bfloat16", dict(stages=3)),
    ((1, 200, 200), 64, True, "float16", dict(stages=2, warp_specialize=True)),
    ((1, 64, 150), 128, False, "bfloat16", dict(stages=2)),
    ((1, 70, 70), 128, True, "bfloat16", dict(stages=3, warp_specialize=True)),
    ((1, 70, 100), 256, True, "bfloat16", dict(stages=2, warp_specialize=True)),  # 64-key tiles, 4 Q panels
    ((1, 70, 170), 256, True, "bfloat16", dict(stages=2, warp_specialize=True, bn=80)),  # 80-key tiles: 5 k16 steps
    ((2, 100, 250), 128, False, "bfloat16", dict(stages=2, bn=96)),
], ids=str)
def test_attention_matches_numpy(shape, d, causal, dtype, options):
    got, want = _case(*shape, d, causal, dtype, **options)
    _assert_close(got, want, dtype)


def test_softmax_scale_and_no_lse():
    got, want = _case(1, 30, 100, 64, False, lse=False, scale=0.3, stages=2)
    assert "lse" not in got or np.isnan(got["lse"]).all()
    _assert_close(got, want, "bfloat16", lse=False)


@pytest.mark.slow
@pytest.mark.parametrize("length", [1, 17, 64, 200])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("stages", [2, 3])
def test_attention_grid(length, d, causal, stages):
    ws = (length + d + stages) % 2 == 1  # half the grid warp-specialized
    if d == 256 and stages == 3:  # 3 x (K + V) [64, 256] + Q [128, 256]: 256 KB
        with pytest.raises(AttentionError, match="shared memory"):
            attention(head_dim=d, causal=causal, stages=stages)
        return
    got, want = _case(2, length, length, d, causal, seed=length, stages=stages, warp_specialize=ws)
    _assert_close(got, want, "bfloat16")


def _program(**kw) -> str:
    from cbrules.schedule import print_program, schedule
    return print_program(schedule(api.lower(attention(**kw))))


def test_q_is_loaded_once_before_the_key_loop_with_its_own_barrier():
    text = _program(head_dim=128, stages=2)
    once, _, rest = text.partition("for kind=unroll step=1 var=cb_once_")
    assert rest, "no loop of loads once"
    loads_q = [ln for ln in text.splitlines() if "tma_load tmap=q_tmap" in ln]
    assert len(loads_q) == 2  # two 64-column panels, once each
    key_loop = rest[rest.index("var=t "):]
    assert "q_tmap" not in key_loop  # not reloaded per key tile
    barrier = loads_q[0].split("barrier=")[1].split()[0]
    assert f"mbarrier_wait barrier={barrier}" in rest[:rest.index("var=t ")]  # waited on before the loop
    products = [ln for ln in key_loop.splitlines() if " mma " in ln and "a=q_t" in ln]
    assert products and all("mma a_offset=0 b_offset=" in ln and ("slot" in ln or "t % 2" in ln) for ln in products)


def test_warp_specialized_consumers_keep_the_output_product_in_flight_into_the_next_iteration():
    text = _program(head_dim=64, stages=2, warp_specialize=True)
    consumer = text[text.index("part=consumer"):]
    loop = consumer[:consumer.index("post-epilogue")]
    lines = [ln.strip().split(" tag=")[0] if "wgmma" in ln else ln.strip() for ln in loop.splitlines()
             if "wgmma" in ln or " mma " in ln or "var=o_acc_ej" in ln]
    scores, output = lines.index(next(ln for ln in lines if "acc=s " in ln)), \
        lines.index(next(ln for ln in lines if "acc=o_acc " in ln))
    assert lines[scores + 1:scores + 3] == ["wgmma_commit", "wgmma_wait pending=0"]  # S read right after
    assert lines[output + 1:output + 3] == ["wgmma_commit", "wgmma_wait pending=1 stage=war"]  # P V in flight
    rescale = next(i for i, ln in enumerate(lines) if ln.startswith("for kind=unroll step=1 var=o_acc_ej"))
    assert scores < rescale < output and lines[rescale - 1] == "wgmma_wait pending=0"  # waited for there


def test_refusals_by_name():
    for bad, what in ((dict(head_dim=256, bn=128), "registers"), (dict(head_dim=96), "built for 64, 128, 256"),
                      (dict(dtype="float32"), "tensor cores"), (dict(bn=100), "keys a tile"),
                      (dict(bn=80.0), "keys a tile"), (dict(bm=128.0), "query rows"),
                      (dict(head_dim=128.0), "built for"), (dict(head_dim=256, bn=96), "registers"),
                      (dict(scale=-1.0), "positive"), (dict(stages=6, head_dim=128), "shared memory"),
                      (dict(dtype="float8_e4m3", bn=80), "swizzle span"),
                      (dict(dtype="float8_e4m3", head_dim=256, bn=128), "registers")):
        with pytest.raises(AttentionError, match=what):
            attention(**bad)


# FP8: q, k and V^T [BH, D, Lk] in e4m3 / e5m2 with dequantization scales; the reference models the kernel's
# rounding of P to the FP8 type (specs.attention_fp8_reference), so what is left is float32 and the bf16 output
@pytest.mark.parametrize("shape,d,causal,dtype,options", [
    ((2, 70, 112), 64, False, "float8_e4m3", dict(stages=2)),
    ((1, 130, 144), 128, True, "float8_e4m3", dict(stages=2)),
    ((2, 100, 272), 64, False, "float8_e5m2", dict(warp_specialize=True, stages=2)),
    ((1, 200, 208), 128, True, "float8_e4m3", dict(warp_specialize=True, stages=3)),
    ((1, 65, 80), 256, False, "float8_e4m3", dict(warp_specialize=True)),
    ((3, 70, 144), 64, False, "float8_e4m3", dict(warp_specialize=True, persistent=2)),
], ids=str)
def test_fp8_attention_matches_the_model_of_its_rounding(shape, d, causal, dtype, options):
    spec = SPEC.variant(head_dim=d, causal=causal, lse=True).for_dtype(dtype)
    args = spec.make_inputs(shape, np.random.default_rng(sum(shape)), dtype)
    assert args["vt"].shape == (shape[0], d, shape[2]) and args["o"].dtype.name == "bfloat16"
    want = spec.expected(args)
    with np.errstate(divide="ignore", invalid="ignore"):
        got = run(api.lower(attention(head_dim=d, causal=causal, dtype=dtype, lse=True, **options)), args)
    o = np.asarray(got["o"]).astype(np.float64)
    rtol, atol = spec.tolerances(shape, dtype)
    np.testing.assert_allclose(o, want["o"], rtol=rtol, atol=atol)
    np.testing.assert_allclose(got["lse"], want["lse"], rtol=1e-5, atol=1e-5)
    # and within the FP8 inputs' own error of the exact (dequantized) attention: P's rounding is 2^-4 for e4m3
    exact, _ = attention_reference(args["q"].astype(np.float64) * args["scale_q"],
                                   args["k"].astype(np.float64) * args["scale_k"],
                                   args["vt"].astype(np.float64).transpose(0, 2, 1) * args["scale_v"],
                                   d ** -0.5, causal)
    unit = {"float8_e4m3": 2 ** -4, "float8_e5m2": 2 ** -3}[dtype]
    assert np.abs(o - exact).max() <= unit * np.abs(args["vt"].astype(np.float64) * args["scale_v"]).max()


def test_fp8_attention_is_judged_on_the_gpu_against_the_exact_attention():
    # `cbrules run` on the H200 compares o with the exact attention of the dequantized inputs by the norm of the
    # difference (P's FP8 rounding: 2.4x below the bound) and lse within the FP8 sums' drift; what a broken
    # kernel writes (zeros, a scale off, o of another head) is far outside
    spec = SPEC.variant(head_dim=128, causal=True, lse=True).for_dtype("float8_e4m3")
    args = spec.make_inputs((2, 200, 208), np.random.default_rng(2), "float8_e4m3")
    want = spec.expected(args)
    good, what = spec.device_check("o", want["o"], want, args)
    assert good and "relative error 0.0" in what, what
    assert spec.device_check("lse", want["lse"], want, args)[0]
    for wrong in (np.zeros_like(want["o"]), 1.1 * want["o"], want["o"][::-1], np.where(want["o"] > 1, np.nan, want["o"])):
        assert not spec.device_check("o", wrong, want, args)[0]
    assert not spec.device_check("lse", want["lse"] * 1.5, want, args)[0]  # lse in log2 units, say
    assert KERNELS["attention"].variant(head_dim=128).device_check is None  # bfloat16: elementwise tolerances


def test_fp8_attention_checker_shapes_keep_the_persistent_walk_and_the_trip_counts():
    spec = SPEC.variant(head_dim=64, persistent=1).for_dtype("float8_e4m3")
    assert [spec.shape_for_trips(t) for t in (1, 3)] == [(2, 70, 112), (2, 70, 368)]
    assert [spec.trips(spec.shape_for_trips(t)) for t in (1, 2, 5)] == [1, 2, 5]
    causal = SPEC.variant(head_dim=256, causal=True).for_dtype("float8_e4m3")
    assert causal.shape_for_trips(2) == (1, 112, 112)


def test_fp8_attention_scales_are_applied_once_each():
    """Each dequantization scale changes the output as it should (a scale applied twice, or not at all, fails)."""
    spec = SPEC.variant(head_dim=64).for_dtype("float8_e4m3")
    args = spec.make_inputs((1, 64, 64), np.random.default_rng(3), "float8_e4m3")
    kg = api.lower(attention(head_dim=64, dtype="float8_e4m3", stages=2))
    base = np.asarray(run(kg, dict(args))["o"]).astype(np.float64)
    doubled_v = np.asarray(run(kg, {**args, "scale_v": 2 * args["scale_v"]})["o"]).astype(np.float64)
    np.testing.assert_allclose(doubled_v, 2 * base, rtol=2 ** -7)
    # q's and k's scales multiply the scores: doubling one equals doubling the other
    via_q = run(kg, {**args, "scale_q": 2 * args["scale_q"]})["o"]
    via_k = run(kg, {**args, "scale_k": 2 * args["scale_k"]})["o"]
    assert np.array_equal(np.asarray(via_q), np.asarray(via_k))
    assert not np.allclose(np.asarray(via_q).astype(np.float64), base, rtol=1e-2)


def test_fp8_attention_takes_padded_v_rows_and_refuses_short_ones():
    # Lk = 100: V^T's rows (100 bytes) cannot be TMA-loaded; padded with zeros to Lv = 112 they can, and the
    # padding changes nothing (P is 0 there); a V^T with fewer keys than k is refused by name
    spec = SPEC.variant(head_dim=64).for_dtype("float8_e4m3")
    args = spec.make_inputs((1, 70, 100), np.random.default_rng(5), "float8_e4m3")
    kg = api.lower(attention(head_dim=64, dtype="float8_e4m3", stages=2))
    with pytest.raises(Exception, match="pad the innermost extent from 100 to 112"):
        run(kg, dict(args))
    vt = np.zeros((1, 64, 112), args["vt"].dtype)
    vt[:, :, :100] = args["vt"]
    got = np.asarray(run(kg, {**args, "vt": vt})["o"]).astype(np.float64)
    np.testing.assert_allclose(got, spec.expected(args)["o"], rtol=2 ** -7, atol=1e-3)
    with pytest.raises(Exception, match=r"holds fewer keys \(Lv\) than k \(Lk\).*Lv >= Lk is false"):
        run(kg, {**args, "vt": np.ascontiguousarray(vt[:, :, :96])})


def test_fp8_attention_refuses_bad_launch_arguments_by_name():
    import ml_dtypes
    from cbrules.ir.bind import LaunchError
    spec = SPEC.variant(head_dim=64).for_dtype("float8_e4m3")
    args = spec.make_inputs((1, 64, 64), np.random.default_rng(0), "float8_e4m3")
    kg = api.lower(attention(head_dim=64, dtype="float8_e4m3", stages=2))
    for bad, what in (({"scale_v": float("nan")}, "scale_v .* is not finite"),
                      ({"scale_q": float("inf")}, "scale_q .* is not finite"),
                      ({"vt": args["vt"].astype(np.float32).astype(ml_dtypes.float8_e5m2)}, "'vt' is float8_e5m2"),
                      ({"q": args["q"].astype(ml_dtypes.bfloat16)}, "'q' is bfloat16"),
                      ({"vt": np.zeros((1, 32, 64), args["vt"].dtype)}, "'vt' dimension 1 is 32")):
        with pytest.raises(LaunchError, match=what):
            run(kg, {**args, **bad})


@pytest.mark.parametrize("d", [64, 128, 256])
def test_fp8_attention_variants_compile_without_spills(d):
    # NVRTC (no GPU needed): each head dim warp-specialized, causal both, persistent and plain
    for options in (dict(warp_specialize=True), dict(warp_specialize=True, causal=True),
                    dict(warp_specialize=True, persistent=132), dict(stages=2, causal=True)):
        ck = api.compile(attention(head_dim=d, dtype="float8_e4m3", **options))
        r = ck.cubin.resources
        assert r.spill_stores == 0 and r.spill_loads == 0 and r.stack_bytes == 0, (d, options)


def test_fp8_attention_compiles_with_the_k32_register_form():
    text = api.generate(attention(head_dim=128, dtype="float8_e4m3", causal=True, warp_specialize=True)).text
    assert "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3" in text  # S = Q K^T and P V, both k32
    assert "cvt.rn.satfinite.e4m3x2.f32" in text and "__byte_perm" in text and "setmaxnreg" in text


def test_an_operand_no_tma_load_writes_is_still_refused():
    from cbrules.ir.builder import Kernel, circular_buffer, threadIdx
    k = Kernel("t", block=128)
    n = k.symbol("N")
    b = k.tensor("b", (n, 64), "bfloat16")
    b_map = k.tensor_map(b, box=(64, 64), swizzle="128B")
    a_t = k.alloc("a_t", "shared", "bfloat16", (64, 64), align=1024)
    b_t = k.alloc("b_t", "shared", "bfloat16", (64, 64), align=1024)
    acc = k.mma_accumulator(64, 64)
    with k.loop("z", 32, kind="unroll") as z:  # the threads write A: no TMA load, nothing orders it
        k.store(a_t, z * 128 + threadIdx.x, 1.0)
    with k.loop("t", 4, circular_buffer=circular_buffer(2)) as t:
        k.tma_load(b_map, (t * 64, 0), b_t)
        k.mma(acc, a_t, b_t)
    with pytest.raises(LoweringError) as e:
        api.lower(k)
    assert e.value.code == "mma-unbuffered-operand" and "TMA-load it once before the loop" in str(e.value)


def test_a_loop_invariant_tile_loaded_again_is_refused():
    from cbrules.ir.builder import Kernel, blockIdx, circular_buffer
    k = Kernel("t", block=128)
    n = k.symbol("N")
    a, b = k.tensor("a", (n, 64), "bfloat16"), k.tensor("b", (n, 64), "bfloat16")
    a_map, b_map = (k.tensor_map(x, box=(64, 64), swizzle="128B") for x in (a, b))
    a_t = k.alloc("a_t", "shared", "bfloat16", (64, 64), align=1024)
    b_t = k.alloc("b_t", "shared", "bfloat16", (64, 64), align=1024)
    acc = k.mma_accumulator(64, 64)
    k.tma_load(a_map, (blockIdx.x * 64, 0), a_t)
    with k.loop("t", 4, circular_buffer=circular_buffer(2)) as t:
        k.tma_load(b_map, (t * 64, 0), b_t)
        k.tma_load(a_map, (t * 64, 0), a_t)
        k.mma(acc, a_t, b_t)
    with pytest.raises(LoweringError) as e:
        api.lower(k)
    assert e.value.code == "mma-once-operand-refilled"


@pytest.mark.parametrize("mutation,error", [
    ("(disable mma-once-wait)\n", InterpError),  # Q read by the mma before its TMA load completed
    ("(disable mma-wait-read-in-loop)\n", AccumulatorInFlight),  # the scores read while the mma runs
], ids=["no-wait-for-q", "no-wait-for-the-scores"])
def test_ordering_mutations_are_caught(tmp_path, mutation, error):
    write_rules(tmp_path / "mut", mutation)
    spec = SPEC.variant(head_dim=64)
    args = spec.make_inputs((1, 64, 130), np.random.default_rng(1), "bfloat16")
    kg = api.lower(attention(head_dim=64, stages=2, warp_specialize=True), rules=[str(tmp_path / "mut")])
    with pytest.raises(error), np.errstate(divide="ignore", invalid="ignore"):
        run(kg, args)


RELEASE_BEFORE_THE_WAIT = """
(phase mut :after cb-stage)
(graph-rule release-before-the-wait
  :doc "mutation: the previous slot released before the wait that completes the previous iteration's groups"
  :phase mut
  :match ((for ?L :annotations (:circular_buffer (:warp_specialize true)))
          (if ?r :child-of ?L :tag "cb-mma-release-prev")
          (wgmma_wait ?w :pending 0 :child-of ?L)
          (next ?w ?r))
  :rewrite ((move ?r :before ?w)))
"""


def test_the_previous_slot_is_released_at_the_scores_wait_and_not_before_it(tmp_path):
    text = _program(head_dim=64, stages=2, warp_specialize=True)
    consumer = text[text.index("part=consumer"):]
    loop = [ln.strip() for ln in consumer[:consumer.index("post-epilogue")].splitlines()]
    wait = loop.index("wgmma_wait pending=0 tag=cb-mma")  # the scores' wait, right after their commit
    assert loop[wait - 1] == "wgmma_commit tag=cb-mma-waited"
    assert loop[wait + 1] == "if pred=t > 0 stage=war tag=cb-mma-release-prev"
    assert re.fullmatch(r"mbarrier_arrive barrier=cb_empty_\d+ slot=\(t \+ 1\) % 2", loop[wait + 2]), loop[wait + 2]
    # released one statement earlier, while the previous P V may still read V: the producer's refill races it
    write_rules(tmp_path / "mut", RELEASE_BEFORE_THE_WAIT)
    spec = SPEC.variant(head_dim=64)
    args = spec.make_inputs((1, 64, 390), np.random.default_rng(1), "bfloat16")
    kg = api.lower(attention(head_dim=64, stages=2, warp_specialize=True), rules=[str(tmp_path / "mut")])
    with pytest.raises(InterpError, match="refills v_t"), np.errstate(divide="ignore", invalid="ignore"):
        run(kg, args)


def test_the_checker_passes_a_few_trip_counts():
    spec = SPEC.variant(head_dim=64)
    checker = Checker(dtype="bfloat16")
    for trips in (0, 1, 3):
        res = checker.check(spec, trips, 2)
        assert res.status == "ok", res.detail


def test_compile_holds_the_asked_for_pieces(capsys):
    assert main(["compile", "attention", "--head-dim", "128", "--causal", "--warp-specialize"]) == 0
    captured = capsys.readouterr()
    out = captured.out  # the CUDA; the summary goes to stderr
    assert "wgmma.mma_async" in out and "setmaxnreg" in out and "bar.sync" in out
    assert "0/0 B spill stores/loads, 0 B stack" in captured.err


def test_cli_refuses_unknown_variants(capsys):
    assert main(["compile", "matmul_tc", "--head-dim", "64"]) != 0
    assert "takes no such parameters" in capsys.readouterr().err
    assert main(["compile", "attention", "--head-dim", "96"]) != 0
    assert "head_dim=96" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_check_passes():
    assert main(["check", "attention", "--head-dim", "64", "--stages", "2"]) == 0


def test_the_sliding_window_example_passes_the_checker(capsys):
    assert main(["check", "examples/sliding_window_attention.py", "--stages", "2"]) == 0
    assert "1 ok, 0 failed" in capsys.readouterr().out


def test_a_window_narrower_than_a_tile_masks_whole_tiles_of_some_rows():
    # window 40: the first key tile a query tile visits holds no kept key for its last rows, whose
    # maximum stays -inf there (the guard keeps their exponents from -inf - -inf)
    from cbrules.ir.terms import call
    window = 40

    def key_blocks(row0, key_tiles):
        return call("max", row0 - (window - 1), 0) / 128, key_tiles, lambda key0: key0.lt(row0 + 128 - window)
    kg = api.lower(attention(head_dim=64, causal=True, stages=2, mask_mod=lambda e: e.col.gt(e.row - window),
                             key_blocks=key_blocks))
    spec = SPEC.variant(head_dim=64, causal=True)
    args = spec.make_inputs((1, 300, 300), np.random.default_rng(5), "bfloat16")
    with np.errstate(divide="ignore", invalid="ignore"):
        got = run(kg, args)
    far = np.arange(300)[None, :] <= np.arange(300)[:, None] - window
    want, _ = attention_reference(args["q"], args["k"], args["v"], 0.125, True, masked=far)
    _assert_close(got, {"o": want}, "bfloat16", lse=False)


def _decaying_sum(ws=True):
    """o = sum over t of 0.5^(T-1-t) a_t b_t^T: o halved at the top of each iteration, before its mma (a
    loop-carried accumulator: the mma of iteration t is in flight until the halving of t + 1)."""
    from cbrules.ir.builder import Kernel, ceil_div, circular_buffer
    k = Kernel("decay", block=128)
    n = k.symbol("N")
    a, b = k.tensor("a", (n, 64), "bfloat16"), k.tensor("b", (n, 64), "bfloat16")
    c = k.tensor("c", (64, 64), "float32")
    a_map, b_map = (k.tensor_map(x, box=(64, 64), swizzle="128B") for x in (a, b))
    a_t = k.alloc("a_t", "shared", "bfloat16", (64, 64), align=1024)
    b_t = k.alloc("b_t", "shared", "bfloat16", (64, 64), align=1024)
    acc = k.mma_accumulator(64, 64)
    k.grid(1)
    with k.loop("t", ceil_div(n, 64), circular_buffer=circular_buffer(2, warp_specialize=ws)) as t:
        k.tma_load(a_map, (t * 64, 0), a_t)
        k.tma_load(b_map, (t * 64, 0), b_t)
        k.fragment_map(acc, lambda e: k.mul(e.value, 0.5))
        k.mma(acc, a_t, b_t)
    k.fragment_store(acc, c, (0, 0))
    return k


@pytest.mark.parametrize("mutation", ["", "(disable mma-wait-before-carried-read)\n"], ids=["rules", "no-wait"])
def test_a_loop_carried_accumulator_is_waited_for_before_its_next_access(tmp_path, mutation):
    write_rules(tmp_path / "r", mutation or ";; no change\n")
    rng = np.random.default_rng(2)
    import ml_dtypes
    args = {"a": rng.standard_normal((192, 64)).astype(ml_dtypes.bfloat16),
            "b": rng.standard_normal((192, 64)).astype(ml_dtypes.bfloat16), "c": np.full((64, 64), np.nan, np.float32)}
    kg = api.lower(_decaying_sum(), rules=[str(tmp_path / "r")])
    if mutation:
        with pytest.raises(AccumulatorInFlight), np.errstate(divide="ignore", invalid="ignore"):
            run(kg, args)
        return
    with np.errstate(divide="ignore", invalid="ignore"):
        got = run(kg, args)["c"]
    a64, b64 = (args[x].astype(np.float64).reshape(3, 64, 64) for x in ("a", "b"))
    want = sum(0.5 ** (2 - t) * a64[t] @ b64[t].T for t in range(3))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)


def test_the_consumers_free_the_slots_before_loading_q_once():
    """cb-ws-free-slots-before-once-loads: the producer's first K/V refills need not wait for Q to land."""
    text = _program(head_dim=128, warp_specialize=True)
    consumer = text[text.index("tag=cb-consumers"):]
    frees = consumer.index("mbarrier_arrive barrier=cb_empty_")
    q_load = consumer.index("tma_load tmap=q_tmap")
    q_wait = re.search(r"mbarrier_wait barrier=(cb_full_\d+) slot=0 parity=0", consumer)
    assert frees < q_load < q_wait.start()
    assert f"mbarrier_init barrier={q_wait.group(1)}" in consumer[frees:q_load]  # moved past the once loop's init
