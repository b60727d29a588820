"""Hostile input, generated: rule files (random s-expressions, egglog commands, deep nesting, raw
bytes), names and options. Every example ends, within a time bound, either in success or in one of
the documented named errors; a rule folder never writes a file, and nothing unchecked reaches CUDA.

Fixed seeds and a fixed number of examples (the budget is a count, not a clock); failing examples
are kept in the saved example database (tests/hypothesis-db, see conftest.py) and replayed first.
"""
from __future__ import annotations

import json
import os
import signal
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from cbrules import api, cli, trace, tracefile
from cbrules.rewrite import rulefile
from cbrules.ir.terms import MAX_TERM_DEPTH, MAX_TERM_PARTS, DeviceFunctionError, Term, TermSyntaxError, extent, parse
from cbrules.kernels import KERNELS
from hostile import NAMED_ERRORS, hostile_term_text, identifiers_in_body, json_places, json_values, within

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGALRM"), reason="needs POSIX alarms for the time bound")
TIME_BOUND_S = 20  # generous: one example is a load (and maybe a lowering) of a small kernel
FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))


# ------------------------------------------------------------------------------ rule files
_WORDS = ["graph-rule", "phases", "phase", "disable", "datatype", "function", "relation", "ruleset",
          "rewrite", "birewrite", "rule", "let", "set", "union", "run", "run-schedule", "output", "input",
          "include", "extract", "check", "push", "pop", "fail", "sort", "Idx", "Num", "Add", "i64",
          "for", "if", "tma_load", "load", "store", "alloc", "insert-before", "erase", "move", "clone",
          "wrap", "call", "var", "str", "attr", "nth", "cb-stage", "cb-pipeline", "_", "true", "nil"]
_KEYS = [":phase", ":match", ":where", ":rewrite", ":after", ":before", ":doc", ":into", ":as",
         ":var", ":buf", ":dst", ":pred", ":annotations", ":stages", ":ruleset"]


def _quote(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


_atom = st.one_of(
    st.sampled_from(_WORDS + _KEYS),
    st.sampled_from(["?x", "?L", "?i", "?n"]),
    st.integers(-2 ** 70, 2 ** 70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12).map(_quote),
    st.sampled_from(['"N\\n#define exp(x) 0\\n"', '"atomicAdd((float*)0x1000, 1.0f)"', '"cb_s"', '"N"',
                     '"{?unbound}"', '"/etc/passwd"']),
)
_sexpr = st.recursive(st.one_of(_atom, st.just("()")),
                      lambda kids: st.lists(kids, min_size=1, max_size=6).map(lambda xs: "(" + " ".join(xs) + ")"),
                      max_leaves=30)


@st.composite
def hostile_rule_files(draw) -> bytes:
    """The bytes of one rule file: forms from the rule language's own words, egglog commands that
    must be refused, very deep nesting, or raw bytes (invalid UTF-8, NUL)."""
    kind = draw(st.sampled_from(["forms", "forms", "egglog", "deep", "bytes"]))
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    if kind == "deep":
        depth = draw(st.sampled_from([200, 1000, 10_000, 100_000]))
        inner = draw(st.sampled_from(["(Add ", "(", "(graph-rule r :match ("]))
        return (inner * depth + "x" + ")" * draw(st.sampled_from([0, depth]))).encode()
    forms = draw(st.lists(_sexpr, min_size=1, max_size=5))
    if kind == "egglog":
        leak = "LEAK_PATH"  # replaced by a path in the example's own folder, checked afterwards
        forms.append(draw(st.sampled_from([
            f'(output "{leak}" (Num 1))', f'(input Idx "{leak}")', f'(include "{leak}")',
            "(run 100000000)", "(run-schedule (saturate (run)))", "(push 1000000)",
            "(datatype T (A) (B T))\n(rewrite (A) (B (A)))\n(run 100000000)"])))
    return "\n".join(forms).encode()


def _expected(e: BaseException) -> bool:
    return isinstance(e, NAMED_ERRORS)


@seed(20261130)
@FUZZ
@given(hostile_rule_files())
def test_hostile_rule_file_ends_in_a_named_error_and_writes_nothing(data):
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp, "rules")
        folder.mkdir()
        leak = Path(tmp, "leaked")
        (folder / "hostile.rules").write_bytes(data.replace(b"LEAK_PATH", str(leak).encode()))
        before = sorted(Path(tmp).rglob("*"))
        try:
            with within(TIME_BOUND_S):
                rs = rulefile.load([rulefile.SHIPPED, folder], check_egglog=True)
                kg = api.lower(KERNELS["single_dim"].build(stages=2), rules=rs)
                api.generate(kg)
        except Exception as e:  # noqa: BLE001 - the assertion below names what is allowed
            assert _expected(e), f"{type(e).__name__} is not a documented named error: {e}"
        assert not leak.exists(), "a rule file wrote a file"
        assert sorted(Path(tmp).rglob("*")) == before, "loading rules changed the folder"


# ------------------------------------------------------------------------------ names
_hostile_text = st.one_of(
    st.text(max_size=20),
    st.sampled_from(["N\n#define exp(x) 0\n", "int", "__global__", "threadIdx", "cb_smem", "exp", "x y",
                     "a;b", "é", "_Reserved", "__x", "", "9lives", "a" * 300]),
)


@seed(20261130)
@FUZZ
@given(_hostile_text, st.sampled_from(["kernel", "symbol", "tensor", "loop", "alloc"]))
def test_hostile_name_is_refused_or_reaches_cuda_as_a_plain_identifier(text, where):
    from cbrules.ir.builder import Kernel, blockIdx, threadIdx
    try:
        with within(TIME_BOUND_S):
            k = Kernel(text if where == "kernel" else "fuzz", block=256)
            n = k.symbol(text if where == "symbol" else "N")
            x = k.tensor(text if where == "tensor" else "x", (n,))
            out = k.tensor("out", (n,))
            k.grid(1)
            tile = k.alloc(text if where == "alloc" else "tile", "shared", "float32", (256,))
            with k.loop(text if where == "loop" else "i", 2):
                k.store(tile, threadIdx.x, k.load(x, blockIdx.x * 256 + threadIdx.x))
                k.syncthreads()
                k.store(out, threadIdx.x, k.load(tile, threadIdx.x))
            src = api.generate(k).text
    except Exception as e:  # noqa: BLE001
        assert _expected(e), f"{type(e).__name__} is not a documented named error: {e}"
        return
    assert text in identifiers_in_body(src), f"{text!r} was accepted but does not appear as an identifier"


# ------------------------------------------------------------------------------ options
_value = st.one_of(st.integers(-2 ** 40, 2 ** 40), st.integers(-3, 9), st.floats(allow_nan=True),
                   st.booleans(), st.none(), st.text(max_size=6), st.just([2]))


@seed(20261130)
@FUZZ
@given(st.sampled_from(["single_dim", "pointwise", "inner_reduction"]), st.one_of(_value, st.just("auto")), _value,
       st.one_of(st.sampled_from(["sync", "mbarrier"]), st.text(max_size=8), st.integers()),
       st.one_of(st.booleans(), _value),
       st.one_of(st.none(), st.tuples(_value, _value), st.sampled_from([(40, 232), (24, 256), (41, 232)]), _value),
       st.sampled_from(["float32", "float16", "bfloat16", "float8", "int32"]))
def test_hostile_options_lower_or_end_in_a_named_error(kernel, stages, prefetch, war, ws, registers, dtype):
    try:
        with within(TIME_BOUND_S):
            k = KERNELS[kernel].build(stages=stages, prefetch=prefetch, war=war, warp_specialize=ws,
                                      registers=registers, dtype=dtype)
            api.generate(k)
    except Exception as e:  # noqa: BLE001
        assert _expected(e), f"{type(e).__name__} is not a documented named error: {e}"


_ARGS = ["demo", "kernels", "lower", "compile", "run", "check", "trace", "rules", "check", "list",
         "single_dim", "nope", "x.py", "--stages", "--prefetch", "--war", "--shape", "--rules", "-o",
         "--reps", "--size", "counts", "why-not", "--node", "--step", "1000", "-1", "2.5", "", "a,b",
         "/nonexistent/x.cu", "mbarrier", "--quiet", "auto", "--warp-specialize", "--registers", "40,232",
         "8,1000", "--dtype", "bfloat16", "float8", "--swizzle", "128B", "7B", "--tma-store", "--json",
         "--html", "--save", "ops", "--version", "--ptx"]


@seed(20261130)
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(argv=st.lists(st.sampled_from(_ARGS), max_size=7))
def test_hostile_command_lines_end_without_a_traceback(argv, capsys):
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)  # a relative -o lands here, never in the checkout
        try:
            with within(60):
                # `check KERNEL` interprets 4*S lowerings (seconds each): tests/test_hostile_cli.py has it
                code = cli.main(["lower" if i == 0 and a == "check" else a for i, a in enumerate(argv)])
        except SystemExit as e:  # argparse's usage errors
            code = e.code
        finally:
            os.chdir(cwd)
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    assert isinstance(code, int)


# ------------------------------------------------------------------------------ term text (issue 28)
@seed(20261201)
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(hostile_term_text())
def test_any_term_text_parses_within_the_bounds_or_is_a_named_error(text):
    try:
        with within(10):
            t = parse(text)
    except (TermSyntaxError, DeviceFunctionError) as e:
        assert "\n" not in str(e)
        return
    parts, height = extent(t)
    assert isinstance(t, Term) and height <= MAX_TERM_DEPTH and parts <= MAX_TERM_PARTS
    assert parse(str(t)) == t  # what parses prints back as the same term


@seed(20261201)
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(hostile_term_text())
def test_any_term_text_given_to_the_builder_is_built_or_a_named_error(text):
    from cbrules.ir.builder import Kernel
    k = Kernel("fuzz", block=32)
    n = k.symbol("N")
    x = k.tensor("x", (n,))
    try:
        with within(10):
            k.assign(k.load(x, text), dtype="int32")
    except Exception as e:  # noqa: BLE001
        assert _expected(e), f"{type(e).__name__} is not a documented named error: {e}"


# ------------------------------------------------------------------------------ saved traces (issue 28)
@pytest.fixture(scope="module")
def short_trace(tmp_path_factory):
    """A saved trace of a lowering's first steps, as JSON (quick to read back)."""
    kg = api.lower(KERNELS["single_dim"].build(stages=2), debug=True, stop_after=2)
    path = tmp_path_factory.mktemp("t") / "short.cbtrace"
    tracefile.save(kg.trace, path, "single_dim", "effective options: loop i: stages=2")
    doc = json.loads(path.read_text())
    doc["rules"] = {}  # reading its rule text back is most of the time a load takes
    return doc


@seed(20261201)
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_a_trace_file_with_any_value_replaced_loads_or_is_a_named_error(short_trace, tmp_path_factory, data):
    doc = json.loads(json.dumps(short_trace))
    places = json_places(doc)
    for _ in range(data.draw(st.integers(1, 3))):
        box, key = places[data.draw(st.integers(0, len(places) - 1))]
        box[key] = data.draw(json_values)
    path = tmp_path_factory.mktemp("fz") / "t.cbtrace"
    path.write_text(json.dumps(doc))
    try:
        with within(TIME_BOUND_S):
            t, _, _ = tracefile.load(path)
            trace.counts(t)
            [trace.describe(r) for r in t.records]
            trace.program_at(t, max(t.graphs, default=0))
    except Exception as e:  # noqa: BLE001
        assert _expected(e), f"{type(e).__name__} is not a documented named error: {e}"
        assert "\n" not in str(e)
