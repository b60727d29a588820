"""The two proxies in the CPU checker: shared memory that threads write with generic stores and the async
proxy then reads (a TMA store's source, a wgmma operand) needs a ``fence.proxy.async`` by every writer and
a barrier from the writers' fences to the issuing thread. Mutations of the TMA-store epilogue of every
shipped kernel that has one (rules/tma_store.rules, matmul_tc's mma_store staging included) drop the fence,
drop the barrier, or put a barrier over the wrong warps: each is a named failure, and the unmutated kernels
stay clean. Hand-built kernels check the same for a wgmma reading thread-written tiles."""
import numpy as np
import pytest

from cbrules import api
from cbrules.ir.builder import Kernel, threadIdx
from cbrules.ir.builder_mma import fragment_coords
from cbrules.ir.terms import call
from cbrules.kernels import KERNELS
from cbrules.reference import protocol
from cbrules.reference.interp import run
from rulekit import Mutation, mutation_folders

TRIPS, STAGES = 3, 2


def _at_store_barrier(rewrite: str, extra: str = "") -> str:
    """A rule that rewrites the block sync between the staging writes and the TMA store of each staged loop."""
    return f"""
(graph-rule mut-store-barrier
  :doc "the staging loop's sync before its TMA store, altered"
  :phase tma-store
  :after (tma-store-stage)
  :match ((kernel ?K :block ?block)
          (for ?L :annotations (:tma_store (:stage ?stage)))
          (syncthreads ?s :tag "cb-store" :child-of ?L){extra})
  :rewrite ({rewrite}))
"""


MUTATIONS = {
    # name: (rule text, failure when warp-specialized, failure otherwise); None: must run clean
    "control": ("", None, None),
    "no-fence": ("""
(graph-rule mut-no-store-fence
  :doc "the writers' fence.proxy.async before the TMA store, dropped"
  :phase tma-store
  :after (tma-store-stage)
  :match ((fence_proxy_async ?f :tag "cb-store"))
  :rewrite ((erase ?f)))
""", protocol.UnfencedProxyWrite, protocol.UnfencedProxyWrite),
    "no-barrier": (_at_store_barrier("(erase ?s)"), protocol.UnorderedProxyRead, protocol.UnorderedProxyRead),
    # a named barrier over warp 0 alone: the elected thread and its warp's writes are ordered, no other's
    "barrier-over-warp-0": (_at_store_barrier('(replace ?s (if :pred (< (var "threadIdx.x") 32) '
                                              '(bar_sync :id 3 :count 32)))'),
                            protocol.UnorderedProxyRead, protocol.UnorderedProxyRead),
    # every writer reaches a named barrier whose count is one warp: an arrival-count mismatch
    "barrier-count-one-warp": (_at_store_barrier("(replace ?s (bar_sync :id 3 :count 32))"),
                               protocol.TooManyArrivals, protocol.TooManyArrivals),
    # warp-specialized: the consumers' named barrier widened to the whole block, producer warp included,
    # which never reaches the consumers' epilogue: a deadlock (without warp specialization it does not apply)
    "barrier-with-the-producer": ("""
(phase mut-late :after cb-warp-specialize)
(graph-rule mut-store-barrier-whole-block
  :doc "the consumers' barrier before the TMA store counts every thread of the block"
  :phase mut-late
  :match ((kernel ?K :block ?block :tag "cb-warp-specialized")
          (for ?L :annotations (:tma_store (:stage ?stage)))
          (bar_sync ?s :id 2 :child-of ?L))
  :rewrite ((replace ?s (bar_sync :id 3 :count (nth ?block 0)))))
""", protocol.Deadlock, None),
}

# every shipped kernel with a TMA-store epilogue, in the variants that stage differently: element types
# (the staging buffer's), swizzled staging, warp-specialized or not
VARIANTS = [(name, dict(dtype=dt, tma_store=True, warp_specialize=ws))
            for name in ("single_dim", "multi_dim", "pointwise", "two_pass")
            for dt, ws in (("float32", False), ("bfloat16", True))]
VARIANTS += [("single_dim", dict(dtype="float16", tma_store=True, warp_specialize=False)),
             ("multi_dim", dict(dtype="bfloat16", tma_store=True, swizzle="128B", warp_specialize=False)),
             ("matmul_tc", dict(dtype="bfloat16", warp_specialize=False)),
             ("matmul_tc", dict(dtype="float16", warp_specialize=True, registers=(40, 232)))]
IDS = [f"{n}-{o['dtype']}{'-ws' if o['warp_specialize'] else ''}{'-' + o['swizzle'] if 'swizzle' in o else ''}"
       for n, o in VARIANTS]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Each mutation's rules, read once (with the shipped rules)."""
    base = mutation_folders(tmp_path_factory.mktemp("proxy-mutations"),
                            {m: Mutation(v[0]) for m, v in MUTATIONS.items()})
    return {m: api.load_rules([base / m]) for m in MUTATIONS}


def _lower_and_run(name, options, mutation, folders, blocks=(0,)):
    """Lower ``name`` (a small problem, TRIPS iterations) with ``mutation``'s rules; run ``blocks`` (a list
    of blocks, or "sample": the first, middle and last)."""
    spec = KERNELS[name]
    shape = spec.shape_for_trips(TRIPS)
    kg = api.lower(spec.build(shape, trips=TRIPS, stages=STAGES, **options), rules=folders[mutation])
    args = spec.make_inputs(shape, np.random.default_rng(0), options["dtype"])
    return spec, shape, args, run(kg, args, blocks=blocks if isinstance(blocks, str) else list(blocks))


CASES = [(m, v) for m in MUTATIONS if m != "control" for v in range(len(VARIANTS))
         if MUTATIONS[m][1 if VARIANTS[v][1]["warp_specialize"] else 2] is not None]


@pytest.mark.parametrize("mutation,variant", CASES, ids=[f"{m}-{IDS[v]}" for m, v in CASES])
def test_a_proxy_mutation_is_a_named_failure(mutation, variant, folders):
    name, options = VARIANTS[variant]
    want = MUTATIONS[mutation][1 if options["warp_specialize"] else 2]
    with pytest.raises(protocol.ProtocolError) as e:
        _lower_and_run(name, options, mutation, folders)
    assert type(e.value) is want, f"{type(e.value).__name__}: {e.value}"
    assert f"#{e.value.node}" in str(e.value) and "iteration" in str(e.value)
    if isinstance(e.value, protocol.ProxyHazard):  # the writer, the reader, the buffer and the fix
        msg = str(e.value)
        assert e.value.buffer.startswith("cb_stage_") and f"{e.value.buffer}[{e.value.element}]" in msg
        assert f"#{e.value.writer}" in msg and f"TMA store #{e.value.reader}" in msg
        assert ("fence_proxy_async after its stores" if want is protocol.UnfencedProxyWrite
                else "put a syncthreads, or a bar_sync") in msg


@pytest.mark.parametrize("variant", range(len(VARIANTS)), ids=IDS)
def test_the_unmutated_epilogues_run_clean(variant, folders):
    name, options = VARIANTS[variant]
    spec, shape, args, got = _lower_and_run(name, options, "control", folders, blocks="sample")
    assert any(not np.isnan(got[out].astype(np.float32)).all() for out in spec.outputs)  # it stored tiles


def test_the_first_unfenced_element_names_its_writer_and_thread(folders):
    with pytest.raises(protocol.UnfencedProxyWrite) as e:
        _lower_and_run("multi_dim", dict(dtype="float32", tma_store=True, warp_specialize=False), "no-fence", folders)
    msg = str(e.value)
    assert "issued by thread 0 reads cb_stage_" in msg and f"which thread {e.value.thread} wrote" in msg
    assert "iteration j=0" in msg and "block (0, 0, 0)" in msg


# ------------------------------------------------------------------------------ wgmma reading thread-written tiles
def _thread_written_mma(order: str = "sync", fence: bool = True, groups: int = 1, rewrite: str = "") -> Kernel:
    """c[64 * groups, 8] = a @ b^T with a [64 * groups, 16] and b [8, 16] copied into shared tiles by the
    threads (at their 32-byte swizzled places, as the mma reads them), then fenced (``fence``) and
    ordered by ``order``: "sync" a block sync, "none" nothing, "split" one named barrier per warp group
    (ids 1, 2: no warp group sees the other's writes), "mbarrier" every thread arrives on an mbarrier and
    every thread waits for its phase. ``rewrite``: warp group 0 writes b_t again, "in-flight" before the
    wgmma.wait_group, "after-wait" right after it, "after-sync" after the wait and a block sync."""
    block = 128 * groups
    k = Kernel("tw_mma", block=block)
    a, b = k.tensor("a", (64 * groups, 16), "bfloat16"), k.tensor("b", (8, 16), "bfloat16")
    c = k.tensor("c", (64 * groups, 8))
    at = k.alloc("a_t", "shared", "bfloat16", (64 * groups, 16), align=1024)
    bt = k.alloc("b_t", "shared", "bfloat16", (8, 16), align=1024)
    acc = k.mma_accumulator(64 * groups, 8)
    if order == "mbarrier":
        bar = k.alloc("bar", "shared", "mbarrier", (1,))
        with k.elect_one():
            k.mbarrier_init(bar, 0, block)
            k.fence_mbarrier_init()
        k.syncthreads()
    tid = threadIdx.x
    with k.loop("e", 64 * groups * 16 // block, kind="unroll") as e:
        i = e * block + tid
        k.store(at, call("swizzle", i, 2, 32), k.load(a, i))
    with k.if_(tid.lt(128)):
        k.store(bt, call("swizzle", tid, 2, 32), k.load(b, tid))
    if fence:
        k.fence_proxy_async()
    if order == "sync":
        k.syncthreads()
    elif order == "split":
        for g in range(groups):
            with k.if_((tid / 128).eq(g)):
                k.bar_sync(1 + g, 128)
    elif order == "mbarrier":
        k.mbarrier_arrive(bar, 0)
        k.mbarrier_wait(bar, 0, 0)
    k.wgmma_fence()
    k.mma(acc, at, bt)
    k.wgmma_commit()
    if rewrite == "in-flight":
        with k.if_(tid.lt(128)):
            k.store(bt, tid, 0.0)
    k.wgmma_wait(0)
    if rewrite in ("after-wait", "after-sync"):
        if rewrite == "after-sync":
            k.syncthreads()
        with k.if_(tid.lt(128)):
            k.store(bt, tid, 0.0)
    if order == "mbarrier":
        k.syncthreads()
        with k.elect_one():
            k.mbarrier_inval(bar, 0)
    with k.loop("r", 4, kind="unroll") as r:
        row, col = fragment_coords(8, 64, 0, r, tid % 128)
        k.store(c, (row + (tid / 128) * 64) * 8 + col, k.load(acc, r))
    return k


def _mma_args(groups: int, rng):
    import ml_dtypes
    a = rng.standard_normal((64 * groups, 16)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((8, 16)).astype(ml_dtypes.bfloat16)
    return {"a": a, "b": b, "c": np.full((64 * groups, 8), np.nan, np.float32)}


@pytest.mark.parametrize("order,groups", [("sync", 1), ("sync", 2), ("mbarrier", 1)])
def test_fenced_and_ordered_thread_written_tiles_feed_the_mma(order, groups):
    args = _mma_args(groups, np.random.default_rng(1))
    got = run(_thread_written_mma(order, groups=groups), args)["c"]
    want = args["a"].astype(np.float32) @ args["b"].astype(np.float32).T
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("order,fence,groups,failure", [
    ("sync", False, 1, protocol.UnfencedProxyWrite),
    ("none", True, 1, protocol.UnorderedProxyRead),
    ("split", True, 2, protocol.UnorderedProxyRead),  # each warp group's barrier leaves out the other's writes
    ("mbarrier", False, 1, protocol.UnfencedProxyWrite),
])
def test_an_mma_reading_unpublished_thread_writes_is_a_named_failure(order, fence, groups, failure):
    with pytest.raises(protocol.ProtocolError) as e:
        run(_thread_written_mma(order, fence, groups), _mma_args(groups, np.random.default_rng(2)))
    assert type(e.value) is failure, f"{type(e.value).__name__}: {e.value}"
    assert e.value.buffer in ("a_t", "b_t") and f"the mma #{e.value.reader} of warp group" in str(e.value)


def test_a_fence_by_the_issuer_alone_does_not_publish_the_other_threads_stores():
    """The writer fences: a fence after the barrier, by the issuing threads, orders their own accesses only."""
    k = Kernel("late_fence", block=128)
    out = k.tensor("out", (32,))
    m = k.tensor_map(out, box=(32,))
    s = k.alloc("s", "shared", "float32", (32,))
    with k.if_(threadIdx.x.lt(32)):
        k.store(s, 31 - threadIdx.x, 1.0)
    k.syncthreads()
    with k.elect_one():
        k.fence_proxy_async()
        k.tma_store(m, (0,), s)
    with pytest.raises(protocol.UnfencedProxyWrite, match=r"which thread 31 wrote with a generic store"):
        run(k, {"out": np.zeros(32, np.float32)})


@pytest.mark.parametrize("rewrite,groups,failure", [
    ("in-flight", 1, protocol.WarHazard),  # the tensor cores may still read it
    ("after-wait", 2, protocol.WarHazard),  # warp group 1's wait for its mma reading b_t is not ordered before
    ("after-wait", 1, None),  # ... one warp group is ordered after its own wait
    ("after-sync", 2, None),
])
def test_a_thread_written_tile_is_rewritten_only_after_the_mma_reading_it(rewrite, groups, failure):
    kernel, args = _thread_written_mma(groups=groups, rewrite=rewrite), _mma_args(groups, np.random.default_rng(3))
    if failure is None:
        run(kernel, args)
        return
    with pytest.raises(failure, match=r"mma #\d+ (of warp group \d may still read it|of warp group 1 read)"):
        run(kernel, args)


def test_cli_check_names_the_unfenced_write(tmp_path, capsys):
    from cbrules.cli import main
    folder = mutation_folders(tmp_path, {"no-fence": Mutation(MUTATIONS["no-fence"][0])}) / "no-fence"
    assert main(["check", "single_dim", "--stages", "2", "--tma-store", "--rules", str(folder)]) == 1
    out = capsys.readouterr().out
    assert "UnfencedProxyWrite: " in out and "no fence.proxy.async followed in that thread" in out
