"""Warp-specialized kernels in the interpreter: the roles run as concurrent threads of control
under every schedule, the lowered kernels compute what numpy does, and the protocol checker fails
on mutated lowerings (the consumers' empty arrive dropped, a consumer sync left block-wide, the
producer's empty wait skipped)."""
import subprocess
import sys

import numpy as np
import pytest

from cbrules.reference import protocol
from cbrules.check import Checker, trip_counts
from cbrules.reference.interp import SCHEDULES, run
from cbrules.reference.interp_roles import UnknownSchedule
from cbrules.kernels import KERNELS, SEED_MATRIX
from rulekit import Mutation, assert_caught, lower_case, mutation_folders

STAGES, TRIPS = 3, 7  # more trips than stages: every slot is refilled after its first use

# each mutation runs in a phase of its own right after the warp-specialization rules
DROP_EMPTY_ARRIVE = """
(phase mut-ws :after cb-warp-specialize)
(graph-rule mut-drop-empty-arrive
  :doc "the consumers never free a slot after reading it"
  :phase mut-ws
  :match ((for ?L :part "consumer") (mbarrier_arrive ?a :stage "war" :child-of ?L))
  :rewrite ((erase ?a)))
"""
SKIP_EMPTY_WAIT = """
(phase mut-ws :after cb-warp-specialize)
(graph-rule mut-skip-empty-wait
  :doc "the producer refills a slot without waiting until the consumers freed it"
  :phase mut-ws
  :match ((for ?P :part "producer") (if ?w :tag "cb-refill-wait" :child-of ?P))
  :rewrite ((erase ?w)))
"""
MUTATIONS = {
    "drop-empty-arrive": Mutation(DROP_EMPTY_ARRIVE, (protocol.Deadlock,)),
    "block-wide-consumer-sync": Mutation("(disable cb-ws-consumer-syncs cb-ws-consumer-reductions)\n",
                                         (protocol.Deadlock, protocol.DivergentSync)),
    # eager: the producer re-arms a slot whose load is still in flight; otherwise it refills a slot being read
    "skip-empty-wait": Mutation(SKIP_EMPTY_WAIT, (protocol.WarHazard, protocol.TooManyArrivals)),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return mutation_folders(tmp_path_factory.mktemp("ws-mutations"), MUTATIONS)


def lowered(kernel_name, rules=None, trips=TRIPS, stages=STAGES, registers=None):
    spec = KERNELS[kernel_name]
    shape, kg, args = lower_case(spec, trips, rules, stages=stages, warp_specialize=True, registers=registers)
    return spec, shape, kg, args


@pytest.mark.parametrize("kernel", SEED_MATRIX)
@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_mutation_is_caught_under_every_schedule(kernel, mutation, folders):
    _, _, kg, args = lowered(kernel, rules=[folders / mutation])
    for schedule in SCHEDULES:
        assert_caught(lambda: run(kg, args, schedule=schedule, seed=3), MUTATIONS[mutation].caught)


def test_sync_left_block_wide_deadlocks_with_both_roles_named(folders):
    _, _, kg, args = lowered("single_dim", rules=[folders / "block-wide-consumer-sync"])
    with pytest.raises(protocol.Deadlock) as e:
        run(kg, args, schedule="lazy")
    msg = str(e.value)
    assert "bar.sync 0, 384" in msg and "every role is blocked" in msg and "producer (threads 256..383)" in msg


def test_dropped_empty_arrive_names_the_empty_barrier(folders):
    _, _, kg, args = lowered("single_dim", rules=[folders / "drop-empty-arrive"])
    with pytest.raises(protocol.Deadlock) as e:
        run(kg, args, schedule="eager")
    msg = str(e.value)  # the consumers wait for a load the producer cannot issue: both are named
    assert "every role is blocked" in msg and "of cb_empty_" in msg and "i=3 (producer)" in msg


def test_short_loops_do_not_need_the_mutated_arrive(folders):
    """With no more trips than stages no slot is refilled: the pre-freed slots are enough."""
    spec, shape, kg, args = lowered("single_dim", rules=[folders / "drop-empty-arrive"], trips=STAGES)
    got = run(kg, args, schedule="eager")
    np.testing.assert_allclose(got["out"], spec.reference(args)["out"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kernel", SEED_MATRIX)
def test_checker_passes_every_trip_count_and_schedule(kernel):
    """`cbrules check KERNEL --warp-specialize`: trips 0..4S, all blocks, every schedule (S=2 here;
    the CLI test below does S=3 and registers)."""
    checker = Checker()
    results = [checker.check(KERNELS[kernel], t, 2, warp_specialize=True) for t in trip_counts(2)]
    bad = [f"trips {r.trips}: {r.detail}" for r in results if r.status != "ok"]
    assert not bad, "\n".join(bad)


def test_schedules_interleave_differently():
    """eager lets the producer fill every slot before a consumer reads; lazy issues each load only
    when a consumer waits for it. Seen from the number of loads in flight at a consumer's wait."""
    from cbrules.reference import interp
    spec, shape, kg, args = lowered("single_dim", trips=TRIPS)
    seen = {}
    original = interp._BlockRunner._mbarrier_wait

    def spy(self, s, mask):
        if s.attrs["barrier"].startswith("cb_full_"):
            seen.setdefault(self.schedule, []).append(sum(len(q) for q in self.proto.bars.inflight))
        return original(self, s, mask)
    interp._BlockRunner._mbarrier_wait = spy
    try:
        for schedule in SCHEDULES:
            run(kg, args, schedule=schedule, seed=5, blocks=[0])
    finally:
        interp._BlockRunner._mbarrier_wait = original
    assert max(seen["eager"]) == STAGES and max(seen["lazy"]) <= 1


def test_unknown_schedule_is_refused():
    spec, shape, kg, args = lowered("single_dim", trips=2)
    with pytest.raises(UnknownSchedule, match="eager, lazy, random"):
        run(kg, args, schedule="fastest")


def test_cli_check_warp_specialized():
    out = subprocess.run([sys.executable, "-m", "cbrules.cli", "check", "matmul", "--stages", "3",
                          "--warp-specialize", "--registers", "40,232", "--sample"], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "schedules eager, lazy, random" in out.stdout and "13 trip counts: 13 ok, 0 failed" in out.stdout
