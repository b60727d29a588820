"""Accumulator fragments as values on the CPU: elementwise maps with each element's (row, col), per-row and
per-column vectors and same-layout tiles read at ragged edges, the plain and the TMA-staged store of a
computed fragment, and matmul_tc's epilogues through the checker (lowered and unlowered, numpy in float64,
outputs poisoned); a wrong fragment coordinate is caught."""
import itertools

import ml_dtypes
import numpy as np
import pytest

from cbrules import api
from cbrules.check import Checker
from cbrules.ir import builder_mma, mma_layout
from cbrules.ir.builder import BuildError, FragmentElement, Kernel, ceil_div, circular_buffer, fragment_coords
from cbrules.ir.terms import evaluate
from cbrules.kernels import KERNELS
from cbrules.kernels.specs import matmul_tc_variant
from cbrules.kernels.matmul_tc import EPILOGUES, MatmulTileError, matmul_tc
from cbrules.reference.interp import run

BF16 = ml_dtypes.bfloat16


def _gemm(m_tile=64, n_tile=64, epilogue=None, store="plain", dtype="bfloat16", out_dtype="float32", body=None,
          groups=1, ws=False):
    """C = epilogue(A @ B^T) on ``groups`` warp groups, m_tile x n_tile tiles, K in steps of 16; ``epilogue(k, e,
    t)`` maps an element (``t``: the kernel's tensors and symbols), ``body(k, acc, t, origin)`` runs after the
    K loop."""
    k = Kernel("frag", block=128 * groups)
    m, n, kk = k.symbol("M"), k.symbol("N"), k.symbol("K")
    t = {"M": m, "N": n, "a": k.tensor("a", (m, kk), dtype), "b": k.tensor("b", (n, kk), dtype),
         "c": k.tensor("c", (m, n), out_dtype), "bias": k.tensor("bias", (n,), "float32"),
         "scale": k.tensor("scale", (m,), "float32"), "res": k.tensor("res", (m, n), "bfloat16")}
    a_map = k.tensor_map(t["a"], box=(m_tile, 16), swizzle="32B")
    b_map = k.tensor_map(t["b"], box=(n_tile, 16), swizzle="32B")
    a_t = k.alloc("a_t", "shared", dtype, (m_tile, 16), align=256)
    b_t = k.alloc("b_t", "shared", dtype, (n_tile, 16), align=256)
    tiles_n = ceil_div(n, n_tile)
    k.grid(ceil_div(m, m_tile) * tiles_n)
    from cbrules.ir.builder import blockIdx
    row0, col0 = (blockIdx.x / tiles_n) * m_tile, (blockIdx.x % tiles_n) * n_tile
    acc = k.mma_accumulator(m_tile, n_tile)
    with k.loop("t", ceil_div(kk, 16), circular_buffer=circular_buffer(2, warp_specialize=ws)) as s:
        k.tma_load(a_map, (row0, s * 16), a_t)
        k.tma_load(b_map, (col0, s * 16), b_t)
        k.mma(acc, a_t, b_t)
    if epilogue is not None:
        k.fragment_map(acc, lambda e: epilogue(k, e, t), origin=(row0, col0))
    if body is not None:
        body(k, acc, t, (row0, col0))
    if store == "plain":
        k.fragment_store(acc, t["c"], (row0, col0))
    else:
        k.mma_store(acc, k.tensor_map(t["c"], box=(m_tile, 32 if out_dtype == "float32" else 64)), (row0, col0))
    return k


def _args(shape, seed=0, out_dtype=np.float32):
    m, n, kk = shape
    rng = np.random.default_rng(seed)
    return {"a": rng.standard_normal((m, kk)).astype(BF16), "b": rng.standard_normal((n, kk)).astype(BF16),
            "c": np.full((m, n), np.nan, out_dtype), "bias": rng.standard_normal(n).astype(np.float32),
            "scale": rng.standard_normal(m).astype(np.float32), "res": rng.standard_normal((m, n)).astype(BF16)}


def _product(args):
    return args["a"].astype(np.float64) @ args["b"].astype(np.float64).T


def _both(kernel, args):
    """The outputs before and after lowering (the lowered kernel runs its mma from the swizzled bytes)."""
    return [run(kg, args)["c"] for kg in (kernel, api.lower(kernel))]


# each: the element function and its float64 numpy meaning (p: the product, a: the inputs)
MAPS = {
    "bias_relu": (lambda k, e, t: k.max(k.add(e.value, e.load_col(t["bias"])), 0.0),
                  lambda p, a: np.maximum(p + a["bias"][None, :], 0.0)),
    "row_scale": (lambda k, e, t: k.mul(e.value, e.load_row(t["scale"])),
                  lambda p, a: p * a["scale"][:, None]),
    "residual": (lambda k, e, t: k.add(e.value, e.load_tile(t["res"])),
                 lambda p, a: p + a["res"].astype(np.float64)),
    # the coordinates themselves as values: a wrong row or column term shows at once
    "coords": (lambda k, e, t: k.add(e.value, k.assign(e.row * 1000 + e.col)),
               lambda p, a: p + np.arange(p.shape[0])[:, None] * 1000.0 + np.arange(p.shape[1])[None, :]),
    "mask": (lambda k, e, t: k.select(e.inside(50, 1 << 20), e.value, -1.0),
             lambda p, a: np.where(np.arange(p.shape[0])[:, None] < 50, p, -1.0)),
}


@pytest.mark.parametrize("name,shape", [("bias_relu", (64, 64, 32))] + [(n, (100, 72, 40)) for n in MAPS],
                         ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else v)
def test_fragment_map_before_and_after_lowering(name, shape):
    fn, meaning = MAPS[name]
    args = _args(shape, seed=len(name))
    want = meaning(_product(args), args)
    for got in _both(_gemm(epilogue=fn), args):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4 * np.sqrt(shape[2]))


@pytest.mark.parametrize("out_dtype", ["float32", "bfloat16"])
def test_a_computed_fragment_leaves_through_the_tma_store(out_dtype):
    args = _args((100, 72, 40), 3, np.float32 if out_dtype == "float32" else BF16)
    fn, meaning = MAPS["bias_relu"]
    want = meaning(_product(args), args)
    kernel = _gemm(epilogue=fn, store="tma", out_dtype=out_dtype)
    src = api.generate(kernel).text
    assert "cb_tma_store" in src and "cb_min(" in src  # staged and TMA-stored; the bias read clamped
    for got in _both(kernel, args):
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=2 ** -7 if out_dtype == "bfloat16" else 1e-5,
                                   atol=1e-3)


def test_the_plain_store_masks_the_ragged_edge():
    # 100 x 72 in 64 x 64 tiles: a store past row 99 or column 71 would be an out-of-bounds write (the
    # interpreter refuses it), an element left out stays NaN
    args = _args((100, 72, 40), 5)
    for got in _both(_gemm(), args):
        np.testing.assert_allclose(got, _product(args), rtol=1e-5, atol=1e-3)


def test_a_wrong_fragment_coordinate_is_caught(monkeypatch):
    # the mutation: the column of the element moves by one inside its pair; the interpreter runs the mma
    # through the model's own layout (mma_layout.fragment_slot), so the bias lands on the wrong column
    right = builder_mma.fragment_coords

    def wrong(bn, rows, j, r, tid):
        row, col = right(bn, rows, j, r, tid)
        return row, col + 1 - 2 * (r % 2)
    monkeypatch.setattr(builder_mma, "fragment_coords", wrong)
    args = _args((64, 64, 32), 1)
    fn, meaning = MAPS["bias_relu"]
    got = run(api.lower(_gemm(epilogue=fn)), args)["c"]
    assert not np.allclose(got, meaning(_product(args), args), rtol=1e-5, atol=1e-3)


def test_fragment_coords_is_public_and_the_models_layout():
    for tid, r in itertools.product(range(0, 128, 5), range(32)):
        row, col = fragment_coords(64, 64, 0, r, "tid")
        assert (evaluate(row, {"tid": tid}), evaluate(col, {"tid": tid})) == \
            tuple(int(x) for x in mma_layout.fragment_coords(tid, r, 64))


def test_a_map_over_a_column_block_changes_those_columns_only():
    # columns 16..47 of a 64-wide tile get + 1000 * (their place among the visited elements, part_index)
    # + row * 10: columns outside are the product, and part_index counts the visited registers only
    def body(k, acc, t, origin):
        k.fragment_map(acc, lambda e: k.add(e.value, k.assign(k.mul(e.part_index, 1000.0) + e.tile_row * 10)),
                       origin=origin, columns=(16, 32))
    args = _args((64, 64, 32), seed=3)
    want = _product(args)
    lane = np.arange(128)
    rows = (lane // 32) * 16 + (lane % 32) // 4
    for r in range(16):  # a thread's registers of columns 16..47: (r / 4) * 8 + (lane % 4) * 2 + r % 2 + 16
        row = rows + (r // 2) % 2 * 8
        col = 16 + (r // 4) * 8 + (lane % 4) * 2 + r % 2
        want[row, col] += 1000.0 * r + row * 10
    for got in _both(_gemm(body=body), args):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-3)


def test_a_column_block_is_whole_register_groups_inside_the_tile():
    k = _gemm()
    from cbrules.ir.builder_values import Buffer
    acc = Buffer("acc", "float32", (32,), "register")
    for columns, match in (((4, 16), "multiples of 8"), ((0, 12), "multiples of 8"), ((48, 24), "first \\+ count"),
                           ((0,), "give \\(first column, count\\)"), (("0", 8), "must be an int")):
        with pytest.raises(BuildError, match=match):
            k.fragment_map(acc, lambda e: e.value, columns=columns)


def test_element_fields_are_terms_of_the_unrolled_element():
    k = _gemm()
    seen = []
    acc = next(iter(k._fragments))
    from cbrules.ir.builder_values import Buffer
    with k.fragment_elements(Buffer(acc, "float32", (32,), "register"), origin=(7, 9)) as e:
        seen.append(e)
    (e,) = seen
    assert isinstance(e, FragmentElement)
    assert evaluate(e.row, {"threadIdx.x": 37, "acc_ej": 0, "acc_er": 3}) == 7 + 16 + 1 + 8
    assert evaluate(e.col, {"threadIdx.x": 37, "acc_ej": 0, "acc_er": 3}) == 9 + 0 + 2 + 1


def test_refusals():
    k = _gemm()
    t = {n: p for n, p in ((p.name, p) for p in k.graph.kernel()["params"])}
    from cbrules.ir.builder_values import Buffer
    acc = Buffer("acc", "float32", (32,), "register")
    with pytest.raises(BuildError, match="origin"):
        with k.fragment_elements(acc, origin=(0,)):
            pass
    with pytest.raises(BuildError, match="not an accumulator"):
        k.fragment_map(Buffer("a_t", "bfloat16", (64, 16), "shared"), lambda e: e.value)
    with pytest.raises(BuildError, match="function of one element"):
        k.fragment_map(acc, 3)
    c = Buffer("c", "float32", (t["c"].shape), "global")
    with pytest.raises(BuildError, match="one-dimensional global"):
        with k.fragment_elements(acc) as e:
            e.load_col(c)
    with pytest.raises(BuildError, match="two or more dimensions"):
        k.fragment_store(acc, Buffer("bias", "float32", t["bias"].shape, "global"), (0, 0))
    with pytest.raises(BuildError, match="one coordinate for each of 'c'"):
        k.fragment_store(acc, t["c"], (0, 0, 0))
    with pytest.raises(MatmulTileError, match="epilogue='gelu'"):
        matmul_tc(epilogue="gelu")


def _reduction(axis, combine, ident, mutate=None):
    def body(k, acc, t, origin):
        k.fragment_map(acc, lambda e: k.select(e.inside(t["M"], t["N"]), e.value, ident), origin)
        red = k.fragment_reduce(acc, axis, combine)
        k.fragment_map(acc, lambda e: e.reduced(red), origin)  # each element: the reduction of its row / column
    return body


def _tile_reduced(x, m_tile, n_tile, axis, fn):
    """Each element replaced by ``fn`` over its row (axis row) or column inside its m_tile x n_tile tile."""
    out = np.empty_like(x)
    for i, j in itertools.product(range(0, x.shape[0], m_tile), range(0, x.shape[1], n_tile)):
        t = x[i:i + m_tile, j:j + n_tile]
        out[i:i + m_tile, j:j + n_tile] = fn(t, axis=1 if axis == "row" else 0, keepdims=True)
    return out


REDUCTIONS = {"max": (float("-inf"), np.max), "sum": (0.0, np.sum), "min": (float("inf"), np.min)}


@pytest.mark.parametrize("axis,combine,groups", [("row", "max", 1), ("row", "sum", 2), ("col", "max", 2),
                                                 ("col", "sum", 1), ("col", "min", 1)])
def test_fragment_reductions(axis, combine, groups):
    # ragged 150 x 72: the last tiles' rows and columns outside the output are masked to the identity; with
    # two warp groups a column spans 8 warps (the shared step), a row stays inside one warp
    ident, fn = REDUCTIONS[combine]
    m_tile = 64 * groups
    args = _args((150, 72, 40), seed=groups)
    want = _tile_reduced(_product(args), m_tile, 64, axis, fn)
    kernel = _gemm(m_tile=m_tile, groups=groups, body=_reduction(axis, combine, ident))
    for got in _both(kernel, args):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-3)


def test_a_column_reduction_warp_specialized_syncs_the_consumers_only():
    # the block syncs of the shared step become the consumers' named barrier (the producer never reaches it)
    from cbrules.reference.interp import SCHEDULES
    args = _args((150, 72, 40), seed=4)
    want = _tile_reduced(_product(args), 128, 64, "col", np.max)
    kg = api.lower(_gemm(m_tile=128, groups=2, body=_reduction("col", "max", float("-inf")), ws=True))
    from cbrules.codegen.cuda import emit
    from cbrules.schedule import schedule
    src = emit(schedule(kg)).text
    assert "cb_bar_sync(2, 256);" in src and "__syncthreads();" not in src.split("acc_col_max_warps[")[1]
    for schedule in SCHEDULES:
        np.testing.assert_allclose(run(kg, args, schedule=schedule)["c"], want, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("axis,shuffles", [("row", (1,)), ("col", (4, 8))])
def test_a_reduction_that_skips_a_lane_is_caught(monkeypatch, axis, shuffles):
    # the mutation: one shuffle fewer, so each result misses the partials of half its lanes
    monkeypatch.setattr(builder_mma, "ROW_SHUFFLES" if axis == "row" else "COL_SHUFFLES", shuffles)
    args = _args((64, 64, 32), 2)
    want = _tile_reduced(_product(args), 64, 64, axis, np.max)
    got = run(api.lower(_gemm(body=_reduction(axis, "max", float("-inf")))), args)["c"]
    assert not np.allclose(got, want, rtol=1e-5, atol=1e-3)


def _epilogue_spec(name):
    import dataclasses
    import functools
    spec = matmul_tc_variant(KERNELS["matmul_tc"], epilogue=name)
    # one warp group of 64 x 64 tiles, 16 of K a stage: a ragged 100 x 72 output in four tiles, K = 40 in three
    small = functools.partial(matmul_tc, epilogue=name, bm=64, bn=64, bk=16, groups=1)
    return dataclasses.replace(spec, factory=small, shape_for_trips=lambda t: (100, 72, 16 * t - 8))


@pytest.mark.parametrize("name", [e for e in EPILOGUES if e != "none"])
def test_matmul_tc_epilogues_pass_the_checker(name):
    r = Checker(dtype="bfloat16").check(_epilogue_spec(name), 3, 2)
    assert r.ok, f"{r.status} {r.detail}"


def test_an_epilogue_checked_warp_specialized():
    r = Checker(dtype="bfloat16").check(_epilogue_spec("alpha_beta"), 3, 2, warp_specialize=True)
    assert r.ok, f"{r.status} {r.detail}"


@pytest.mark.parametrize("name", ["alpha_beta"])  # bias_gelu: the acceptance command below
def test_epilogues_compile_without_spills(name):
    ck = api.compile(matmul_tc(stages=4, epilogue=name, warp_specialize=True, registers=(40, 232)))
    r = ck.cubin.resources
    assert r.spill_stores == 0 and r.spill_loads == 0 and r.stack_bytes == 0
    assert "C7518" not in ck.cubin.log  # the wgmma are not serialized by the epilogue's register use


EXAMPLE = __import__("pathlib").Path(__file__).resolve().parents[1] / "examples" / "gemm_bias_gelu.py"


def test_the_example_kernel_file_passes_the_checker():
    from cbrules.kernelfile import load_kernel
    spec = load_kernel(str(EXAMPLE))
    r = Checker().check(spec, 2, 2)  # every trip count: `cbrules check` (the GPU suite compiles and runs it)
    assert r.ok, f"{r.status} {r.detail}"


def test_both_acceptance_commands(capsys):
    from cbrules.cli import main
    assert main(["compile", "matmul_tc", "--epilogue", "bias_gelu", "--b-layout", "kn", "--quiet"]) == 0
    assert "0/0 B spill" in capsys.readouterr().err  # the summary, beside the CUDA on stdout
    assert main(["compile", "single_dim", "--epilogue", "bias", "--quiet"]) == 1
    assert "epilogue (--epilogue) applies to the built-in matmul_tc only" in capsys.readouterr().err
    assert main(["compile", "matmul_tc", "--epilogue", "gelu", "--quiet"]) == 1
    assert "epilogue 'gelu' is not one of none, bias" in capsys.readouterr().err


@pytest.mark.parametrize("name,needles", [
    ("bias", ("bias[cb_min(",)), ("bias_relu", ("bias[cb_min(", "cb_max(")), ("bias_gelu", ("erff(",)),
    ("bias_gelu_tanh", ("tanhf(",)), ("bias_silu", ("1.0f / (1.0f + expf(-(",)), ("residual", ("residual[cb_min(",)),
    ("alpha_beta", ("c_in[cb_min(", "fmaf(alpha,"))])
def test_each_epilogue_reaches_the_cuda_between_the_mma_loop_and_the_store(name, needles):
    src = api.generate(matmul_tc(stages=3, epilogue=name)).text.split('extern "C"')[1]
    body = src[src.index("acc_ej"):src.index("acc_q")]  # the map, after the K loop and before the store
    assert all(n in body for n in needles), (name, [n for n in needles if n not in body])


def test_a_tma_loaded_residual_tile_read_in_the_fragment_layout():
    # the residual's 64 x 64 tile arrives by one TMA load under a barrier of its own, issued before the K
    # loop (so it overlaps it) and waited for after; each element reads it at its place in the tile
    def body(k, acc, t, origin):
        tile = k.alloc("res_t", "shared", "bfloat16", (64, 64))
        bar = k.alloc("res_bar", "shared", "mbarrier", (1,))
        with k.elect_one():
            k.mbarrier_init(bar, 0, count=1)
            k.fence_mbarrier_init()
        k.syncthreads()
        res_map = k.tensor_map(t["res"], box=(64, 64))
        with k.elect_one():
            k.mbarrier_arrive_expect_tx(bar, 0, res_map.box_bytes)
            k.tma_load(res_map, origin, tile, bar, slot=0)
        k.mbarrier_wait(bar, 0, parity=0)
        k.fragment_map(acc, lambda e: k.add(e.value, e.load_tile(tile)), origin)
        with k.elect_one():
            k.mbarrier_inval(bar, 0)
    # lowered only: with barriers of its own the kernel's mma run asynchronously in the interpreter, and
    # only the rules fence them
    args = _args((100, 72, 40), seed=6)
    want = _product(args) + args["res"].astype(np.float64)
    np.testing.assert_allclose(run(api.lower(_gemm(body=body)), args)["c"], want, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("cols", [64, 63])
def test_fragment_store_into_a_plane_of_a_three_dimensional_tensor(cols):
    """fragment_store at (plane, row0, col0) of [H, M, cols]: with cols even a thread's neighbouring columns
    leave as one vector store, with cols odd element by element; ragged M clipped (the grid leaves the last
    plane alone, so a row written past M of the plane before it shows there)."""
    k = Kernel("plane", block=128)
    h, m, kk = k.symbol("H"), k.symbol("M"), k.symbol("K")
    a = k.tensor("a", (m, kk), "bfloat16")
    b = k.tensor("b", (64, kk), "bfloat16")
    c = k.tensor("c", (h, m, cols), "bfloat16")
    a_map, b_map = k.tensor_map(a, box=(64, 16), swizzle="32B"), k.tensor_map(b, box=(64, 16), swizzle="32B")
    a_t = k.alloc("a_t", "shared", "bfloat16", (64, 16), align=256)
    b_t = k.alloc("b_t", "shared", "bfloat16", (64, 16), align=256)
    from cbrules.ir.builder import blockIdx
    tiles = ceil_div(m, 64)
    k.grid(tiles * (h - 1))
    plane, row0 = blockIdx.x / tiles, (blockIdx.x % tiles) * 64
    acc = k.mma_accumulator(64, 64)
    with k.loop("t", ceil_div(kk, 16), circular_buffer=circular_buffer(2)) as s:
        k.tma_load(a_map, (row0, s * 16), a_t)
        k.tma_load(b_map, (0, s * 16), b_t)
        k.mma(acc, a_t, b_t)
    k.fragment_map(acc, lambda e: k.add(e.value, plane))  # each plane's tile differs
    k.fragment_store(acc, c, (plane, row0, 0))
    text = api.generate(k).text
    assert ("cb_vcopy<4>" in text) == (cols % 2 == 0)
    rng = np.random.default_rng(3)
    mm, kd, hh = 70, 32, 3
    args = {"a": rng.standard_normal((mm, kd)).astype(BF16), "b": rng.standard_normal((64, kd)).astype(BF16),
            "c": np.full((hh, mm, cols), np.nan, BF16)}
    want = args["a"].astype(np.float64) @ args["b"].astype(np.float64).T
    got = run(api.lower(k), args)["c"].astype(np.float64)
    for p in range(hh - 1):
        np.testing.assert_allclose(got[p], (want + p)[:, :cols], rtol=1e-2, atol=2e-2)
    assert np.isnan(got[hh - 1]).all()
