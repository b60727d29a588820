"""Mutation tests: the checker can fail. A shipped rule is disabled or replaced by an altered copy
through a temporary user rule folder, and interpreting the lowered kernel must report the
matching protocol failure (or, for the control, nothing)."""
import subprocess
import sys

import numpy as np
import pytest

from cbrules.reference import protocol
from cbrules.reference.interp import run
from cbrules.kernels import KERNELS, SEED_MATRIX
from rulekit import Mutation, assert_caught, lower_case, mutation_folders

STAGES, PREFETCH, TRIPS = 3, 2, 7  # P >= 2 so a prologue one iteration short still loads something

# the body of cb-wait-before-first-read (rules/circular_buffer.rules) with the parity one phase off
WRONG_PARITY = """
(disable cb-wait-before-first-read)
(graph-rule mut-wait-wrong-parity
  :doc "every thread waits on full[i % S] with parity (i / S + 1) % 2: one phase off"
  :phase cb-stage
  :after (cb-tag-producer)
  :match ((for ?L :var ?i :part (absent) :annotations (:circular_buffer (:stages ?S :full ?full)))
          (alloc ?a :buf ?buf :stage "buffered")
          (tma_load :dst ?buf :in ?L)
          (first-reader ?c :of ?buf :in ?L))
  :rewrite ((insert-before ?c (mbarrier_wait :barrier ?full :slot (% (var ?i) ?S)
                                             :parity (% (+ (/ (var ?i) ?S) 1) 2) :stage "consumer"))))
"""

# the body of cb-arrive-expect-tx announcing DELTA bytes more than the loads deliver
WRONG_BYTES = """
(disable cb-arrive-expect-tx)
(graph-rule mut-arrive-wrong-bytes
  :doc "the elected thread arms full[i % S] with the wrong byte count"
  :phase cb-stage
  :after (cb-issue-under-elect-one)
  :match ((for ?L :var ?i :part (absent) :annotations (:circular_buffer (:stages ?S :full ?full)))
          (if ?p :tag "cb-issue" :child-of ?L)
          (sum ?bytes bytes (tma_load ?x) :in ?p)
          (no (mbarrier_arrive_expect_tx) :in ?p))
  :rewrite ((insert-at-entry ?p (mbarrier_arrive_expect_tx :barrier ?full :slot (% (var ?i) ?S)
                                                           :bytes (+ ?bytes DELTA)))))
"""

# cb-init-barriers' fence that makes the inits visible to the TMA unit (the async proxy), erased; the
# refill fences go too (the elected thread's fence before its first refill would publish the inits)
UNFENCED_INIT = """
(disable cb-fence-refill)
(graph-rule mut-init-unfenced
  :doc "the elected thread's fence.proxy.async after the barrier inits is dropped"
  :phase cb-stage
  :after (cb-init-barriers)
  :match ((fence_proxy_async ?f :part "pre-prologue"))
  :rewrite ((erase ?f)))
"""

# cb-prologue with :stop (- ?P 1). It runs in a phase of its own before cb-pipeline: in cb-pipeline
# the shipped rules come first in file order and cb-drop-original would erase its loop
SHORT_PROLOGUE = """
(disable cb-prologue)
(phase mut-prologue :before cb-pipeline)
(graph-rule mut-prologue-short
  :doc "prologue: for i in [0, P-1) only the producer: one tile short"
  :phase mut-prologue
  :match ((for ?L :part (absent) :annotations (:circular_buffer (:prefetch ?P :full ?full))))
  :where ((> ?P 0))
  :rewrite ((clone ?L :set (:part "prologue" :stop (- ?P 1)) :keep (_ :stage "producer"))))
"""

SYNC, MBARRIER = {"war": "sync"}, {"war": "mbarrier"}
MUTATIONS = {
    "control": Mutation("", (), SYNC),
    "drop-wait": Mutation("(disable cb-wait-before-first-read)\n", (protocol.RawHazard,), SYNC),
    "wrong-parity": Mutation(WRONG_PARITY, (protocol.Deadlock, protocol.RawHazard), MBARRIER),
    "expect-tx-too-many": Mutation(WRONG_BYTES.replace("DELTA", "4"), (protocol.TxMismatch,), SYNC),
    "expect-tx-too-few": Mutation(WRONG_BYTES.replace("DELTA", "-4"), (protocol.TxMismatch,), MBARRIER),
    "no-war-sync": Mutation("(disable cb-war-sync)\n", (protocol.WarHazard,), SYNC),
    "no-empty-barriers": Mutation("(disable cb-war-empty-barriers)\n", (protocol.WarHazard,), MBARRIER),
    "short-prologue": Mutation(SHORT_PROLOGUE, (protocol.Deadlock, protocol.RawHazard), SYNC),
    "unfenced-init": Mutation(UNFENCED_INIT, (protocol.UnfencedInit,), MBARRIER),
    "no-refill-fence": Mutation("(disable cb-fence-refill)\n", (protocol.UnfencedRefill,), SYNC),
    "no-refill-fence-mbarrier": Mutation("(disable cb-fence-refill)\n", (protocol.UnfencedRefill,), MBARRIER),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return mutation_folders(tmp_path_factory.mktemp("mutations"), MUTATIONS)


def _lower_and_run(kernel_name, mutation, folders):
    spec = KERNELS[kernel_name]
    _, kg, args = lower_case(spec, TRIPS, folders / mutation, stages=STAGES, prefetch=PREFETCH,
                             **MUTATIONS[mutation].build)
    return spec, args, run(kg, args)


@pytest.mark.parametrize("kernel", SEED_MATRIX)
@pytest.mark.parametrize("mutation", [m for m in MUTATIONS if m != "control"])
def test_mutation_is_caught(kernel, mutation, folders):
    e = assert_caught(lambda: _lower_and_run(kernel, mutation, folders), MUTATIONS[mutation].caught)
    # the report names the barrier and slot, and the iteration
    assert e.barrier and e.slot is not None and "iteration" in str(e)


@pytest.mark.parametrize("kernel", SEED_MATRIX)
def test_control_folder_runs_clean(kernel, folders):
    """The same machinery with an empty rule folder: clean, and equal to numpy."""
    spec, args, got = _lower_and_run(kernel, "control", folders)
    want = spec.reference(args)
    rtol, atol = spec.tolerance(spec.shape_for_trips(TRIPS))
    for out in spec.outputs:
        np.testing.assert_allclose(got[out], want[out], rtol=rtol, atol=atol)


def test_raw_hazard_names_the_first_read_of_the_unwaited_slot(folders):
    with pytest.raises(protocol.RawHazard) as e:
        _lower_and_run("single_dim", "drop-wait", folders)
    msg = str(e.value)
    assert "reads tile[0]" in msg and "cb_full_" in msg and "i=0 (main)" in msg and "block (0, 0, 0)" in msg
    assert e.value.slot == 0 and e.value.iteration == (("i", 0, "main"),)


def test_cli_check_fails_on_a_mutation_and_passes_without(folders):
    def check(*extra):
        return subprocess.run([sys.executable, "-m", "cbrules.cli", "check", "multi_dim", "--stages", "2",
                               "--war", "mbarrier", *extra], capture_output=True, text=True)
    good = check()
    assert good.returncode == 0, good.stdout + good.stderr
    assert "9 trip counts: 9 ok, 0 failed" in good.stdout
    bad = check("--rules", str(folders / "no-empty-barriers"))
    assert bad.returncode == 1 and "WarHazard" in bad.stdout, bad.stdout + bad.stderr
