"""Tensor-core matmul on the CPU: the mma nodes and builder calls, the rules' pipeline around them (slot
operands, fence/commit, the release of a slot once its MMA group completed), the CUDA and its NVRTC
compile (no spills), descriptor and fragment facts, and every refusal with its named error."""
import itertools

import numpy as np
import pytest

from cbrules import api
from cbrules.cli import main
from cbrules.codegen.mma import descriptor_fields
from cbrules.ir.builder import BuildError, Kernel, ceil_div, circular_buffer
from cbrules.ir.builder_mma import fragment_coords
from cbrules.ir.limits import TmaLimitError
from cbrules.ir.order import sibling_order
from cbrules.ir.terms import evaluate
from cbrules.kernels import KERNELS, SEED_MATRIX, UnsupportedDtypeError
from cbrules.kernels.matmul_tc import MatmulTileError, matmul_tc
from cbrules.rewrite.engine import LoweringError

WS = dict(warp_specialize=True, registers=(40, 232))


def test_acceptance_command_compiles_with_wgmma_setmaxnreg_and_a_tma_store(capsys):
    assert main(["compile", "matmul_tc", "--dtype", "bfloat16", "--stages", "4", "--warp-specialize",
                 "--registers", "40,232"]) == 0
    out = capsys.readouterr().out
    assert "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16" in out
    assert "setmaxnreg.inc.sync.aligned.u32 232" in out and "setmaxnreg.dec.sync.aligned.u32 40" in out
    assert "cb_tma_store_async(&c_tmap" in out
    assert "0/0 B spill stores/loads" in out


def _consumer_loop(kg):
    loop = next(n for n in kg.nodes("for") if kg[n].get("part") == "consumer")
    return loop, [kg.op(c) for c in sibling_order(kg, loop)]


def test_consumer_keeps_one_mma_group_in_flight():
    kg = api.lower(matmul_tc(stages=4, **WS))
    loop, ops = _consumer_loop(kg)
    # wait for the slot, fence, issue, commit, let one group stay pending, then release the previous slot
    assert ops == ["mbarrier_wait", "wgmma_fence", "mma", "wgmma_commit", "wgmma_wait", "if", "if"], ops
    waits = [kg[c]["pending"] for c in sibling_order(kg, loop) if kg.op(c) == "wgmma_wait"]
    assert waits == [1]
    ifs = [c for c in sibling_order(kg, loop) if kg.op(c) == "if"]
    release, last = ([kg.op(x) for x in sibling_order(kg, i)] for i in ifs)
    assert release == ["mbarrier_arrive"] and str(kg[ifs[0]]["pred"]) == "t > 0"
    assert last == ["wgmma_wait", "mbarrier_arrive"]
    mma = next(c for c in sibling_order(kg, loop) if kg.op(c) == "mma")
    assert str(kg[mma]["a_offset"]) == "t % 4 * 8192" and str(kg[mma]["b_offset"]) == "t % 4 * 16384"


def test_previous_slot_is_released():
    src = api.generate(matmul_tc(stages=3, **WS)).text
    assert "cb_mbar_arrive(cb_smem_addr(&cb_empty_6[(t + 2) % 3]));" in src
    # one group in flight; the last iteration waits for all; so does the code after the loop (a no-op
    # there, which lets ptxas see every group complete before the accumulators are read)
    assert src.count("cb_wgmma_wait<1>();") == 1 and src.count("cb_wgmma_wait<0>();") == 2
    assert "C7518" not in api.compile(matmul_tc(stages=3, **WS)).cubin.log  # no serialized wgmma


@pytest.mark.parametrize("war", ["sync", "mbarrier"])
def test_without_warp_specialization_each_group_completes_before_the_slot_is_released(war):
    kg = api.lower(matmul_tc(stages=3, war=war))
    for loop in (n for n in kg.nodes("for") if kg[n].get("part") in ("main", "epilogue")):
        ops = [kg.op(c) for c in sibling_order(kg, loop)]
        i = ops.index("wgmma_commit")
        assert ops[i - 2:i + 2] == ["wgmma_fence", "mma", "wgmma_commit", "wgmma_wait"], ops


@pytest.mark.parametrize("kw", [dict(stages=2), dict(stages=5, bn=128), dict(stages=4, dtype="float16"),
                                dict(stages=4, out_dtype="float32"), dict(stages=3, bm=64, bn=128, groups=1),
                                dict(stages=3, bn=64, bk=16), dict(stages=3, bm=256, bn=128),
                                dict(stages=3, war="sync"), dict(stages=3, war="mbarrier")],
                         ids=lambda kw: "-".join(f"{k}{v}" for k, v in kw.items()))
def test_variants_compile_without_spills(kw):
    ws = {} if "war" in kw else WS
    ck = api.compile(matmul_tc(**kw, **ws))
    r = ck.cubin.resources
    assert r.spill_stores == 0 and r.spill_loads == 0 and r.stack_bytes == 0
    assert ck.source.shared_bytes <= 232448
    assert "wgmma.mma_async" in ck.source.text


def test_descriptor_fields_for_each_swizzle():
    # LBO 16 B (field 1), SBO 8 rows of the span, swizzle mode in bits 62-63 (1 = 128B, 2 = 64B, 3 = 32B)
    assert descriptor_fields(128, 128) == (1 << 16) | (64 << 32) | (1 << 62)
    assert descriptor_fields(64, 64) == (1 << 16) | (32 << 32) | (2 << 62)
    assert descriptor_fields(256, 32) == (1 << 16) | (16 << 32) | (3 << 62)


@pytest.mark.parametrize("bn,groups", [(16, 1), (256, 2)])
def test_fragment_coordinates_cover_the_tile_once(bn, groups):
    # the m64nNk16 f32 layout: every (row, column) of the tile is held by exactly one (thread, register)
    rows = 64
    seen = set()
    for tid, r in itertools.product(range(128 * groups), range(bn // 2)):
        row, col = fragment_coords(bn, rows, 0, r, "tid")
        seen.add((evaluate(row, {"tid": tid}), evaluate(col, {"tid": tid})))
    assert seen == {(i, j) for i in range(rows * groups) for j in range(bn)}


def test_fragment_coordinates_are_the_models():
    # the builder's terms and the interpreter's layout (cbrules.ir.mma_layout) name the same element
    from cbrules.ir import mma_layout
    for tid, r in itertools.product(range(128), range(32)):
        row, col = fragment_coords(64, 64, 0, r, "tid")
        assert (evaluate(row, {"tid": tid}), evaluate(col, {"tid": tid})) == \
            tuple(int(x) for x in mma_layout.fragment_coords(tid, r, 64))


def test_matmul_tc_is_no_seed_kernel_and_takes_only_half_types():
    assert "matmul_tc" in KERNELS and "matmul_tc" not in SEED_MATRIX
    with pytest.raises(UnsupportedDtypeError, match="matmul_tc"):
        KERNELS["matmul_tc"].build(dtype="float32")


@pytest.mark.parametrize("kw,needle", [
    (dict(bk=128), "bk=128"), (dict(stages=5), "more than the 232448"), (dict(out_dtype="float64"), "float64"),
    (dict(groups=5), "groups=5"), (dict(group_m=0), "group_m=0"), (dict(dtype="float32"), "float32")])
def test_tile_refusals(kw, needle):
    with pytest.raises(MatmulTileError, match=needle):
        matmul_tc(**kw)


def test_k_must_give_16_byte_row_pitches():
    ck = api.compile(matmul_tc(stages=4, **WS))
    args = KERNELS["matmul_tc"].make_inputs((500, 1000, 300), np.random.default_rng(0), "bfloat16")
    with pytest.raises(TmaLimitError, match="a_tmap"):
        ck.check(**args)


def _tc_kernel(swizzle="128B", load_b=True, block=256, bn=128):
    k = Kernel("t", block=block)
    m, n, kk = k.symbol("M"), k.symbol("N"), k.symbol("K")
    a, b = k.tensor("a", (m, kk), "bfloat16"), k.tensor("b", (n, kk), "bfloat16")
    a_map = k.tensor_map(a, box=(128, 64), swizzle=swizzle)
    b_map = k.tensor_map(b, box=(bn, 64), swizzle="128B")
    a_t = k.alloc("a_t", "shared", "bfloat16", (128, 64), align=1024)
    b_t = k.alloc("b_t", "shared", "bfloat16", (bn, 64), align=1024)
    acc = k.mma_accumulator(128, bn)
    if not load_b:  # written by the threads before the loop: no TMA load under a barrier orders it for the MMA
        with k.loop("z", bn * 64, kind="thread-x", step=block) as z:
            k.store(b_t, z, 0.0)
    with k.loop("t", ceil_div(kk, 64), circular_buffer=circular_buffer(3, warp_specialize=True)) as t:
        k.tma_load(a_map, (0, t * 64), a_t)
        if load_b:
            k.tma_load(b_map, (0, t * 64), b_t)
        k.mma(acc, a_t, b_t)
    return k


def test_a_tile_read_in_another_swizzle_is_refused():
    with pytest.raises(LoweringError) as e:
        api.lower(_tc_kernel(swizzle="none"))
    assert e.value.code == "mma-swizzle" and "a_t" in str(e.value) and "swizzle none" in str(e.value)
    assert "rules/mma.rules" in str(e.value)


def test_an_operand_the_loop_does_not_load_is_refused():
    # (loaded once before the loop under a barrier it is accepted: test_register_mma.py)
    with pytest.raises(LoweringError) as e:
        api.lower(_tc_kernel(load_b=False))
    assert e.value.code == "mma-unbuffered-operand" and "b_t" in str(e.value)


def test_builder_refusals():
    with pytest.raises(BuildError, match="whole warp groups"):
        _tc_kernel(block=96)
    with pytest.raises(BuildError, match="N = 8..256"):
        _tc_kernel(bn=12)
    k = Kernel("t", block=128)
    a = k.alloc("a_t", "shared", "bfloat16", (64, 64), align=1024)
    b = k.alloc("b_t", "shared", "float16", (64, 64), align=1024)
    acc = k.mma_accumulator(64, 64)
    with pytest.raises(BuildError, match="different types"):
        k.mma(acc, a, b)
    with pytest.raises(BuildError, match="not an accumulator"):
        k.mma(a, a, a)
    f = k.alloc("f_t", "shared", "float32", (64, 64))
    with pytest.raises(BuildError, match="two-dimensional shared tile"):
        k.mma(acc, f, f)


def test_epilogue_stores_are_clipped_by_the_tma_store_not_tested_per_element():
    src = api.generate(matmul_tc(stages=4, **WS)).text
    body = src[src.index("acc_q"):src.index("cb_tma_store_async(&c_tmap")]
    assert " < M" not in body and " < N" not in body  # no bounds test: the TMA store clips the box


def test_without_staging_the_tile_stores_keep_their_bounds_test(tmp_path):
    (tmp_path / "off.rules").write_text("(disable tma-store-stage)\n")
    src = api.generate(matmul_tc(stages=4, **WS), rules=[str(tmp_path)]).text
    assert "< M" in src and "< N" in src and "cb_tma_store" not in src.split("extern")[1]


def test_clip_needs_a_tile():
    k = Kernel("t", block=128)
    n = k.symbol("N")
    x = k.tensor("x", (n,))
    with pytest.raises(BuildError, match="clip=True needs tile="):
        k.store(x, 0, 1.0, clip=True)


def test_persistent_blocks_count_their_iterations_across_tiles():
    src = api.generate(matmul_tc(stages=4, persistent=132, **WS)).text.split('extern "C"')[1]
    g = "((tile - (int)blockIdx.x) / 132 * cb_ceil_div(K, 64) + t)"
    consumer, producer = src.split("} else {")[-2:]
    assert f"cb_mbar_wait(cb_smem_addr(&cb_full_7[{g} % 4]), {g} / 4 % 2);" in consumer
    assert f"cb_mbar_wait(cb_smem_addr(&cb_empty_7[{g} % 4]), {g} / 4 % 2);" in producer
    assert "for (int tile = (int)blockIdx.x;" in producer  # the producer walks the same tiles
    # barriers initialised once before the roles, slots freed once before the walk, invalidated at the end
    assert src.count("cb_mbar_init(") == 2 and src.count("cb_mbar_inval(") == 2
    assert consumer.index("for (int cb_k = 0;") < consumer.index("for (int tile =") < consumer.index("cb_mbar_inval(")


def test_persistent_variants_compile_without_spills_or_serialized_wgmma():
    for kw in (dict(stages=4), dict(stages=4, out_dtype="float32"), dict(stages=5, bn=128)):
        ck = api.compile(matmul_tc(persistent=132, **kw, **WS))
        r = ck.cubin.resources
        assert r.spill_stores == 0 and r.stack_bytes == 0 and "C7518" not in ck.cubin.log, kw


@pytest.mark.parametrize("kw,needle", [(dict(persistent=-1, **WS), "persistent=-1"),
                                       (dict(persistent=True, **WS), "persistent=True")])
def test_persistent_refusals(kw, needle):
    with pytest.raises(MatmulTileError, match=needle):
        matmul_tc(**kw)


def _walk_kernel(depth=1, bounds_use_outer=False):
    k = Kernel("t", block=256)
    m, n, kk = k.symbol("M"), k.symbol("N"), k.symbol("K")
    a, b = k.tensor("a", (m, kk), "bfloat16"), k.tensor("b", (n, kk), "bfloat16")
    a_map = k.tensor_map(a, box=(128, 64), swizzle="128B")
    b_map = k.tensor_map(b, box=(128, 64), swizzle="128B")
    a_t = k.alloc("a_t", "shared", "bfloat16", (128, 64), align=1024)
    b_t = k.alloc("b_t", "shared", "bfloat16", (128, 64), align=1024)
    acc = k.mma_accumulator(128, 128)
    def body(o):
        stop = ceil_div(kk, 64) + o if bounds_use_outer else ceil_div(kk, 64)
        with k.loop("t", stop, circular_buffer=circular_buffer(3, warp_specialize=True)) as t:
            k.tma_load(a_map, (0, t * 64), a_t)
            k.tma_load(b_map, (0, t * 64), b_t)
            k.mma(acc, a_t, b_t)
    with k.loop("o", 4) as o:
        if depth > 1:
            with k.loop("p", 2):
                body(o)
        else:
            body(o)
    return k


@pytest.mark.parametrize("kw,code", [(dict(depth=2), "ws-nested"), (dict(bounds_use_outer=True), "ws-nested-trips")])
def test_walk_refusals(kw, code):
    with pytest.raises(LoweringError) as e:
        api.lower(_walk_kernel(**kw))
    assert e.value.code == code, str(e.value)


def test_a_walk_of_one_level_lowers():
    assert api.generate(_walk_kernel()).text.split('extern "C"')[1].count("cb_mbar_init(") == 2


def _walk_spec(bn=128):
    import dataclasses
    import functools
    # 2 persistent blocks walking the tiles of a 300 x 392 output: every tile after the first re-enters
    # the K loop and the epilogue's chunk loop
    return dataclasses.replace(KERNELS["matmul_tc"], factory=functools.partial(matmul_tc, persistent=2, bn=bn),
                               shape_for_trips=lambda t: (300, 392, 64 * t - 8))


@pytest.mark.parametrize("trips,ws,bn", [(1, True, 128), (4, True, 128), (3, False, 128), (3, True, 192)])
def test_persistent_walk_passes_the_checker(trips, ws, bn):
    # bn=192: three store chunks a tile, so each tile's first chunk writes the staging slot the last
    # tile's last store may still read (tma-store-wait-on-reentry waits for it)
    from cbrules.check import Checker
    r = Checker(dtype="bfloat16").check(_walk_spec(bn), trips, 3, warp_specialize=ws,
                                        registers=(40, 232) if ws else None)
    assert r.ok, f"{r.status} {r.detail}"


def test_reentered_staging_loop_with_an_odd_trip_count_waits_first():
    def body(bn):
        src = api.generate(matmul_tc(stages=3, persistent=2, bn=bn, **WS)).text
        return src[src.index("for (int tile ="):]
    odd, even = body(192), body(256)  # 3 and 4 column chunks a tile
    assert odd.index("cb_bulk_wait_read<0>();") < odd.index("for (int acc_q")
    assert even.index("for (int acc_q") < even.index("cb_bulk_wait_read<0>();")  # only the per-chunk wait


def test_a_walk_whose_phases_restart_each_tile_fails_the_checker(tmp_path):
    # the mutation: slots and phases counted from 0 again at every tile while the barriers run on
    from cbrules.check import Checker
    (tmp_path / "off.rules").write_text("(disable cb-ws-walk-running-count)\n")
    r = Checker(dtype="bfloat16", rules=[str(tmp_path)]).check(_walk_spec(), 4, 3, warp_specialize=True)
    assert not r.ok and r.status == "FAIL", r.detail
