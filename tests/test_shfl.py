"""k.shfl, the full-mask warp shuffle: the builder's checks, the interpreter against a numpy model of
CUDA's documented lane selection, the divergence it refuses, the generated CUDA and NVRTC (the GPU
runs are in test_shfl_gpu.py)."""
import numpy as np
import pytest

from cbrules import api
from cbrules.ir.builder import BuildError, Kernel, threadIdx
from cbrules.ir.verify import GraphError
from cbrules.reference.interp import DivergentShuffle, run

MODES = ("xor", "down", "up", "idx")


def want_shfl(v: np.ndarray, b: np.ndarray, mode: str, width: int) -> np.ndarray:
    """CUDA's __shfl_*_sync(0xffffffff, v, b, width) lane by lane, as the programming guide words it."""
    out = v.copy()
    for t in range(v.size):
        lane, warp = t % 32, t - t % 32
        first = lane - lane % width  # the first lane of this lane's segment
        bb = int(b[t]) % 32
        if mode == "xor":
            src = lane ^ bb
            ok = src < first + width  # an earlier segment may be read, a later one not
        elif mode == "down":
            src, ok = lane + bb, lane % width + bb < width
        elif mode == "up":
            src, ok = lane - bb, lane % width - bb >= 0
        else:
            src, ok = first + bb % width, True
        if ok:
            out[t] = v[warp + src]
    return out


def shuffle_kernel(mode: str, width: int, lane, dtype: str = "float32", block: int = 64) -> Kernel:
    """out[t] = shfl(x[t], lane) per thread; ``lane`` an int, or "b" to read it from tensor b."""
    k = Kernel("shuffle", block=block)
    x, out = k.tensor("x", (block,), dtype), k.tensor("out", (block,), dtype)
    if lane == "b":
        lane = k.load(k.tensor("b", (block,), "int32"), threadIdx.x)
    k.store(out, threadIdx.x, k.shfl(k.load(x, threadIdx.x), lane, mode=mode, width=width, dtype=dtype))
    return k


def _inputs(dtype="float32", n=64, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n).astype(np.float32) if dtype == "float32" else \
        rng.integers(-2 ** 31, 2 ** 31 - 1, n).astype(np.int32)
    return {"x": x, "out": np.zeros(n, x.dtype), "b": rng.integers(0, 64, n).astype(np.int32)}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("width", (32, 16, 4, 1))
def test_each_mode_and_width_reads_the_documented_lane(mode, width):
    a = _inputs()
    for lane in sorted({0, min(1, width - 1), width // 2, width - 1}):
        got = run(shuffle_kernel(mode, width, lane), {k: a[k] for k in ("x", "out")})["out"]
        np.testing.assert_array_equal(got, want_shfl(a["x"], np.full(64, lane), mode, width), err_msg=f"lane {lane}")


@pytest.mark.parametrize("mode", MODES)
def test_per_lane_operands_wrap_to_5_bits_and_int32_moves_every_bit(mode):
    a = _inputs("int32", seed=3)  # b holds 0..63: values past 31 read only their low 5 bits
    got = run(shuffle_kernel(mode, 8, "b", dtype="int32"), a)["out"]
    np.testing.assert_array_equal(got, want_shfl(a["x"], a["b"], mode, 8))
    assert got.dtype == np.int32


def group_max(first: int, second: int) -> Kernel:
    """Each thread's out = the max of its 4-lane group through two butterfly steps (xor first, second)."""
    k = Kernel("group_max", block=64)
    x, out = k.tensor("x", (64,)), k.tensor("out", (64,))
    v = k.load(x, threadIdx.x, dst="v")
    for m in (first, second):
        k.max(v, k.shfl(v, m, width=4), dst="v")
    k.store(out, threadIdx.x, v)
    return k


def test_butterfly_over_lanes_1_and_2_is_each_groups_max_and_a_wrong_mask_is_caught():
    a = _inputs(seed=5)
    want = np.repeat(a["x"].reshape(-1, 4).max(axis=1), 4)
    ins = {k: a[k] for k in ("x", "out")}
    np.testing.assert_array_equal(run(group_max(1, 2), ins)["out"], want)
    np.testing.assert_array_equal(run(group_max(2, 1), ins)["out"], want)
    # a reduction that skips a lane: xor 1 twice combines pairs only, so some group's max is lost
    skipped = run(group_max(1, 1), ins)["out"]
    assert not np.array_equal(skipped, want)
    assert (skipped != want).sum() >= 16  # most groups lose their max to one of the lanes not read


def test_a_shuffle_inside_a_warp_splitting_if_is_refused_by_name():
    k = Kernel("split", block=64)
    x, out = k.tensor("x", (64,)), k.tensor("out", (64,))
    v = k.load(x, threadIdx.x)
    with k.if_(threadIdx.x.lt(40)):  # warp 0 whole, warp 1 split at lane 8
        k.store(out, threadIdx.x, k.shfl(v, 1))
    with pytest.raises(DivergentShuffle, match=r"8 of the 32 lanes of warp 1 \(thread 40 does not reach it"):
        run(k, {k2: v2 for k2, v2 in _inputs().items() if k2 != "b"})


def test_a_shuffle_inside_an_if_of_whole_warps_runs():
    k = Kernel("whole", block=64)
    x, out = k.tensor("x", (64,)), k.tensor("out", (64,))
    v = k.load(x, threadIdx.x)
    with k.if_(threadIdx.x.ge(32)):
        k.store(out, threadIdx.x, k.shfl(v, 5, mode="idx"))
    a = _inputs()
    got = run(k, {"x": a["x"], "out": np.zeros(64, np.float32)})["out"]
    np.testing.assert_array_equal(got[32:], np.full(32, a["x"][37]))
    np.testing.assert_array_equal(got[:32], 0)


def test_a_block_ending_in_a_partial_warp_is_refused_before_codegen():
    with pytest.raises(GraphError, match=r"shfl-warps.*48 threads ends in a partial warp"):
        api.generate(shuffle_kernel("xor", 32, 1, block=48))


@pytest.mark.parametrize("kwargs, match", [
    (dict(mode="bfly"), "mode 'bfly' is not one of xor, down, up, idx"),
    (dict(width=3), "width 3 is not a power of two in 1..32"),
    (dict(width=64), "width 64 is not a power of two"),
    (dict(lane=32), r"lane 32 is outside 0..31"),
    (dict(lane=4, width=4), r"lane 4 is outside 0..3 \(width 4\)"),
    (dict(lane=-1), r"lane -1 is outside"),
    (dict(lane=True), "lane must be an int"),
    (dict(lane=1.5), "lane must be an int"),
    (dict(dtype="bfloat16"), "a bfloat16 register"),
])
def test_builder_refuses_bad_shuffles_by_name(kwargs, match):
    k = Kernel("bad", block=32)
    args = {"lane": 1, **kwargs}
    with pytest.raises(BuildError, match=match):
        k.shfl(1.0, **args)


def test_codegen_prints_the_full_mask_intrinsics_and_nvrtc_compiles_them():
    k = Kernel("every_shuffle", block=64)
    x, xi, b = k.tensor("x", (64,)), k.tensor("xi", (64,), "int32"), k.tensor("b", (64,), "int32")
    out, outi, outd = k.tensor("out", (64,)), k.tensor("outi", (64,), "int32"), k.tensor("outd", (64,), "float64")
    v, vi, lane = k.load(x, threadIdx.x), k.load(xi, threadIdx.x), k.load(b, threadIdx.x)
    acc = k.assign(0.0, dst="acc")
    for mode in MODES:
        k.add(acc, k.shfl(v, lane, mode=mode, width=16), dst="acc")
        k.store(outi, threadIdx.x, k.shfl(vi, 3, mode=mode, dtype="int32"))
    k.store(outd, threadIdx.x, k.shfl(k.assign(acc, dtype="float64"), 1, dtype="float64"))
    k.store(out, threadIdx.x, acc)
    text = api.generate(k).text
    for fn, cast in (("__shfl_xor_sync", "int"), ("__shfl_down_sync", "unsigned"), ("__shfl_up_sync", "unsigned"),
                     ("__shfl_sync", "int")):
        assert f"{fn}(0xffffffffu, (float)(" in text and f"{fn}(0xffffffffu, (int)(" in text
        assert f", ({cast})(" in text
    assert "__shfl_xor_sync(0xffffffffu, (double)(" in text
    api.compile(k)  # NVRTC declares the intrinsics without headers


def test_rules_match_and_set_a_shuffles_attributes_and_a_bad_width_names_the_rule(tmp_path):
    from cbrules.rewrite import engine, rulefile
    from cbrules.sexpr import RuleError
    from rulekit import write_rules

    def lower(body, folder):
        write_rules(tmp_path / folder, "(phases p)\n" + body)
        return engine.lower(group_max(1, 2).graph, rulefile.load([tmp_path / folder])).graph

    rule = '(graph-rule w :phase p :match ((shfl ?s :mode "xor" :width 4)) :rewrite ((set ?s :width {})))'
    out = lower(rule.format(8), "widen")
    assert [out[n]["width"] for n in out.nodes("shfl")] == [8, 8]
    # a literal is checked where the rule file says it (rules check refuses it with its position)
    with pytest.raises(RuleError, match=r"test.rules:\d+:\d+: shfl :width .*3 is not a power of two"):
        lower(rule.format(3), "bad")
    with pytest.raises(RuleError, match=r"op 'shfl' has no attribute :mdoe \(did you mean 'mode'\?\)"):
        lower(rule.replace(":mode", ":mdoe").format(8), "typo")
