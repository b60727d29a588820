"""Split tensor maps (``k.tensor_map(x, box, split={d: inner})``): a TMA map over a view of higher rank
of the same tensor. The interpreter must read what the hardware reads (checked against numpy's own
reshape, so a wrong stride fails here), the launcher must refuse what the split cannot address, and
persistent(one_box=True) must compute the normalization at every trip count the checker tries."""
import dataclasses
import functools
import math

import ml_dtypes
import numpy as np
import pytest

from cbrules import api, tracefile
from cbrules.check import Checker, trip_counts
from cbrules.codegen import runtime
from cbrules.ir import tma_view
from cbrules.ir.bind import bind
from cbrules.ir.builder import BuildError, Kernel, blockIdx, ceil_div, circular_buffer, threadIdx
from cbrules.ir.limits import TmaBoxError, TmaLimitError
from cbrules.ir.verify import GraphError
from cbrules.ir.tma_view import TmaSplitError
from cbrules.kernels import KERNELS, reductions
from cbrules.reference.interp import InterpError, run
from test_hostile_launch import FAKE_PTR, FakeCai

F32 = np.float32
T = 128  # threads of the copy kernel


def split_copy(rank: int, split: dict, box: tuple, dtype: str = "float32", swizzle: str = "none") -> Kernel:
    """Every block TMA-loads one box of the split view of a rank-``rank`` tensor (block b takes the
    box at b's place in the view's grid of boxes) and copies it to row b of ``out`` in logical order
    (through the swizzled addresses, with ``swizzle``)."""
    k = Kernel("split_copy", block=T)
    dims = [k.symbol(f"N{d}") for d in range(rank)]
    x = k.tensor("x", tuple(dims), dtype)
    elems = math.prod(box)
    out = k.tensor("out", (k.symbol("B"), elems), dtype)
    xm = k.tensor_map(x, box=box, split=split, swizzle=swizzle)
    tile = k.alloc("tile", "shared", dtype, (elems,), align=1024)
    view = tma_view.view_shape(dims, tuple(sorted(split.items())))
    counts = [ceil_div(n, b) for n, b in zip(view, box)]
    k.grid(functools.reduce(lambda a, b: a * b, counts))
    coords, stride = [], 1
    for n, b in reversed(list(zip(counts, box))):  # block index -> box coordinates, innermost fastest
        coords.insert(0, blockIdx.x / stride % n * b)
        stride = stride * n
    with k.loop("i", 2, circular_buffer=circular_buffer(2)):  # the same box twice: a pipelined load
        k.tma_load(xm, tuple(coords), tile)
        with k.loop("e", elems // T, kind="unroll") as e:
            k.store(out, blockIdx.x * elems + e * T + threadIdx.x, k.load(tile, e * T + threadIdx.x))
    return k


def boxes_by_numpy(x: np.ndarray, split: dict, box: tuple) -> np.ndarray:
    """The boxes of the view, in block order, zeros outside: numpy's reshape, not cbrules' strides."""
    shape = []
    for d, n in enumerate(x.shape):
        shape += [n // split[d], split[d]] if d in split else [n]
    view = x.reshape(shape)
    counts = [-(-n // b) for n, b in zip(shape, box)]
    padded = np.zeros([c * b for c, b in zip(counts, box)], x.dtype)
    padded[tuple(slice(0, n) for n in shape)] = view
    out = []
    for idx in np.ndindex(*counts):
        out.append(padded[tuple(slice(i * b, (i + 1) * b) for i, b in zip(idx, box))].ravel())
    return np.stack(out)


CASES = [  # rank, split, box, tensor shape: ragged and zero-filled at the view's edges
    (2, {1: 64}, (2, 3, 64), (5, 64 * 7)),       # rows of 7 stretches; 3 a box: the third box half outside
    (2, {1: 32}, (1, 4, 32), (3, 32 * 8)),       # exact
    (2, {0: 4}, (2, 2, 32), (4 * 3, 96)),        # the outer dimension split: view [3, 4, 96]
    (3, {2: 32}, (1, 2, 2, 32), (3, 5, 32 * 3)), # rank 3 -> 4
    (2, {0: 2, 1: 32}, (1, 2, 2, 32), (6, 32 * 3)),  # two splits: rank 2 -> 4
]


SWIZZLED = [  # rank, split, box, shape, dtype: 128-byte rows of the box, 1024 bytes a box
    (2, {1: 32}, (2, 4, 32), (5, 32 * 7), "float32"),
    (2, {1: 64}, (2, 4, 64), (3, 64 * 5), "bfloat16"),
]


def run_copy(rank, split, box, shape, dtype="float32", lowered=False, swizzle="none"):
    x = (np.arange(math.prod(shape)).reshape(shape) % 1000 + 1).astype(ml_dtypes.bfloat16 if dtype == "bfloat16"
                                                                        else F32)
    want = boxes_by_numpy(x, split, box)
    k = split_copy(rank, split, box, dtype, swizzle)
    got = run(api.lower(k) if lowered else k, {"x": x, "out": np.full(want.shape, np.nan, x.dtype)})["out"]
    return got, want


@pytest.mark.parametrize("rank, split, box, shape", CASES)
def test_split_map_boxes_match_numpy_reshape(rank, split, box, shape):
    got, want = run_copy(rank, split, box, shape)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("rank, split, box, shape", CASES[:1] + CASES[3:4])
def test_split_map_lowered_and_in_bfloat16(rank, split, box, shape):
    """Lowered (a barrier-completed copy of box_bytes) and in a 2-byte type."""
    got, want = run_copy(rank, split, box, shape, "bfloat16", lowered=True)
    np.testing.assert_array_equal(got.astype(F32), want.astype(F32))


@pytest.mark.parametrize("rank, split, box, shape, dtype", SWIZZLED)
def test_a_swizzled_split_map_reads_back_in_logical_order(rank, split, box, shape, dtype):
    """The swizzle is laid over the box as it lands in shared memory, whatever the view's rank."""
    got, want = run_copy(rank, split, box, shape, dtype, lowered=True, swizzle="128B")
    np.testing.assert_array_equal(got.astype(F32), want.astype(F32))


def test_a_wrong_outer_stride_is_caught(monkeypatch):
    """Mutation: the view's outer stride off by the inner extent's half; the boxes no longer match numpy."""
    real = tma_view.view_strides

    def halved(strides, split):
        inner = dict(split)
        out = list(real(strides, split))
        d = min(inner)  # the first split dimension's outer stride sits at its own index
        out[d] //= 2
        return tuple(out)
    monkeypatch.setattr(tma_view, "view_strides", halved)
    got, want = run_copy(*CASES[0])
    assert not np.array_equal(got, want)


def test_a_view_reaching_past_the_tensor_is_refused(monkeypatch):
    """Mutation the other way: a doubled outer stride would read past the tensor's bytes."""
    real = tma_view.view_strides
    monkeypatch.setattr(tma_view, "view_strides", lambda st, sp: (lambda o: (o[0], 2 * o[1], *o[2:]))(real(st, sp)))
    with pytest.raises(InterpError, match="split view .* of tensor map 'x_tmap' reaches"):
        run_copy(*CASES[0])


def split_store(box=(1, 2, 2, 32), coords=(1, 1, 2, 0)) -> Kernel:
    """Element e of a shared tile is e + 1; one TMA store puts it at ``coords`` of y's view [A, B, C / 32, 32]."""
    k = Kernel("split_store", block=T)
    y = k.tensor("y", (k.symbol("A"), k.symbol("B"), k.symbol("C")))
    ym = k.tensor_map(y, box=box, split={2: 32})
    elems = math.prod(box)
    tile = k.alloc("tile", "shared", "float32", (elems,))
    with k.loop("e", elems // T, kind="unroll") as e:
        k.store(tile, e * T + threadIdx.x, k.add(k.assign((e * T + threadIdx.x) * 1.0), 1.0))
    k.fence_proxy_async()
    k.syncthreads()
    with k.elect_one():
        k.tma_store(ym, coords, tile)
    return k


def test_a_tma_store_through_a_split_map_writes_the_views_box_clipped():
    y = np.zeros((2, 3, 32 * 3), F32)
    got = run(split_store(), {"y": y})["y"]
    want = y.copy()
    view = want.reshape(2, 3, 3, 32)  # numpy's view of the same bytes
    box = (np.arange(128, dtype=F32) + 1).reshape(1, 2, 2, 32)
    view[1:2, 1:3, 2:3, :] = box[:, :, :1, :]  # view dimension 2 has 3 stretches: the box's second is clipped
    np.testing.assert_array_equal(got, want)


def test_split_map_source_compiles_at_every_rank(tmp_path):
    """NVRTC takes the rank-3 and rank-4 box copies (the latter from the rank-4/5 prelude, which only
    kernels with such maps carry)."""
    for rank, split, box, _ in (CASES[0], CASES[3]):
        ck = api.compile(split_copy(rank, split, box), cache_dir=str(tmp_path))
        assert ("cp.async.bulk.tensor.4d" in ck.source.text) == (len(box) == 4)
    assert "cb_tma_store(&y_tmap" in api.compile(split_store(), cache_dir=str(tmp_path)).source.text


# ------------------------------------------------------------------------------ refusals
def tensor_map_of(shape, box, split, dtype="float32"):
    k = Kernel("m", block=32)
    x = k.tensor("x", tuple(k.symbol(s) if isinstance(s, str) else s for s in shape), dtype)
    return k.tensor_map(x, box=box, split=split)


@pytest.mark.parametrize("split, match", [
    ({1: 0}, "inner extent must be in 2..2"), ({1: -256}, "inner extent must be in 2..2"),
    ({1: 1}, "inner extent must be in 2..2"), ({1: 2 ** 33}, "inner extent must be in 2..2"),
    ({1: True}, "bools, floats and text are refused"), ({True: 256}, "bools, floats and text are refused"),
    ({1: 256.0}, "bools, floats and text are refused"), ({"1": 256}, "bools, floats and text are refused"),
    ({2: 256}, "split dimension 2 is not a dimension of the rank-2 tensor"),
    ({-1: 256}, "split dimension -1 is not a dimension"),
    ([(1, 256)], "split must be a dict"), (256, "split must be a dict"),
], ids=repr)
def test_hostile_splits_are_named_errors(split, match):
    with pytest.raises(TmaSplitError, match=match) as e:
        tensor_map_of(("M", "N"), (1, 2, 256), split)
    assert "tensor map 'x_tmap'" in str(e.value) and isinstance(e.value, TmaLimitError)


def test_a_view_of_more_than_five_dimensions_is_refused():
    with pytest.raises(TmaSplitError, match="view of rank 6; TMA maps have at most 5"):
        tensor_map_of(("A", "B", "C", "D"), (1,) * 5 + (8,), {0: 2, 3: 8})


def test_a_constant_dimension_the_split_does_not_divide_is_refused_when_declared():
    with pytest.raises(TmaSplitError, match=r"'x_tmap' \(when declared\): dimension 1 of extent 1000 is not "
                                            r"a multiple of its split inner extent 256"):
        tensor_map_of(("M", 1000), (1, 2, 256), {1: 256})


@pytest.mark.parametrize("split", [((1, -3),), ((5, 64),), ((1, 64), (1, 64)), ((1, True),), (1, 64)], ids=repr)
def test_a_graph_with_a_hostile_split_does_not_verify(split):
    """A trace file's graph is rebuilt from data: its split maps are checked as the builder checks them."""
    kg = split_copy(*CASES[0][:3]).graph
    kg.kernel()["params"] = tuple(dataclasses.replace(p, split=split) if p.kind == "tmap" else p
                                  for p in kg.kernel()["params"])
    with pytest.raises(GraphError, match="tensor map 'x_tmap' has split"):
        kg.verify()


def test_a_split_map_survives_a_trace_file(tmp_path):
    kg = api.lower(split_copy(*CASES[3][:3]), debug=True)
    tracefile.save(kg.trace, tmp_path / "split.cbtrace", "split_copy", "")
    back, _, _ = tracefile.load(tmp_path / "split.cbtrace")
    (tmap,) = [p for p in back.initial.kernel()["params"] if p.kind == "tmap"]
    assert tmap.split == ((2, 32),) and tmap.box == CASES[3][2]


def test_the_box_is_in_the_views_rank_and_limits():
    with pytest.raises(BuildError, match="box .* has rank 2, its split view has rank 3"):
        tensor_map_of(("M", "N"), (1, 256), {1: 256})
    with pytest.raises(TmaBoxError, match="box extent 512 in dimension 2"):
        tensor_map_of(("M", "N"), (1, 1, 512), {1: 512})
    with pytest.raises(TmaBoxError, match="not a multiple of 16"):
        tensor_map_of(("M", "N"), (1, 2, 2), {1: 2})


def test_a_symbolic_dimension_the_split_does_not_divide_is_refused_at_launch():
    k = split_copy(*CASES[0][:3])
    x = np.zeros((5, 64 * 7 + 16), F32)  # rows of 464: TMA-legal pitch, not whole stretches of 64
    with pytest.raises(TmaSplitError, match=r"\(at launch\): dimension 1 of extent 464 is not a multiple of .* 64"):
        bind(k.graph, {"x": x, "out": np.zeros((15, 384), F32)})


def test_the_gpu_launcher_refuses_an_undivided_dimension_before_the_driver(tmp_path, monkeypatch):
    """The launcher encodes the view from the real shape: a row of 464 is no whole number of 64s."""
    ck = api.compile(split_copy(*CASES[0][:3]), cache_dir=str(tmp_path))
    monkeypatch.setattr(runtime, "current_context", lambda *a, **k: pytest.fail("a launch check reached the driver"))
    with pytest.raises(TmaSplitError, match=r"'x_tmap' \(at launch\): dimension 1 of extent 464"):
        ck.bind(x=FakeCai((5, 464)), out=FakeCai((15, 384), ptr=FAKE_PTR + 0x10_0000))
    ck.check(x=FakeCai((5, 448)), out=FakeCai((15, 384), ptr=FAKE_PTR + 0x10_0000))  # 7 x 64: accepted


def test_an_innermost_split_whose_view_stride_is_no_tma_stride_is_refused():
    """Stretches of 2 floats: the view's outer stride of 8 bytes is not a multiple of 16."""
    with pytest.raises(TmaSplitError, match="stride of 8 bytes, but TMA strides are multiples of 16 bytes: split "
                                            "by a multiple of 4 elements"):
        tensor_map_of(("M", "N"), (1, 8, 4), {1: 2})


def test_a_split_of_a_dimension_whose_stride_is_no_tma_stride_is_refused_at_launch():
    """The outer dimension split: its strides are the tensor's row pitch times 1 and 4; rows of 36 bytes
    are refused as for any map."""
    k = Kernel("m", block=32)
    x = k.tensor("x", (k.symbol("M"), k.symbol("N")))
    k.tensor_map(x, box=(1, 4, 8), split={0: 4})
    with pytest.raises(TmaLimitError, match="stride of axis 1 is 36 bytes"):
        bind(k.graph, {"x": np.zeros((8, 9), F32)})


def test_a_tile_wider_than_a_split_maps_box_and_a_tile_store_through_it_are_refused():
    k = Kernel("m", block=32)
    x = k.tensor("x", (k.symbol("M"), k.symbol("N")))
    xm = k.tensor_map(x, box=(1, 2, 64), split={1: 64})
    tile = k.alloc("t", "shared", "float32", (1, 256))
    with pytest.raises(BuildError, match="2 coordinates for tensor map 'x_tmap' of rank 3"):
        k.tma_load(xm, (0, 0), tile)  # the tensor's rank, not the view's
    with pytest.raises(BuildError, match="a split map loads one box a tile"):
        k.tma_load(xm, (0, 0, 0), tile, tile=(1, 2, 128))
    with pytest.raises(BuildError, match="tile stores go through a map without split="):
        k.store(x, threadIdx.x, 1.0, tile=(xm, (0, 0, 0), threadIdx.x))


# ------------------------------------------------------------------------------ persistent(one_box=True)
def one_box_spec():
    sp = KERNELS["persistent"]
    return dataclasses.replace(sp, name="persistent_one_box",
                               factory=functools.partial(reductions.persistent, one_box=True))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("stages", [2, 3])
def test_persistent_one_box_at_every_trip_count(dtype, stages):
    """``cbrules check``'s trip counts 0..4S (rows of 256 per trip, one (2, 128) box a stage)."""
    spec, checker = one_box_spec(), Checker(blocks="sample", dtype=dtype)
    kernel = spec.build((2, 1024), stages=stages, dtype=dtype)
    assert any(p.split == ((1, 128),) for p in kernel.graph.params().values())
    results = [checker.check(spec, t, stages) for t in trip_counts(stages)]
    bad = [f"{r.trips}: {r.status} {r.detail}" for r in results if not r.ok]
    assert not bad, "\n".join(bad)


def test_persistent_one_box_keeps_the_shared_layout_and_loads_one_box_a_stage():
    one = api.generate(reductions.persistent(2, row=32768, width=16384, threads=512, box=256, dtype="bfloat16",
                                             one_box=True)).text
    rows = api.generate(reductions.persistent(2, row=32768, width=16384, threads=512, box=256,
                                              dtype="bfloat16")).text
    loads = [ln for ln in one.splitlines() if "cb_tma_load(" in ln and "&x_tmap" in ln]
    assert loads and all("j * 64" in ln or "+ 1) * 64" in ln or "* 64" in ln for ln in loads), loads
    assert "cb_box" in rows and "< 64; cb_box" in rows and "cb_box" not in one  # 64 boxes a stage -> 1
    assert one.count("cb_vcopy<") == rows.count("cb_vcopy<")


def test_persistent_one_box_refuses_a_width_not_a_multiple_of_the_box():
    with pytest.raises(ValueError, match="width 512 must be a multiple of box=384"):
        reductions.persistent(2, row=2048, width=512, threads=128, box=384, one_box=True)
