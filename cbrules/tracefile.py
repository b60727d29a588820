"""Saving a lowering trace to a file and reading it back, so queries need not lower again.

A ``.cbtrace`` file is JSON: the graphs (nodes with their attributes, edges), the records, the
phases and the text of the rule files whose graph rules the trace names (why-not matches them
again). Values are tagged (tuples, dictionaries, terms, kernel parameters) and rebuilt only from
those shapes: reading a trace runs no code from it, and a file that is not a trace this version
wrote is a :class:`TraceFileError`. Every graph read back passes the structural checks.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any, Callable

from .rewrite.engine import Application, Trace
from .errors import CbrulesError
from .ir.graph import CONTAINS, DEPENDS, KernelGraph, Param
from .ir.ops import OPS
from .rewrite.rulefile import from_texts
from .sexpr import MAX_FILE_BYTES, RuleError
from .ir.terms import BINARY_OPS, UNARY_OPS, Term, call_problem
from .ir.verify import GraphError, verify_values
from .userio import printable, read_regular, write_text

SUFFIX = ".cbtrace"
FORMAT = "cbrules-trace-1"
MAX_TRACE_BYTES = 512 * 2 ** 20  # the largest built-in kernel's trace is a few MiB


class TraceFileError(CbrulesError):
    """A trace file that cannot be written, or read back as a trace."""


class _Invalid(ValueError):
    """A field of a trace file that is not what :func:`save` writes (said in the message)."""


def save(trace: Trace, path: str | os.PathLike, kernel: str, options: str) -> None:
    """Write ``trace`` (of ``kernel``, lowered with the effective ``options`` line) to ``path``."""
    if not str(path).endswith(SUFFIX):
        raise TraceFileError(f"{path}: a saved trace's name ends in {SUFFIX}, so that queries recognise it")
    texts = {}
    for f in trace.files:  # in reading order: a folder's phases refer to those read before
        try:
            texts[f] = Path(f).read_text(encoding="utf-8")
        except OSError as e:
            raise TraceFileError(f"cannot read rule file {f} to save it with the trace: {e.strerror or e}") from None
    graphs = {"0": _graph(trace.initial), **{str(s): _graph(g) for s, g in trace.graphs.items()}}
    doc = {"format": FORMAT, "kernel": kernel, "options": options, "phases": trace.phases,
           "complete": trace.complete, "rules": texts, "graphs": graphs,
           "records": [_value(dataclasses.asdict(r)) for r in trace.records]}
    try:  # never into a FIFO: nobody may read it
        write_text(path, json.dumps(doc, separators=(",", ":"), allow_nan=False), "a saved trace")
    except (OSError, ValueError) as e:
        raise TraceFileError(f"cannot write {printable(path)}: {getattr(e, 'strerror', None) or e}") from None


def load(path: str | os.PathLike) -> tuple[Trace, str, str]:
    """(trace, kernel name, effective options line) read back from a file :func:`save` wrote."""
    where = printable(path)
    try:  # a FIFO or device is refused before it is opened: it may never end
        data = read_regular(path, MAX_TRACE_BYTES, "a saved trace")
    except OSError as e:
        raise TraceFileError(f"cannot read {where}: {e.strerror or e}") from None
    if len(data) > MAX_TRACE_BYTES:
        raise TraceFileError(f"{where}: larger than {MAX_TRACE_BYTES >> 20} MiB; not a trace cbrules wrote")
    try:
        doc = json.loads(data.decode("utf-8"))
        return _trace(doc, where)
    except TraceFileError:
        raise
    except _Invalid as e:
        raise TraceFileError(f"{where}: {e}; not a trace this version of cbrules wrote") from None
    except RuleError as e:
        raise TraceFileError(f"{where}: its rule text does not read: {e}") from None
    except GraphError as e:
        raise TraceFileError(f"{where}: a graph in it is not valid: {e}") from None
    except (ValueError, KeyError, TypeError, IndexError, AttributeError, RecursionError) as e:
        raise TraceFileError(f"{where}: not a trace this version of cbrules wrote ({type(e).__name__}: "
                             f"{str(e)[:200]})") from None


# ------------------------------------------------------------------------------ values
def _value(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, Term):
        return {"term": [v.op, [_value(a) for a in v.args], v.value]}
    if isinstance(v, Param):
        return {"param": _value({f.name: getattr(v, f.name) for f in dataclasses.fields(v)})}  # terms stay terms
    if isinstance(v, tuple):
        return {"tuple": [_value(x) for x in v]}
    if isinstance(v, list):
        return [_value(x) for x in v]
    if isinstance(v, dict):
        return {"dict": [[_value(k), _value(x)] for k, x in v.items()]}
    raise TraceFileError(f"cannot save a value of type {type(v).__name__} in a trace: {v!r}"[:300])


def _unvalue(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, list):
        return [_unvalue(x) for x in v]
    if not isinstance(v, dict) or len(v) != 1:
        raise ValueError(f"unexpected value {str(v)[:80]}")
    (tag, x), = v.items()
    if tag == "tuple":
        return tuple(_unvalue(y) for y in _list(x))
    if tag == "dict":
        return {_key(_unvalue(k)): _unvalue(y) for k, y in map(_pair, _list(x))}
    if tag == "param":
        fields = _unvalue(x)
        if not isinstance(fields, dict) or set(fields) - {f.name for f in dataclasses.fields(Param)}:
            raise ValueError("a kernel parameter with unknown fields")
        return Param(**fields)
    if tag == "term":
        op, args, value = _list(x)
        return _term(op, [_unvalue(a) for a in _list(args)], value)
    raise ValueError(f"unknown value tag {tag!r}")


def _term(op: Any, args: list, value: Any) -> Term:
    """A term rebuilt only in the shapes terms have (the generated CUDA checks them again)."""
    arity = {"const": 0, "name": 0, **{o: 1 for o in UNARY_OPS}, **{o: 2 for o in BINARY_OPS}}
    if op == "call":
        bad = call_problem(value, len(args))
        if bad:
            raise ValueError(bad)
    elif op not in arity or len(args) != arity[op]:
        raise ValueError(f"not a term: {op!r} with {len(args)} operand(s)")
    if not all(isinstance(a, Term) for a in args) or isinstance(value, (list, dict, tuple)):
        raise ValueError(f"not a term: {op!r}")
    return Term(op, tuple(args), value)


def _list(x: Any) -> list:
    if not isinstance(x, list):
        raise ValueError("expected a list")
    return x


def _pair(x: Any) -> list:
    if not isinstance(x, list) or len(x) != 2:
        raise ValueError("expected a [key, value] pair")
    return x


def _key(k: Any) -> Any:
    if isinstance(k, (list, dict)):
        raise ValueError("unhashable dictionary key")
    return k


# ------------------------------------------------------------------------------ graphs and traces
def _graph(kg: KernelGraph) -> dict:
    return {"root": kg.root, "next": kg.next_id,
            "nodes": [[n, _value(dict(kg[n]))] for n in kg.nodes()],
            "edges": [[a, b, k] for a, b, k in kg.edges()]}


def _read_graph(doc: dict) -> KernelGraph:
    nodes: dict[int, dict] = {}
    for n, attrs in doc["nodes"]:
        attrs = _unvalue(attrs)
        if not isinstance(n, int) or not isinstance(attrs, dict) or attrs.get("op") not in OPS \
                or not isinstance(attrs.get("origin"), dict) or not all(isinstance(k, str) for k in attrs):
            raise ValueError(f"node {str(n)[:20]} is not a node cbrules wrote")
        nodes.setdefault(n, {}).update(attrs)  # a node listed twice: its attributes merged, as a graph adds them

    def known(n: Any) -> bool:
        try:
            return n in nodes
        except TypeError:  # unhashable: no node's id
            return False
    edges = []
    for a, b, kind in doc["edges"]:
        if not known(a) or not known(b) or kind not in (CONTAINS, DEPENDS):
            raise ValueError(f"edge {a!r} -> {b!r} ({kind!r}) joins no two nodes of the graph")
        edges.append((a, b, kind))
    root, next_id = doc["root"], doc["next"]
    if not known(root) or not isinstance(next_id, int) or next_id <= max(nodes, default=-1):
        raise ValueError("the graph's root or id counter is wrong")
    for n, attrs in nodes.items():
        _origin(n, attrs["origin"])
    kg = KernelGraph.restored(root, next_id, nodes, edges)
    verify_values(kg)  # names, integers and terms as the rules left them: the queries print them all
    return kg


# an origin's keys and their types (a node's origin: the build's call site, or the rule that made it)
_ORIGIN = {"build": {"by": str, "where": str}, "rule": {"by": str, "rule": str, "at": str, "step": int,
                                                        "from": int, "source": str}}
_ORIGIN_NEEDS = {"build": {"by"}, "rule": {"by", "rule", "at", "step"}}


def _origin(n: int, o: dict) -> None:
    by = o.get("by")
    if by not in _ORIGIN:
        raise _Invalid(f"node #{n}: origin 'by' is {printable(repr(by))[:80]}, not build or rule")
    missing = _ORIGIN_NEEDS[by] - set(o)
    if missing:
        raise _Invalid(f"node #{n}: an origin by={by} needs {', '.join(sorted(missing))}")
    for k, v in o.items():
        want = _ORIGIN[by].get(k)
        if want is None:
            raise _Invalid(f"node #{n}: origin by={by} has no field {printable(repr(k))[:80]}")
        if not _is(v, want):
            raise _Invalid(f"node #{n}: origin field {k!r} is {_shown(v)}, not "
                           f"{'one line of text' if want is str else want.__name__}")


def _is(v: Any, want: type) -> bool:
    """Whether ``v`` is a ``want`` as a trace holds one: an int is an int >= 0 and no bool, a float a
    finite number >= 0 (an int too), a str one line of text (:func:`_text`)."""
    if want is int:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0
    if want is float:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
    if want is str:
        return _text(v)
    return isinstance(v, want)


def _shown(v: Any) -> str:
    return f"{printable(repr(v))[:60]} ({type(v).__name__})"


def _int_list(v: Any) -> bool:
    return isinstance(v, list) and all(_is(x, int) for x in v)


MAX_TEXT = 1 << 20  # a name, a file:line, a binding (a term of MAX_TERM_PARTS parts prints in far less)


def _text(v: Any) -> bool:
    """One line of printable text (the queries print it as it is) of at most :data:`MAX_TEXT` characters."""
    return isinstance(v, str) and len(v) <= MAX_TEXT and v.isprintable()


def _text_dict(v: Any) -> bool:
    return isinstance(v, dict) and all(_text(k) and _text(x) for k, x in v.items())


def _count_dict(v: Any) -> bool:
    return v is None or isinstance(v, dict) and all(isinstance(k, str) and _is(x, int) for k, x in v.items())


# a record's fields: what each must be, and how that is said
RECORD_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "step": (lambda v: _is(v, int) and v >= 1, "a step number (an int >= 1)"),
    "rule": (_text, "a rule name (one line of text)"),
    "at": (_text, "a file:line (one line of text)"),
    "phase": (_text, "a phase name (one line of text)"),
    "bindings": (_text_dict, "a dictionary of ?variable -> text"),
    "created": (_int_list, "a list of node ids (ints >= 0)"),
    "erased": (_int_list, "a list of node ids (ints >= 0)"),
    "changed": (_int_list, "a list of node ids (ints >= 0)"),
    "seconds": (lambda v: _is(v, float), "a duration (a finite number >= 0)"),
    "egg": (_count_dict, "null or a dictionary of egglog rule -> matches (ints >= 0)"),
    "moved": (_int_list, "a list of node ids (ints >= 0)"),
}
# fields a trace written before they existed lacks: such a file reads back with the default
OPTIONAL_FIELDS = {"moved"}


def _record(i: int, fields: Any) -> Application:
    names = {f.name for f in dataclasses.fields(Application)}
    if not isinstance(fields, dict) or not names - OPTIONAL_FIELDS <= set(fields) <= names:
        raise _Invalid(f"record {i}: not a rule application (the fields are {', '.join(RECORD_FIELDS)})")
    for key, (ok, what) in RECORD_FIELDS.items():
        if key in fields and not ok(fields[key]):
            raise _Invalid(f"record {i}: field {key!r} is {_shown(fields[key])}, not {what}")
    return Application(**fields)


def _trace(doc: dict, where: str) -> tuple[Trace, str, str]:
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise TraceFileError(f"{where}: not a cbrules trace (format {FORMAT}); write one with "
                             f"`cbrules trace KERNEL --save FILE{SUFFIX}`")
    for key, want in (("kernel", str), ("options", str), ("phases", list), ("complete", bool), ("rules", dict),
                      ("graphs", dict), ("records", list)):
        if not isinstance(doc.get(key), want):
            raise TraceFileError(f"{where}: field {key!r} is {_shown(doc.get(key))}, not {want.__name__}; not a "
                                 "trace this version of cbrules wrote")
    if not all(_text(p) for p in doc["phases"]) or not all(k.isdigit() for k in doc["graphs"]) \
            or "0" not in doc["graphs"] or not _text(doc["kernel"]) or not _text(doc["options"]):
        raise TraceFileError(f"{where}: its kernel, options and phases must be one line of text each and its "
                             "graphs keyed by step numbers from 0; not a trace this version of cbrules wrote")
    texts = doc["rules"]
    if not isinstance(texts, dict) or not all(isinstance(t, str) and len(t.encode()) <= MAX_FILE_BYTES
                                              and "\0" not in t for t in texts.values()):
        raise ValueError("rule texts must be strings of at most 4 MiB without NUL")
    records = [_record(i, _unvalue(r)) for i, r in enumerate(doc["records"])]  # the cheap checks first
    graphs = {int(s): _read_graph(g) for s, g in doc["graphs"].items()}
    rules = from_texts(texts)  # reading the rule text back is most of the time a load takes
    t = Trace(graphs.pop(0), records, graphs, {r.name: r for r in rules.rules}, list(doc["phases"]),
              doc["complete"], list(texts), dict(rules.disabled))
    return t, doc["kernel"], doc["options"]
