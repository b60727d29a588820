"""The tensor-core matmul through the CPU checker: the lowered ``matmul_tc`` interpreted with its mma
run from the swizzled bytes the TMA model wrote, asynchronously, against numpy and the kernel before
lowering; the wgmma protocol model on its own; and mutations of the MMA rules, each caught with its
named failure."""
import dataclasses
import functools
import re
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from cbrules import api
from cbrules.check import Checker
from cbrules.ir.mma_layout import MMA_K, MMA_M, tma_tile_descriptor
from cbrules.kernels import KERNELS
from cbrules.kernels.matmul_tc import matmul_tc
from cbrules.reference import protocol
from cbrules.reference.hazards import Site
from cbrules.reference.interp import run
from cbrules.reference.interp_mma import MmaIssueError
from cbrules.reference.mma_groups import AccumulatorInFlight, MissingWgmmaFence, MmaInFlight, SwizzleMismatch
from rulekit import Mutation, assert_caught, lower_case, mutation_folders

SPEC = KERNELS["matmul_tc"]
STAGES, TRIPS = 3, 7  # more trips than stages: every slot is refilled while earlier tiles are in use

# a copy of mma-fence-commit (rules/mma.rules) that closes each group but never fences
NO_FENCE = """
(disable mma-fence-commit)
(graph-rule mut-commit-without-fence
  :doc "an mma closes a group after it; nothing fences before it"
  :phase cb-stage
  :after (cb-one-wait-per-stage mma-slot-operands)
  :match ((mma ?m :tag (absent)))
  :rewrite ((insert-after ?m (wgmma_commit :tag "cb-mma"))
            (set ?m :tag "cb-mma")))
"""

# the mma reads its tiles as 64-byte-swizzled rows; the TMA loads still write 128-byte swizzled ones
WRONG_SWIZZLE = """
(disable mma-reject-swizzle)  ; else the engine checks the mma again after cb-stage and refuses it
(graph-rule mut-mma-swizzle
  :doc "the mma reads with another swizzle than the TMA loads wrote"
  :phase cb-stage
  :after (mma-fence-commit)
  :match ((mma ?m :swizzle 128 :tag "cb-mma"))
  :rewrite ((set ?m :swizzle 64)))
"""

# the node claims one warp group computes the whole tile while two issue it
ONE_GROUP = """
(graph-rule mut-mma-one-group
  :doc "an mma whose groups attribute disagrees with the warp groups that issue it"
  :phase cb-stage
  :after (mma-fence-commit)
  :match ((mma ?m :groups 2 :tag "cb-mma"))
  :rewrite ((set ?m :groups 1)))
"""

WS = {"warp_specialize": True, "registers": (40, 232)}
MUTATIONS = {
    "control": Mutation(""),
    "control-ws": Mutation("", (), WS),
    "no-fence": Mutation(NO_FENCE, (MissingWgmmaFence,)),
    "no-fence-ws": Mutation(NO_FENCE, (MissingWgmmaFence,), WS),
    "wrong-swizzle": Mutation(WRONG_SWIZZLE, (SwizzleMismatch,)),
    # the slot is released (block sync / empty-barrier arrive at the end of the iteration) while the
    # group reading it is still in flight: no wait_group before the release
    "release-before-complete": Mutation("(disable mma-wait-each-group)\n", (protocol.WarHazard,)),
    "release-before-complete-ws": Mutation("(disable mma-release-after-completion)\n", (protocol.WarHazard,), WS),
    "one-group": Mutation(ONE_GROUP),  # not a protocol failure: see its own test
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return mutation_folders(tmp_path_factory.mktemp("mma-mutations"), MUTATIONS)


def _lower_and_run(mutation, folders, blocks="sample"):
    shape, kg, args = lower_case(SPEC, TRIPS, folders / mutation, "bfloat16", stages=STAGES,
                                 **MUTATIONS[mutation].build)
    return shape, args, run(kg, args, blocks=blocks)


@pytest.mark.parametrize("mutation", [m for m in MUTATIONS if MUTATIONS[m].caught])
def test_mma_mutation_is_caught_with_its_named_failure(mutation, folders):
    e = assert_caught(lambda: _lower_and_run(mutation, folders), MUTATIONS[mutation].caught)
    assert "iteration" in str(e)


def test_an_mma_node_that_does_not_fit_its_warp_groups_is_refused_by_name(folders):
    with pytest.raises(MmaIssueError, match=r"on 1 warp group\(s\) needs a float32 register array 'acc' of"):
        _lower_and_run("one-group", folders)


def test_a_missing_fence_names_the_accumulator_and_the_fix(folders):
    with pytest.raises(MissingWgmmaFence, match=r"issues an mma into acc but has not executed wgmma.fence"):
        _lower_and_run("no-fence", folders)


def test_an_early_release_names_the_mma_still_reading(folders):
    with pytest.raises(protocol.WarHazard, match=r"while the mma #\d+ of warp group \d may still read it"):
        _lower_and_run("release-before-complete", folders)


@pytest.mark.parametrize("mutation", ["control", "control-ws"])
def test_control_folder_runs_clean_and_equals_numpy(mutation, folders):
    shape, args, got = _lower_and_run(mutation, folders, blocks=None)
    rtol, atol = SPEC.tolerances(shape, "bfloat16")
    c = got["c"].astype(np.float64)
    assert not np.isnan(c).any()  # the output was poisoned: every element written
    np.testing.assert_allclose(c, SPEC.expected(args)["c"], rtol=rtol, atol=atol)


DENSE = dataclasses.replace(SPEC, factory=functools.partial(matmul_tc, store_swizzle=False))


@pytest.mark.parametrize("spec, stages, ws", [(SPEC, 2, False), (SPEC, 2, True), (SPEC, 4, False),
                                              (DENSE, 2, True), (DENSE, 3, False)],
                         ids=["swizzled-S2", "swizzled-S2-ws", "swizzled-S4", "dense-S2-ws", "dense-S3"])
def test_check_passes_for_trip_counts_0_to_4S(spec, stages, ws):
    """``cbrules check matmul_tc`` in-process: every trip count 0..4S ok (short K loops run predicated),
    with the default swizzled epilogue staging and with dense staging."""
    checker = Checker(blocks="sample", dtype="bfloat16")
    for trips in range(0, 4 * stages + 1):
        res = checker.check(spec, trips, stages, warp_specialize=ws, registers=(40, 232) if ws else None)
        assert res.ok and res.status == "ok", f"trips {trips}: {res.status} {res.detail}"


def test_cli_check_fails_on_a_mutation_and_passes_without(folders):
    def check(*extra):
        return subprocess.run([sys.executable, "-m", "cbrules.cli", "check", "matmul_tc", "--dtype", "bfloat16",
                               "--stages", "2", "--sample", *extra], capture_output=True, text=True)
    good = check()
    assert good.returncode == 0, good.stdout + good.stderr
    assert "9 trip counts: 9 ok, 0 failed" in good.stdout
    bad = check("--rules", str(folders / "no-fence"))
    assert bad.returncode == 1 and "MissingWgmmaFence" in bad.stdout, bad.stdout + bad.stderr


# ----------------------------------------------------------------------------- the wgmma model on its own

def _site():
    return Site(7, "test mma", (0, 0, 0))


@pytest.fixture
def proto():
    p = protocol.BlockProtocol(256, {}, {"tile": (np.dtype(ml_dtypes.bfloat16), 4096, True)})
    return p


WG0, WG1 = np.arange(128), np.arange(128, 256)


def test_fence_rules(proto):
    g = proto.mma
    reads = [(proto.shared["tile"], np.arange(64))]
    with pytest.raises(MissingWgmmaFence, match="has not executed wgmma.fence"):
        g.issue(1, 0, WG0, "acc", reads, 128, _site)
    g.register_access("acc", WG0, True, _site)  # zeroing the accumulator
    g.fence(WG0)
    g.issue(1, 0, WG0, "acc", reads, 128, _site)
    g.issue(2, 0, WG0, "acc", reads, 128, _site)  # a chain on one accumulator needs no fence between
    g.commit(0)
    g.wait(0, WG0, 0)
    g.register_access("acc", WG0[:5], True, _site)  # an ordinary write after the fence ...
    with pytest.raises(MissingWgmmaFence, match="thread 0 wrote accumulator acc after its last wgmma.fence"):
        g.issue(3, 0, WG0, "acc", reads, 128, _site)
    g.fence(WG0)
    g.issue(3, 0, WG0, "acc", reads, 128, _site)  # ... is fine once fenced


def test_wait_group_counts_groups_empty_ones_too(proto):
    g, tile = proto.mma, proto.shared["tile"]
    g.fence(WG0)
    g.issue(1, 0, WG0, "acc", [(tile, np.arange(0, 100))], 128, _site)
    g.commit(0)
    g.commit(0)  # an empty group
    g.issue(2, 0, WG0, "acc", [(tile, np.arange(100, 200))], 128, _site)
    g.commit(0)
    g.wait(0, WG0, 2)  # completes the first group only
    g.check_overwrite(tile, np.arange(0, 100), "a refill of", _site)
    with pytest.raises(protocol.WarHazard, match=r"tile\[100\] while the mma #2 of warp group 0"):
        g.check_overwrite(tile, np.arange(100, 101), "a refill of", _site)
    with pytest.raises(AccumulatorInFlight, match="warp group 0 reads accumulator acc while the mma #2"):
        g.register_access("acc", WG0, False, _site)
    g.register_access("acc", WG1, False, _site)  # the other warp group's registers are its own
    with pytest.raises(MmaInFlight, match="mma #2 of warp group 0"):
        g.finish(_site)
    g.wait(0, WG0, 0)
    g.check_overwrite(tile, np.arange(100, 200), "a refill of", _site)
    g.register_access("acc", WG0, False, _site)
    g.finish(_site)


def test_completion_records_the_reads_for_the_ordinary_war_check(proto):
    """After wait_group the reads count as the warp group's at that time: a refill by a thread that
    is not ordered after the wait is still a WAR hazard."""
    g, tile = proto.mma, proto.shared["tile"]
    g.fence(WG0)
    g.issue(1, 0, WG0, "acc", [(tile, np.arange(64))], 128, _site)
    g.commit(0)
    g.wait(0, WG0, 0)
    read = tile.read_clocks()
    assert (read[:64, :128] == proto.clocks.now[:128]).all() and (read[:64, 128:] == -1).all()
    assert (read[64:] == -1).all()


def test_the_next_block_forgets_the_reads_and_records_its_own(proto):
    """The element x thread read marks are not refilled between blocks (the next block's epoch lies
    above them): the reads of one block do not count in the next, and the next block's reads do."""
    tile = proto.shared["tile"]
    proto.read(tile, np.arange(128) % 64, WG0, _site)
    proto.clocks.sync_all()
    proto.read(tile, np.arange(64, 192), WG1, _site)
    unordered = lambda u: protocol._first_unordered(tile.readers, 0, 4096, proto.clocks.view_of(u) + tile.epoch)  # noqa: E731
    assert unordered(0) == (64, 128)  # thread 128's read of [64] is not ordered before thread 0
    proto.reset()
    assert (tile.read_clocks() == -1).all() and unordered(0) is None
    proto.read(tile, np.array([7]), np.array([5]), _site)
    assert unordered(0) == (7, 5) and unordered(5) is None
    assert tile.read_clocks()[7, 5] == 0 and (tile.read_clocks() >= 0).sum() == 1


def test_an_mma_reading_another_swizzle_than_the_tma_wrote_is_named(proto):
    g, tile = proto.mma, proto.shared["tile"]
    g.tma_written(tile, 0, 1024, 128)
    g.fence(WG0)
    g.issue(1, 0, WG0, "acc", [(tile, np.arange(1024))], 128, _site)
    with pytest.raises(SwizzleMismatch, match=r"reads tile\[0\] as a tile with 64B swizzle, but the TMA load that "
                                              r"wrote it used 128B swizzle"):
        g.issue(2, 0, WG0, "acc", [(tile, np.arange(1024))], 64, _site)
    g.tma_written(tile, 1024, 1024, 0)
    with pytest.raises(SwizzleMismatch, match="used no swizzle"):
        g.issue(3, 0, WG0, "acc", [(tile, np.arange(1024, 1100))], 128, _site)
    g.stored(tile, np.arange(1024, 1100), WG1, _site)  # threads wrote them since: no TMA layout to compare
    g.issue(4, 0, WG0, "acc", [(tile, np.arange(1024, 1100))], 128, _site)
    with pytest.raises(protocol.WarHazard, match=r"thread 128 writes tile\[0\] while the mma #1"):
        g.stored(tile, np.arange(0, 10), WG1, _site)  # ... but not while an mma reads them


# ----------------------------------------------------------------------------- codegen against the model

_DESC_CALL = re.compile(r"cb_wgmma_desc\(cb_([ab]) \+ (\d+), (\d+), (\d+)\)")
_GROUP_ROWS = re.compile(r"const unsigned cb_a = .*\(\(int\)threadIdx\.x / 128\) \* (\d+);")


@pytest.mark.parametrize("bm, bn, bk, groups", [(128, 256, 64, 2), (256, 128, 64, 2), (128, 64, 32, 1),
                                                (64, 128, 16, 1)])
def test_generated_descriptors_are_the_models(bm, bn, bk, groups):
    """Every descriptor the CUDA builds (constant fields | start >> 4, per 64-row block and k-step) is
    the one the CPU model reads the TMA-written tile through (:func:`tma_tile_descriptor`), and each
    warp group starts its A rows where the model does: a descriptor fact wrong in either fails here."""
    k = SPEC.build((2 * bm, bn, 4 * bk), dtype="bfloat16", stages=2, bm=bm, bn=bn, bk=bk, groups=groups)
    text = api.generate(k).text
    span, rows = 2 * bk, bm // groups
    nodes = _GROUP_ROWS.findall(text)  # one per mma statement (the loop's parts each have theirs)
    assert nodes and {int(x) for x in nodes} == {rows * span}
    calls = _DESC_CALL.findall(text)
    steps = [(j, s) for j in range(rows // MMA_M) for s in range(bk // MMA_K)]
    assert len(calls) == 2 * len(steps) * len(nodes), text
    for (j, s), (a, b) in zip(steps * len(nodes), zip(calls[::2], calls[1::2])):
        for (which, off, hi, lo), start, box_rows in ((a, MMA_M * j * span, bm), (b, 0, bn)):
            want = tma_tile_descriptor(start, box_rows, span, "k", s)
            assert (int(hi) << 32 | int(lo)) | (int(off) >> 4) == want.encode(), (which, j, s)
