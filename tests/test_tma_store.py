"""TMA-store epilogues on the CPU: the rules' output, the protocol checker's bulk-group model
(mutation tests), named errors for bad requests, NVRTC compiles and the tile-output kernels through
the interpreter."""
import numpy as np
import pytest

from cbrules import api, cli
from cbrules.reference import protocol
from cbrules.ir.builder import BuildError, Kernel, StagingAlignmentError, blockIdx, ceil_div, threadIdx
from cbrules.check import Checker
from cbrules.rewrite.engine import LoweringError
from cbrules.reference.interp import run
from cbrules.kernels import KERNELS, UnsupportedVariantError
from rulekit import Mutation, assert_caught, lower_case, mutation_folders

TILE_KERNELS = [n for n, s in KERNELS.items() if s.tile_output]


def _stage_rule(wait: str = "(if :pred (call \"elect_one\") (tma_store_wait :pending 0 :read true))",
                sync_then_wait: bool = False, final: bool = True, slots: int = 2) -> str:
    """tma-store-stage and tma-store-to-staging (rules/tma_store.rules) rebuilt with one thing changed,
    in a phase of their own (the graph is verified after each phase: both rules must share it)."""
    sync = "(syncthreads)"
    middle = f"{sync} {wait}" if sync_then_wait else f"{wait} {sync}"
    final_wait = ("(insert-at-exit ?K (if :pred (call \"elect_one\") (tma_store_wait :pending 0 :read false)))"
                  if final else "")
    return f"""
(disable tma-store-stage tma-store-to-staging)
(phase mut-store :before tma-store)
(graph-rule mut-store-stage
  :doc "tma-store-stage, mutated"
  :phase mut-store
  :match ((kernel ?K)
          (store ?st :tile (:map ?m :coords ?c :box ?box :dtype ?dt))
          (nearest ?L (for :kind "serial") :around ?st)
          (for ?L :var ?i :annotations ?ann))
  :where ((is-none (get ?ann "tma_store")))
  :rewrite ((let ?stage (str "cb_stage_" (id ?L)))
            (insert-at-entry ?K (alloc :buf ?stage :space "shared" :dtype ?dt :shape (prepend {slots} ?box) :align 128))
            (set ?L :annotations (assoc ?ann "tma_store" (dict "stage" ?stage "map" ?m)))
            (insert-at-exit ?L (fence_proxy_async) {middle}
                               (if :pred (call "elect_one")
                                 (tma_store :tmap ?m :coords ?c :src ?stage
                                            :offset (* (% (var ?i) {slots}) (product ?box)) :wait "none")))
            {final_wait}))
(graph-rule mut-to-staging
  :doc "tma-store-to-staging with {slots} slot(s)"
  :phase mut-store
  :after (mut-store-stage)
  :match ((store ?st :dst ?out :tile (:tensor ?out :map ?m :index ?ix :box ?box))
          (nearest ?L (for :kind "serial") :around ?st)
          (for ?L :var ?i :annotations (:tma_store (:stage ?stage :map ?m))))
  :rewrite ((set ?st :dst ?stage :index (+ ?ix (* (% (var ?i) {slots}) (product ?box))))))
"""


SYNC, MBARRIER = {"war": "sync", "tma_store": True}, {"war": "mbarrier", "tma_store": True}
MUTATIONS = {
    "control": Mutation(_stage_rule(), (), MBARRIER),
    "no-read-wait": Mutation(_stage_rule(wait=""), (protocol.StoreOverwrite,), SYNC),
    "wait-after-sync": Mutation(_stage_rule(sync_then_wait=True), (protocol.StoreOverwrite,), MBARRIER),
    "one-slot": Mutation(_stage_rule(slots=1), (protocol.StoreOverwrite,), SYNC),
    "no-final-wait": Mutation(_stage_rule(final=False), (protocol.StoreInFlight,), SYNC),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return mutation_folders(tmp_path_factory.mktemp("store-mutations"), MUTATIONS)


def _lower_and_run(name, mutation, folders, dtype="float32", trips=5):
    spec = KERNELS[name]
    shape, kg, args = lower_case(spec, trips, folders / mutation, dtype, stages=3, **MUTATIONS[mutation].build)
    return spec, shape, args, run(kg, args)


@pytest.mark.parametrize("kernel", TILE_KERNELS)
@pytest.mark.parametrize("mutation", [m for m in MUTATIONS if m != "control"])
def test_store_mutation_is_caught(kernel, mutation, folders):
    e = assert_caught(lambda: _lower_and_run(kernel, mutation, folders), MUTATIONS[mutation].caught, exact=True)
    assert "cb_stage_" in str(e) and "block (0, 0, 0)" in str(e)


@pytest.mark.parametrize("kernel", TILE_KERNELS)
def test_store_control_runs_clean(kernel, folders):
    spec, shape, args, got = _lower_and_run(kernel, "control", folders, dtype="bfloat16")
    rtol, atol = spec.tolerances(shape, "bfloat16")
    np.testing.assert_allclose(got["out"].astype(np.float64), spec.expected(args)["out"], rtol=rtol, atol=atol)


def test_overwrite_names_the_store_and_the_wait_order(folders):
    with pytest.raises(protocol.StoreOverwrite, match="wait for that store is not ordered before the write"):
        _lower_and_run("single_dim", "wait-after-sync", folders)
    with pytest.raises(protocol.StoreOverwrite, match="may still read it .no cp.async.bulk.wait_group.read"):
        _lower_and_run("single_dim", "no-read-wait", folders)


@pytest.mark.parametrize("dtype", ("float32", "bfloat16"))
@pytest.mark.parametrize("kernel", TILE_KERNELS)
def test_tile_kernels_with_tma_store_in_the_checker(kernel, dtype):
    checker = Checker(blocks="sample", dtype=dtype, tma_store=True)
    for stages, war in ((2, "sync"), (3, "mbarrier"), (4, "sync")):
        for trips in (stages, 2 * stages + 1):
            res = checker.check(KERNELS[kernel], trips, stages, war=war)
            assert res.status == "ok", f"{kernel} {dtype} S={stages} {war} trips={trips}: {res.detail}"


@pytest.mark.parametrize("dtype", ("float32", "float16", "bfloat16"))
@pytest.mark.parametrize("kernel", TILE_KERNELS)
def test_nvrtc_compiles_tma_store_kernels(kernel, dtype):
    ck = api.compile(KERNELS[kernel].build(stages=3, dtype=dtype, tma_store=True))
    t = ck.source.text
    assert "cp.async.bulk.tensor" in t and "cb_tma_store_async(&out_tmap" in t
    assert "cb_bulk_wait_read<0>();" in t and "cb_bulk_wait<0>();" in t and "cb_fence_proxy_async();" in t
    assert "out[" not in t  # no per-thread global store is left


def test_generated_order_fence_wait_sync_store():
    t = api.generate(KERNELS["multi_dim"].build(stages=2, tma_store=True, war="mbarrier")).text
    main = t[t.index("// main"):t.index("// epilogue")]
    at = main.index("cb_stage_")  # each after the one before (the refill's fence comes before them all)
    for step in ("cb_fence_proxy_async();", "cb_bulk_wait_read<0>();", "__syncthreads();", "cb_tma_store_async("):
        at = main.index(step, at)
    assert t.rindex("cb_bulk_wait<0>();") > t.rindex("cb_mbar_inval")  # the kernel's last act


def test_cli_compile_tma_store(capsys):
    assert cli.main(["compile", "pointwise", "--dtype", "bfloat16", "--tma-store", "--stages", "2"]) == 0
    out = capsys.readouterr().out
    assert "cb_bf16* cb_stage_" in out and "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group" in out
    assert cli.main(["compile", "inner_reduction", "--tma-store"]) == 1
    assert "UnsupportedVariantError" in capsys.readouterr().err


# ------------------------------------------------------------------------------ bad requests
def _tile_kernel(box=256, guard=None, in_loop=True, second=False, align=None):
    k = Kernel("tiles", block=256)
    n = k.symbol("N")
    x, out = k.tensor("x", (n,)), k.tensor("out", (n,))
    out_map = k.tensor_map(out, box=(box,))
    k.grid(ceil_div(n, 256 * 4))
    if second:
        out2 = k.tensor("out2", (n,))
        out2_map = k.tensor_map(out2, box=(box,))

    def body(base):
        with k.if_((base + threadIdx.x).lt(n) if guard is None else guard):
            v = k.add(k.load(x, base + threadIdx.x), 1.0)
            k.store(out, base + threadIdx.x, v, tile=(out_map, (base,), threadIdx.x))
            if second:
                k.store(out2, base + threadIdx.x, v, tile=(out2_map, (base,), threadIdx.x))

    if in_loop:
        with k.loop("i", 4) as i:
            body((blockIdx.x * 4 + i) * 256)
    else:
        body(blockIdx.x * 256)
    return k


def test_partial_tile_store_is_a_named_failure():
    x = np.zeros(4096, np.float32)
    k = _tile_kernel(guard=threadIdx.x.lt(128))  # half of every in-bounds tile is never written
    with pytest.raises(protocol.PartialTileStore, match=r"sends cb_stage_\d+\[128\]"):
        run(api.lower(k), {"x": x, "out": np.zeros_like(x)})
    k = _tile_kernel()  # the predicate leaves only the part past N unwritten: clipped, fine
    got = run(api.lower(k), {"x": x[:1000], "out": np.zeros(1000, np.float32)})["out"]
    np.testing.assert_array_equal(got, np.ones(1000, np.float32))


def test_tile_store_outside_a_serial_loop_is_refused():
    with pytest.raises(LoweringError, match="outside any serial loop.*tma-store-reject-no-loop"):
        api.lower(_tile_kernel(in_loop=False))


def test_box_that_misaligns_the_second_slot_is_refused():
    with pytest.raises(LoweringError, match="spans 32 bytes.*misaligned.*tma-store-reject-misaligned-slot"):
        api.lower(_tile_kernel(box=8))


def test_two_tile_outputs_in_one_loop_are_refused():
    with pytest.raises(LoweringError, match="one TMA-stored output per loop.*tma-store-reject-second-map"):
        api.lower(_tile_kernel(second=True))


def test_misaligned_staging_buffer_is_refused():
    k = Kernel("k", block=32)
    out = k.tensor("out", (64,))
    m = k.tensor_map(out, box=(32,))
    s = k.alloc("s", "shared", "float32", (32,), align=16)
    with pytest.raises(StagingAlignmentError, match="staging buffer 's' is aligned to 16 bytes"):
        k.tma_store(m, (0,), s, wait="none")


def test_tile_through_another_tensors_map_is_refused():
    k = Kernel("k", block=32)
    x, out = k.tensor("x", (64,)), k.tensor("out", (64,))
    xm = k.tensor_map(x, box=(32,))
    with pytest.raises(BuildError, match="through tensor map 'x_tmap', which maps 'x'"):
        k.store(out, threadIdx.x, 1.0, tile=(xm, (0,), threadIdx.x))


@pytest.mark.parametrize("kernel", sorted(set(KERNELS) - set(TILE_KERNELS) - {"exp1d_tma"}))
def test_tma_store_on_a_kernel_without_tile_output_is_refused(kernel):
    with pytest.raises(UnsupportedVariantError, match="tma_store needs an output written as whole tiles"):
        KERNELS[kernel].build(tma_store=True)


def test_plain_tma_store_text_is_unchanged():
    k = Kernel("k", block=32)
    out = k.tensor("out", (64,))
    m = k.tensor_map(out, box=(32,))
    s = k.alloc("s", "shared", "float32", (32,))
    k.store(s, threadIdx.x, 1.0)
    k.fence_proxy_async()
    k.syncthreads()
    with k.elect_one():
        k.tma_store(m, (0,), s)
    t = api.generate(k).text
    assert "cb_tma_store(&m, " not in t and "cb_tma_store(&out_tmap, cb_smem_addr(s + 0), 0);" in t
    assert "cb_bulk_wait" not in t and "cb_tma_store_async" not in t


def test_clipped_tile_store_directly_in_the_staged_loop_stays_before_its_tma_store():
    """tma-store-drop-tile-bounds once moved such a store to the loop's exit, after the TMA store of
    its slot, so the TMA store sent stale data (the checker: PartialTileStore)."""
    import numpy as np
    from cbrules.ir.builder import Kernel, ceil_div, threadIdx
    from cbrules.ir.terms import call
    from cbrules.reference.interp import run
    from cbrules.schedule import schedule
    w = 32
    k = Kernel("doubled_rows_direct", block=256)
    n = k.symbol("N")
    x, out = k.tensor("x", (n, w)), k.tensor("out", (n, w))
    om = k.tensor_map(out, box=(8, w))
    k.grid(1)
    with k.loop("i", ceil_div(n, 8)) as i:
        row, col = threadIdx.x / w, threadIdx.x % w
        v = k.load(x, call("min", i * 8 + row, n - 1) * w + col)
        k.store(out, (i * 8 + row) * w + col, k.mul(v, 2.0), tile=(om, (i * 8, 0), row * w + col), clip=True)
    kg = api.lower(k)
    (loop,) = [s for s in schedule(kg).body if s.op == "for"]
    ops = [s.op for s in loop.body]
    assert ops.index("store") < ops.index("fence_proxy_async"), ops  # written before the writers' fence
    assert not kg.nodes("if") or all(kg[p].get("tag") != "tile-bounds" for p in kg.nodes("if"))
    xs = np.random.default_rng(1).standard_normal((29, w)).astype(np.float32)  # the last box ragged
    got = run(kg, {"x": xs, "out": np.full((29, w), np.nan, np.float32)})["out"]
    np.testing.assert_array_equal(got, 2 * xs)
    api.generate(k)  # codegen accepts the lowered kernel
