"""Saved traces: queries read them instead of lowering again; a hostile file is a named error."""
import json

import pytest

from cbrules import api, trace, tracefile
from cbrules.cli import main
from cbrules.kernels import get


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    kg = api.lower(get("pointwise").build(stages=2, war="mbarrier"), debug=True)
    path = tmp_path_factory.mktemp("t") / "pw.cbtrace"
    tracefile.save(kg.trace, path, "pointwise", "effective options: ...")
    return kg.trace, path


def same_graph(a, b):
    return a.nodes() == b.nodes() and all(a[n] == b[n] for n in a.nodes()) and \
        sorted(a.g.edges(data="kind")) == sorted(b.g.edges(data="kind")) and a.root == b.root


def test_a_saved_trace_reads_back_whole(saved):
    live, path = saved
    back, name, options = tracefile.load(path)
    assert (name, options) == ("pointwise", "effective options: ...")
    assert back.records == live.records and back.phases == live.phases and back.complete
    assert sorted(back.graphs) == sorted(live.graphs) and same_graph(back.initial, live.initial)
    assert all(same_graph(back.graphs[s], live.graphs[s]) for s in live.graphs)
    assert set(back.rules) == set(live.rules)
    assert back.rules["cb-main"].match == live.rules["cb-main"].match  # re-read, positions included


def test_queries_answer_the_same_from_the_file(saved):
    live, path = saved
    back, _, _ = tracefile.load(path)
    loop = live.initial.nodes("for")[0]
    step = next(r.step for r in live.records if r.rule == "cb-war-empty-barriers")
    for rule in ("cb-war-sync", "cb-prologue", "cb-full-barriers"):
        assert str(trace.why_not(back, rule, loop, step)) == str(trace.why_not(live, rule, loop, step))
    assert trace.history(back, 30) == trace.history(live, 30)
    assert trace.program_at(back, step) == trace.program_at(live, step)
    assert trace.counts(back) == trace.counts(live)


def test_the_command_line_saves_and_asks_the_file(tmp_path, capsys):
    path = tmp_path / "sd.cbtrace"
    assert main(["trace", "single_dim", "--stages", "2", "--save", str(path)]) == 0
    capsys.readouterr()
    assert main(["trace", str(path), "log", "--rule", "cb-main"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("effective options: loop i: stages=2") and "cb-main @" in out[1]
    assert main(["trace", str(path), "counts", "--stages", "3"]) == 2
    assert "is a saved trace: lowering options" in capsys.readouterr().err
    assert main(["trace", "single_dim", "--save", str(tmp_path / "x.json")]) == 1
    assert "ends in .cbtrace" in capsys.readouterr().err


def hostile(saved, tmp_path, change):
    doc = json.loads(saved[1].read_text())
    change(doc)
    path = tmp_path / "bad.cbtrace"
    path.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    return path


def set_node_attr(doc, key, value):
    doc["graphs"]["0"]["nodes"][1][1]["dict"].append([key, value])


@pytest.mark.parametrize("change, needle", [
    (lambda d: d.update(format="other"), "not a cbrules trace"),
    (lambda d: set_node_attr(d, "pred", {"term": ["call", [], "system"]}), "'system' is not a device function"),
    (lambda d: set_node_attr(d, "pred", {"term": ["+", [], None]}), "not a term: '+' with 0 operand(s)"),
    (lambda d: set_node_attr(d, "x", {"pickle": "cos\nsystem\n"}), "unknown value tag 'pickle'"),
    (lambda d: d["graphs"]["0"]["nodes"][1][1]["dict"].__setitem__(0, ["op", "evil_op"]), "is not a node"),
    (lambda d: d["graphs"]["0"]["edges"].append([0, 999, "contains"]), "joins no two nodes"),
    (lambda d: d["rules"].update({"x.rules": '(run 1000000)'}), "(run ...) is not allowed"),
    (lambda d: d["graphs"]["0"]["edges"].append([2, 1, "depends"]) or d["graphs"]["0"]["edges"].append(
        [1, 2, "depends"]), "a graph in it is not valid"),
])
def test_a_hostile_trace_file_is_a_named_error(saved, tmp_path, change, needle):
    with pytest.raises(tracefile.TraceFileError) as e:
        tracefile.load(hostile(saved, tmp_path, change))
    assert needle in str(e.value)


def first_record_with(doc, key):
    return next(r["dict"] for r in doc["records"] if any(k == key and v for k, v in r["dict"]))


def test_moves_are_recorded_and_a_trace_without_them_still_reads(saved, tmp_path):
    live, path = saved
    moves = [r for r in live.records if r.moved]
    assert moves and all(set(r.moved) <= set(r.changed) for r in moves)  # wrap moves a load under elect_one
    # a trace written before moves were recorded has no "moved" field: it reads back with none
    old = tracefile.load(hostile(saved, tmp_path, lambda d: [r["dict"].__delitem__(
        next(i for i, (k, _) in enumerate(r["dict"]) if k == "moved")) for r in d["records"]]))[0]
    assert all(r.moved == [] for r in old.records) and len(old.records) == len(live.records)


@pytest.mark.parametrize("bad", [["3"], -1, [-2], None, [True]])
def test_a_bad_moved_field_is_refused_by_name(saved, tmp_path, bad):
    def change(d):
        rec = first_record_with(d, "moved")
        rec[[k for k, _ in rec].index("moved")][1] = bad
    with pytest.raises(tracefile.TraceFileError) as e:
        tracefile.load(hostile(saved, tmp_path, change))
    assert "field 'moved' is" in str(e.value) and "not a list of node ids" in str(e.value)


def test_garbage_and_deep_nesting_are_named_errors(tmp_path, capsys):
    for text in ("not json", "[" * 100_000 + "]" * 100_000, '{"format": "cbrules-trace-1"}', "\udcff"):
        path = tmp_path / "junk.cbtrace"
        path.write_bytes(text.encode("utf-8", "surrogateescape"))
        with pytest.raises(tracefile.TraceFileError):
            tracefile.load(path)
    assert main(["trace", str(path), "counts"]) == 1
    assert capsys.readouterr().err.startswith("cbrules: TraceFileError: ")
