"""Debug-mode trace queries, as a Python API and on the command line."""
import pytest

from cbrules import api, trace
from cbrules.rewrite import rulefile
from cbrules.cli import main
from cbrules.kernels.exp1d import exp1d_tma
from rulekit import write_rules

RULES = """
(phases mark fence)
(graph-rule tag-loads
  :doc "mark the loads of shared tiles"
  :phase mark
  :match ((for ?L) (load ?l :src tile :in ?L))
  :where ((not (has ?l :tag)))
  :rewrite ((set ?l :tag "tile-read")))
(graph-rule fence-each-sync
  :doc "a fence before each block sync inside a loop"
  :phase fence
  :match ((for ?L) (syncthreads ?s :child-of ?L))
  :rewrite ((insert-before ?s (fence_proxy_async :as ?f))))
(graph-rule never
  :doc "needs a loop of 100 iterations"
  :phase fence
  :match ((for ?L :stop ?n) (syncthreads ?s :child-of ?L))
  :where ((known ?n) (>= ?n 100))
  :rewrite ((erase ?s)))
"""


@pytest.fixture()
def folder(tmp_path):
    write_rules(tmp_path / "r", RULES)
    return tmp_path / "r"


@pytest.fixture()
def lowered(folder):
    return api.lower(exp1d_tma(), rules=[folder], debug=True)


def test_records_hold_rule_location_bindings_and_changes(lowered, folder):
    recs = [r for r in lowered.trace.records if r.rule != "egglog"]
    assert [r.rule for r in recs] == ["tag-loads", "fence-each-sync"]
    tag, fence = recs
    assert tag.at == f"{folder / 'test.rules'}:2" and tag.phase == "mark" and tag.changed
    assert set(fence.bindings) == {"?L", "?s", "?f"} and len(fence.created) == 1
    assert fence.seconds > 0
    egg = [r for r in lowered.trace.records if r.rule == "egglog"]
    assert egg and any(v > 0 for r in egg for v in r.egg.values())  # egglog's per-rule match counts


def test_counts_and_filters(lowered):
    counts = {name: n for name, n, _ in trace.counts(lowered.trace)}
    assert counts["tag-loads"] == 1 and counts["fence-each-sync"] == 1 and "never" not in counts
    assert [r.rule for r in trace.select(lowered.trace, rule="fence-*")] == ["fence-each-sync"]
    assert all(r.phase == "mark" for r in trace.select(lowered.trace, phase="mark"))
    (load,) = lowered.nodes("load")
    assert [r.rule for r in trace.select(lowered.trace, node=load) if r.rule != "egglog"] == ["tag-loads"]


def test_history_back_to_the_builder(lowered):
    # the kernel's own fences publish its barrier init and order its reads before each refill; the rule's sits in the loop
    (fence,) = [n for n in lowered.nodes("fence_proxy_async") if lowered.op(lowered.parent(n)) == "for"]
    h = trace.history(lowered.trace, fence)
    assert "created by fence-each-sync" in h[0] and "test.rules:8" in h[0]
    (load,) = lowered.nodes("load")
    h = trace.history(lowered.trace, load)
    assert "built by the user at" in h[0] and "exp1d.py" in h[0]
    assert any("changed at step" in line and "by tag-loads" in line for line in h)


def test_why_not_names_the_failing_guard(lowered):
    sync = [n for n in lowered.nodes("syncthreads") if lowered.op(lowered.parent(n)) == "for"][0]
    msg = str(trace.why_not(lowered.trace, "never", sync))
    assert "guard (known ?n)" in msg and "test.rules:17:11" in msg  # the trip count is symbolic
    top_sync = [n for n in lowered.nodes("syncthreads") if lowered.parent(n) == lowered.root][0]
    msg = str(trace.why_not(lowered.trace, "fence-each-sync", top_sync))
    assert "pattern element (syncthreads ?s :child-of ?L)" in msg
    assert "never binds a exp node" in str(trace.why_not(lowered.trace, "never", lowered.nodes("exp")[0]))


def test_graph_at_step_and_stop_after(folder, lowered):
    f = next(r.step for r in lowered.trace.records if r.rule == "fence-each-sync")
    # two fences (the kernel's, after its barrier init and before each refill) before the rule's step,
    # three after it
    assert trace.program_at(lowered.trace, f - 1).count("fence_proxy_async") == 2
    assert trace.program_at(lowered.trace, f).count("fence_proxy_async") == 3
    early = api.lower(exp1d_tma(), rules=[folder], debug=True, stop_after=f - 1)
    assert len(early.nodes("fence_proxy_async")) == 2 and early.trace.records[-1].step == f - 1


def test_dot_shows_before_and_after(lowered):
    step = next(r.step for r in lowered.trace.records if r.rule == "fence-each-sync")
    dot = trace.to_dot(lowered.trace, step)
    assert dot.startswith("digraph") and "cluster_before" in dot and "cluster_after" in dot
    assert "#c8f7c5" in dot  # the created fence is highlighted


def test_debug_from_the_environment(folder, monkeypatch):
    monkeypatch.setenv("CBRULES_DEBUG", "1")
    assert api.lower(exp1d_tma(), rules=[folder]).trace is not None
    monkeypatch.setenv("CBRULES_DEBUG", "0")
    assert api.lower(exp1d_tma(), rules=[folder]).trace is None


def test_trace_cli(folder, capsys, tmp_path):
    r = ["--rules", str(folder)]
    assert main(["trace", "exp1d_tma", "counts", *r]) == 0
    assert "fence-each-sync" in capsys.readouterr().out
    assert main(["trace", "exp1d_tma", "log", "--rule", "tag-*", *r]) == 0
    out = capsys.readouterr().out
    assert "tag-loads" in out and "fence-each-sync" not in out
    assert main(["trace", "exp1d_tma", "cuda", *r]) == 0
    assert "cb_fence_proxy_async();  // fence-each-sync @ " in capsys.readouterr().out
    assert main(["trace", "exp1d_tma", "why-not", "--rule", "never", "--node", "15", *r]) == 0
    assert "never" in capsys.readouterr().out
    assert main(["trace", "exp1d_tma", "dot", "--step", "2", "-o", str(tmp_path / "s.dot"), *r]) == 0
    assert (tmp_path / "s.dot").read_text().startswith("digraph")
    assert main(["trace", "exp1d_tma", "history", *r]) == 2  # --node missing: a clear error
    assert "needs --node" in capsys.readouterr().err


def test_rules_cli(folder, tmp_path, capsys):
    assert main(["rules", "check", str(folder)]) == 0
    out = capsys.readouterr().out  # the folder's 3 rules, checked with the shipped ones
    shipped = len(rulefile.load().rules)
    assert f"ok: {shipped + 3} graph rules" in out and f"together with {folder}" in out
    assert main(["rules", "list", "--rules", str(folder)]) == 0
    assert "fence-each-sync" in capsys.readouterr().out
    bad = write_rules(tmp_path / "bad", "(phases p)\n(graph-rule x :phase p :match ((lod ?l)) :rewrite ((erase ?l)))\n")
    assert main(["rules", "check", str(tmp_path / "bad")]) == 1
    assert f"{bad}:2:32: unknown op 'lod'" in capsys.readouterr().err


def test_why_not_on_the_seed_rules():
    from cbrules.kernels import get
    kg = api.lower(get("single_dim").build(stages=2, prefetch=0), debug=True)
    loop = [n for n in kg.trace.initial.nodes("for")][0]
    with pytest.raises(trace.TraceQueryError) as gone:  # asked about a graph after the loop was erased
        trace.why_not(kg.trace, "cb-prologue", loop, max(kg.trace.graphs))
    assert "was erased at step" in str(gone.value) and "cb-drop-original" in str(gone.value)
    step = int(str(gone.value).split("--step ")[-1])
    msg = str(trace.why_not(kg.trace, "cb-prologue", loop, step))
    assert "guard (> ?P 0)" in msg and "circular_buffer.rules:" in msg and "with ?P=0" in msg
    # without a step: the last graph of the rule's phase that still holds the loop
    unasked = str(trace.why_not(kg.trace, "cb-prologue", loop))
    assert "guard (> ?P 0)" in unasked and "with ?P=0" in unasked and "in the graph after step" in unasked
