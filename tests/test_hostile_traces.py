"""Hostile saved traces (issue 28): a trace file is input, validated on load as strictly as a rule
file. Every wrong-typed field is a one-line TraceFileError naming the field, so that no query
(counts, log, history, dot --step, graph, cuda, --html) ever crashes on what it reads; a FIFO is
refused without blocking, as a trace to read and as one to write."""
import json
import os

import pytest

from cbrules import api, cli, tracefile
from cbrules.kernels import get
from hostile import within

QUERIES = [["counts"], ["log"], ["log", "--json"], ["history", "--node", "2"], ["dot", "--step", "1"], ["graph"],
           ["cuda"], ["why-not", "--rule", "cb-main", "--node", "2", "--step", "1"]]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    kg = api.lower(get("single_dim").build(stages=2), debug=True)
    path = tmp_path_factory.mktemp("t") / "sd.cbtrace"
    tracefile.save(kg.trace, path, "single_dim", "effective options: loop i: stages=2")
    return json.loads(path.read_text())


def _record(doc, key, value):
    for kv in doc["records"][0]["dict"]:
        if kv[0] == key:
            kv[1] = value


def _origin(doc, value):
    """Replace the origin of the first rule-made node of the last graph."""
    last = doc["graphs"][max(doc["graphs"], key=int)]
    for _, attrs in last["nodes"]:
        for kv in attrs["dict"]:
            if kv[0] == "origin" and ["by", "rule"] in kv[1]["dict"]:
                kv[1] = value
                return


def _loop_stop(doc, value):
    for _, attrs in doc["graphs"]["0"]["nodes"]:
        if ["op", "for"] in attrs["dict"]:
            for kv in attrs["dict"]:
                if kv[0] == "stop":
                    kv[1] = value


# (change, what the one-line error must say)
BAD_FIELDS = {
    "seconds a string": (lambda d: _record(d, "seconds", "0.1"), "field 'seconds' is '0.1' (str)"),
    "seconds NaN": (lambda d: _record(d, "seconds", float("nan")), "field 'seconds' is nan (float)"),
    "seconds negative": (lambda d: _record(d, "seconds", -1.0), "field 'seconds' is -1.0"),
    "created an int": (lambda d: _record(d, "created", 5), "field 'created' is 5 (int)"),
    "created a bool id": (lambda d: _record(d, "created", [True]), "field 'created' is [True]"),
    "rule a list": (lambda d: _record(d, "rule", ["a"]), "field 'rule' is ['a'] (list)"),
    "rule with a newline": (lambda d: _record(d, "rule", "x\ncbrules: ok"), "field 'rule' is 'x\\ncbrules: ok'"),
    "rule with ESC": (lambda d: _record(d, "rule", "x\x1b[2J"), "field 'rule' is 'x\\x1b[2J'"),
    "rule 2,000,000 long": (lambda d: _record(d, "rule", "r" * 2_000_000), "field 'rule' is 'rrrr"),
    "step a string": (lambda d: _record(d, "step", "1"), "field 'step' is '1' (str)"),
    "step zero": (lambda d: _record(d, "step", 0), "field 'step' is 0 (int)"),
    "bindings a tuple": (lambda d: _record(d, "bindings", {"tuple": [1, 2]}), "field 'bindings' is (1, 2) (tuple)"),
    "bindings of ints": (lambda d: _record(d, "bindings", {"dict": [["?L", 2]]}), "field 'bindings' is {'?L': 2}"),
    "egg a list": (lambda d: _record(d, "egg", [1]), "field 'egg' is [1] (list)"),
    "origin by=rule without rule": (lambda d: _origin(d, {"dict": [["by", "rule"]]}),
                                    "an origin by=rule needs at, rule, step"),
    "origin by an int": (lambda d: _origin(d, {"dict": [["by", 5]]}), "origin 'by' is 5, not build or rule"),
    "origin step a string": (lambda d: _origin(d, {"dict": [["by", "rule"], ["rule", "r"], ["at", "f:1"],
                                                            ["step", "3"]]}), "origin field 'step' is '3' (str)"),
    "origin with an unknown field": (lambda d: _origin(d, {"dict": [["by", "build"], ["evil", 1]]}),
                                     "origin by=build has no field 'evil'"),
    "loop stop NaN": (lambda d: _loop_stop(d, {"term": ["const", [], float("nan")]}), "stop holds the constant nan"),
    "loop stop text": (lambda d: _loop_stop(d, "abc"), "stop holds 'abc', which is not a term"),
    "phases an int": (lambda d: d.update(phases=5), "field 'phases' is 5 (int), not list"),
    "kernel a list": (lambda d: d.update(kernel=[1]), "field 'kernel' is [1] (list), not str"),
    "complete a string": (lambda d: d.update(complete="yes"), "field 'complete' is 'yes' (str), not bool"),
    "records a dict": (lambda d: d.update(records={}), "field 'records' is {} (dict), not list"),
    "options with a newline": (lambda d: d.update(options="a\nb"), "one line of text"),
    "graphs without step 0": (lambda d: d["graphs"].pop("0"), "graphs keyed by step numbers from 0"),
    "a record with a missing field": (lambda d: d["records"][0]["dict"].pop(0), "not a rule application"),
}


def _write(tmp_path, doc):
    path = tmp_path / "bad.cbtrace"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("case", list(BAD_FIELDS))
def test_a_wrong_field_is_a_one_line_error_naming_it(saved, tmp_path, case):
    change, needle = BAD_FIELDS[case]
    doc = json.loads(json.dumps(saved))
    change(doc)
    with pytest.raises(tracefile.TraceFileError) as e:
        with within(10):
            tracefile.load(_write(tmp_path, doc))
    assert needle in str(e.value) and "\n" not in str(e.value) and "\x1b" not in str(e.value), str(e.value)


@pytest.mark.parametrize("case", ["seconds a string", "bindings a tuple", "loop stop NaN"])
def test_no_query_crashes_on_a_wrong_field(saved, tmp_path, capsys, case):
    doc = json.loads(json.dumps(saved))
    BAD_FIELDS[case][0](doc)
    path = str(_write(tmp_path, doc))
    for query in [*QUERIES, ["--html", str(tmp_path / "x.html")]]:
        with within(10):
            assert cli.main(["trace", path, *query]) == 1, query
        err = capsys.readouterr().err
        assert err.startswith("cbrules: TraceFileError: ") and err.count("\n") == 1, (query, err)
    assert not (tmp_path / "x.html").exists()


def test_the_queries_answer_from_a_good_file(saved, tmp_path, capsys):
    path = str(_write(tmp_path, saved))
    for query in (["log"], ["dot", "--step", "1"], ["why-not", "--rule", "cb-main", "--node", "2", "--step", "1"]):
        assert cli.main(["trace", path, *query]) == 0, (query, capsys.readouterr().err)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs POSIX FIFOs")
def test_a_fifo_is_refused_as_a_trace_to_read_and_to_write(tmp_path, capsys):
    fifo = tmp_path / "t.cbtrace"
    os.mkfifo(fifo)
    with within(10):
        assert cli.main(["trace", str(fifo), "counts"]) == 1
        assert "a FIFO (named pipe); cbrules reads only regular files" in capsys.readouterr().err
        assert cli.main(["trace", "single_dim", "--stages", "2", "--save", str(fifo)]) == 1
        assert "TraceFileError: cannot write" in capsys.readouterr().err
        for out in (["--html", str(fifo)], ["dot", "--step", "1", "-o", str(fifo)]):
            assert cli.main(["trace", "single_dim", *out, "--stages", "2"]) == 2
            assert "a FIFO (named pipe); cbrules writes an output only to" in capsys.readouterr().err
