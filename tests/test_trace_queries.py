"""Sharper trace queries: node ids everywhere, why-not with expected vs actual and phases, exit codes, JSON."""
import json
import re

import pytest

from cbrules import api, trace
from cbrules.cli import main
from cbrules.rewrite.engine import LoweringError
from cbrules.kernels import get


@pytest.fixture(scope="module")
def mbar():
    return api.lower(get("single_dim").build(stages=2, war="mbarrier"), debug=True)


def step_of(t, rule):
    return next(r.step for r in t.records if r.rule == rule)


def test_every_node_shows_its_id_in_the_graph_and_the_cuda(mbar, capsys):
    lines = trace.program_at(mbar.trace, max(mbar.trace.graphs)).splitlines()
    ids = [int(re.match(r"\s*#(\d+) ", line).group(1)) for line in lines]
    assert sorted(ids) == sorted(mbar.nodes())
    assert main(["trace", "single_dim", "cuda", "--stages", "2"]) == 0
    cuda = capsys.readouterr().out
    noted = [line for line in cuda.splitlines() if " @ " in line and "//" in line]
    assert noted and all(re.search(r" #\d+( \(from .*\))?$", line) for line in noted)


def test_why_not_names_the_attribute_expected_and_actual(mbar):
    loop = mbar.trace.initial.nodes("for")[0]
    step = step_of(mbar.trace, "cb-war-empty-barriers")
    w = trace.why_not(mbar.trace, "cb-war-sync", loop, step)
    assert not w.matches and w.at.endswith(f"circular_buffer.rules:{w.at.split(':')[-2]}:11")
    assert w.detail == f'#{loop} :annotations :circular_buffer :war: wants "sync", has "mbarrier"'
    assert "(in its phase cb-stage)" in str(w)


def test_why_not_binds_the_variable_asked_for(mbar):
    loop = mbar.trace.initial.nodes("for")[0]
    step = step_of(mbar.trace, "cb-full-barriers") - 1
    assert trace.why_not(mbar.trace, "cb-full-barriers", loop, step, "?L").var == "?L"
    with pytest.raises(trace.TraceQueryError, match=r"rule cb-full-barriers binds \?K to a kernel node, not a for"):
        trace.why_not(mbar.trace, "cb-full-barriers", loop, step, "?K")
    with pytest.raises(trace.TraceQueryError, match=r"no node pattern binding \?LL \(did you mean '\?L'\?\)"):
        trace.why_not(mbar.trace, "cb-full-barriers", loop, step, "?LL")


def test_why_not_respects_phases(mbar):
    loop = mbar.trace.initial.nodes("for")[0]
    early = step_of(mbar.trace, "cb-default-prefetch")  # cb-normalize: cb-prologue's phase is later
    w = trace.why_not(mbar.trace, "cb-prologue", loop, early)
    assert not w.matches and "its phase cb-pipeline has not begun" in str(w)
    stage_done = max(r.step for r in mbar.trace.records if r.phase == "cb-stage")
    w = trace.why_not(mbar.trace, "cb-prologue", loop, stage_done)
    assert "its phase cb-pipeline has not begun" in str(w) and "there it would match" in str(w)
    fired = step_of(mbar.trace, "cb-prologue")
    w = trace.why_not(mbar.trace, "cb-prologue", loop, fired)
    assert w.matches and f"it fired on it at step {fired}" in str(w) and "(in its phase cb-pipeline)" in str(w)


@pytest.mark.parametrize("argv, needle", [
    (["why-not", "--rule", "cb-prologe", "--node", "2"], "unknown rule 'cb-prologe' (did you mean 'cb-prologue'?)"),
    (["log", "--rule", "cb-war-x"], "no rule matches 'cb-war-x' (did you mean 'cb-war-sync'?)"),
    (["log", "--phase", "cb-stag"], "unknown phase 'cb-stag' (did you mean 'cb-stage'?)"),
    (["history", "--node", "999"], "no node #999 in any graph of the trace"),
    (["log", "--node", "999"], "no node #999 in any graph of the trace"),
    (["graph", "--step", "999"], "no step 999"),
    # without --step why-not asks the last graph that holds the node; a step after its erasure is refused
    (["why-not", "--rule", "cb-prologue", "--node", "2", "--step", "20"],
     "#2 is not in the graph after step 20: it was erased at step 18"),
    (["counts", "--stop-after-phase", "cb-stag"], "no phase 'cb-stag' to stop after (did you mean 'cb-stage'?)"),
])
def test_queries_about_what_is_not_there_exit_non_zero(argv, needle, capsys):
    assert main(["trace", "single_dim", *argv]) == 1
    err = capsys.readouterr().err
    assert needle in err and len(err.splitlines()) == 1


def test_stop_after_phase():
    kg = api.lower(get("single_dim").build(stages=2), debug=True, stop_after_phase="cb-stage")
    phases = api.load_rules().phases
    seen = {r.phase for r in kg.trace.records}
    assert "cb-stage" in seen and seen <= set(phases[:phases.index("cb-stage") + 1])
    assert kg.trace.records[-1].rule == "egglog"  # the phase's simplification ran too
    assert [kg[n].get("part") for n in kg.nodes("for") if kg[n].get("annotations")] == [None]
    with pytest.raises(LoweringError, match="no phase 'nope'"):
        api.lower(get("single_dim").build(stages=2), stop_after_phase="nope")


def test_json_answers(capsys):
    assert main(["trace", "single_dim", "counts", "--json", "--stages", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["options"] == {"i": {"stages": 2, "prefetch": 1, "war": "sync"}}
    assert any(r["rule"] == "cb-main" and r["applications"] == 1 for r in out["answer"])
    assert main(["trace", "single_dim", "log", "--rule", "cb-main", "--json"]) == 0
    (rec,) = json.loads(capsys.readouterr().out)["answer"]
    assert rec["rule"] == "cb-main" and rec["phase"] == "cb-pipeline" and rec["created"]
    assert main(["trace", "single_dim", "why-not", "--rule", "cb-war-sync", "--node", "2", "--step", "1",
                 "--json"]) == 0
    w = json.loads(capsys.readouterr().out)["answer"]
    assert w["matches"] is False and w["var"] == "?L" and "wants" in w["detail"]


def test_text_queries_print_the_effective_options_first(capsys):
    assert main(["trace", "single_dim", "counts", "--stages", "2", "--war", "mbarrier"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == \
        "effective options: loop i: stages=2 prefetch=1 (rule default) war=mbarrier"
