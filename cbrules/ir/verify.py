"""Invariants of a kernel graph. Each failure names the node (with the builder call or the rule
and file:line that made it) and the broken invariant.

Everything codegen prints is checked here first: identifier-valued attributes are valid names
(:mod:`cbrules.ir.names`, rules' namespace) used for one thing only, every name in a term is bound
where it is used, every call is a device function, and integer-valued attributes are ints.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

from ..errors import CbrulesError
from .attributes import (ARG_COUNTS, ENUM_KEYS, INT_HIGH, INT_KEYS, attribute_problem, ident_keys, register_count,
                         term_problem)
from .names import BUILTINS, RULES, problem
from .ops import (DTYPES, FLOAT32_ONLY, FP8_DTYPES, FLOAT_REGISTERS, HALF_DTYPES, LOOP_KINDS, MATH, MAX_SCOPE_DEPTH, OPS, REDUCE_COMBINE, SCOPES,
                  SHFL_MODES, SPACES, STORAGE_DTYPES, WARP_SIZE, term_values)
from .order import DEPENDS, ScheduleError, order_among, sibling_order
from .terms import Term
from .tma_view import TmaSplitError, normalize_split

if TYPE_CHECKING:  # the graph imports this module to verify itself
    from .graph import KernelGraph

BARRIER_OPS = ("mbarrier_init", "mbarrier_arrive", "mbarrier_arrive_expect_tx", "mbarrier_wait",
               "mbarrier_inval")


class GraphError(CbrulesError):
    """A broken graph invariant; ``node`` is the offending node id (or None)."""

    def __init__(self, invariant: str, message: str, node: int | None = None):
        super().__init__(f"[{invariant}] {message}")
        self.invariant = invariant
        self.node = node


def verify(kg: KernelGraph, ready: bool = False, structure_only: bool = False) -> None:
    """Raise :class:`GraphError` for the first broken invariant, else return None.

    ``structure_only`` checks the tree, the attributes and the depends edges (what must hold after
    every single rule application, while a phase may still be half-way through a protocol);
    ``ready`` adds what code generation needs: every TMA load has a barrier to complete on.
    """
    by_op = kg.by_op()  # one pass: the checks below ask for the nodes of several ops
    walked, parent, kids = _tree(kg, by_op)  # every node, parents first, each one's scope, each scope's children
    _attributes(kg)
    orders = _depends(kg, walked, parent, kids)
    if structure_only:
        return
    order = _program_order(kg, orders)
    _identifiers(kg, walked)
    _values(kg, walked)
    _names(kg, walked, parent, by_op)
    _barriers(kg, order, by_op)
    _block_shape(kg, by_op)
    if ready:
        for n in by_op.get("tma_load", ()):
            if not kg[n].get("barrier"):
                raise GraphError("tma-barrier", f"{kg.describe(n)} has no barrier: mark its loop circular-buffered "
                                 "(or let the shipped rules lower it), or pass barrier= and slot=", n)


def verify_values(kg: KernelGraph) -> None:
    """The structure (``structure_only``) and every node's values: names are identifiers, integer
    attributes ints in range, terms printable. What holds after every rule application, so what a
    graph read back from a file (a saved trace) is held to; uniqueness of names and the barrier
    protocol hold only between phases."""
    verify(kg, structure_only=True)
    walked = list(kg.node_table)
    for n in walked:
        for key, name in _ident_attrs(kg, n):
            why = problem(name, RULES)
            if why:
                raise GraphError("identifier", f"{kg.describe(n)}: {key} {name!r} {why[0]}; {why[1]}", n)
    _values(kg, walked)


def _tree(kg: KernelGraph, by_op: dict[str, list[int]] | None = None
          ) -> tuple[list[int], dict[int, int], dict[int, list[int]]]:
    """Check the scope tree; return every node, parents before children (``kg.walk()``), each
    node's parent (the root has none) and each scope's children in id order (``by_op``:
    ``kg.by_op()``, when the caller has it)."""
    by_op = kg.by_op() if by_op is None else by_op
    parent: dict[int, int] = {}
    kernels = by_op.get("kernel", [])
    if kernels != [kg.root]:
        extra = [n for n in kernels if n != kg.root]
        raise GraphError("single-root", f"{kg.describe(extra[0])} is a second kernel node; a graph "
                         "has exactly one root", extra[0] if extra else None)
    root, nodes, containers = kg.root, kg.node_table, kg.containers
    for n in nodes:
        parents = containers(n)
        if n == root:
            if parents:
                raise GraphError("single-root", f"the kernel node is contained by {kg.describe(parents[0])}", n)
            continue
        if len(parents) != 1:
            what = "no enclosing scope" if not parents else \
                "several enclosing scopes: " + ", ".join(kg.describe(p) for p in parents)
            raise GraphError("scope-tree", f"{kg.describe(n)} has {what}; every node needs exactly one", n)
        if nodes[parents[0]]["op"] not in SCOPES:
            raise GraphError("scope-tree", f"{kg.describe(n)} is contained by {kg.describe(parents[0])}, "
                             "which is not a scope (kernel/for/if)", n)
        parent[n] = parents[0]
    for n in by_op.get("else", ()):
        p = kg.parent(n)
        if p is None or kg.op(p) != "if":
            raise GraphError("else-branch", f"{kg.describe(n)} is not directly inside an if; an else branch "
                             "is a child of the if it completes", n)
        if len([c for c in kg.children(p) if kg.op(c) == "else"]) > 1:
            raise GraphError("else-branch", f"{kg.describe(p)} has more than one else branch", n)
    walked, kids = _walk(kg, parent)
    if len(walked) != len(kg):  # each node but the root has one parent: the walk meets each at most once
        lost = sorted(set(nodes) - set(walked))
        raise GraphError("scope-tree", f"{kg.describe(lost[0])} is not reachable from the kernel "
                         "(its scopes form a cycle)", lost[0])
    depth = {root: 0}
    for n in walked:  # parents first
        if n in parent and nodes[n]["op"] in SCOPES:
            depth[n] = depth[parent[n]] + 1
            if depth[n] > MAX_SCOPE_DEPTH:
                raise GraphError("scope-depth", f"{kg.describe(n)} is nested {depth[n]} scopes deep, more than the "
                                 f"{MAX_SCOPE_DEPTH} the generated code and the simplifier take", n)
    return walked, parent, kids


def _walk(kg: KernelGraph, parent: dict[int, int]) -> tuple[list[int], dict[int, list[int]]]:
    """``kg.walk()`` (parents first, children in id order) from the parents read already, and each
    scope's children in id order."""
    kids: dict[int, list[int]] = {}
    for n in sorted(parent):
        kids.setdefault(parent[n], []).append(n)
    return _preorder(kg.root, kids), kids


def _preorder(root: int, children: dict[int, list[int]]) -> list[int]:
    """Parents first, each scope's children in the order given."""
    out, stack = [], [root]
    while stack:
        n = stack.pop()
        out.append(n)
        if n in children:
            stack.extend(reversed(children[n]))
    return out


def _attributes(kg: KernelGraph) -> None:
    for n, d in kg.node_table.items():
        op = d["op"]
        spec = OPS.get(op)
        if spec is None:
            raise GraphError("known-op", f"node #{n} has unknown op {op!r}", n)
        for k in spec.required:
            if k not in d:
                missing = [k for k in spec.required if k not in d]
                raise GraphError("attributes", f"{kg.describe(n)} lacks attribute(s) {', '.join(missing)}", n)
        if op == "for" and isinstance(d["step"], Term) and d["step"].op == "const" and \
                not (isinstance(d["step"].value, int) and d["step"].value >= 1):
            raise GraphError("attributes", f"{kg.describe(n)} has step {d['step']}: a loop's step must be at "
                             "least 1, or it never ends on the device", n)
        if op == "for" and d["kind"] not in LOOP_KINDS:
            raise GraphError("attributes", f"{kg.describe(n)} has loop kind {d['kind']!r}; "
                             f"expected one of {', '.join(LOOP_KINDS)}", n)
        if op == "setmaxnreg" and (d["action"] not in ("inc", "dec") or not register_count(d["count"])):
            raise GraphError("attributes", f"{kg.describe(n)}: setmaxnreg.{d['action']} {d['count']!r}; the action "
                             "is inc or dec and the count a multiple of 8 in 24..256", n)
        bad = attribute_problem(op, "args", d["args"]) if op in ARG_COUNTS else None
        if bad:
            raise GraphError("attributes", f"{kg.describe(n)}: args {bad}", n)
        if op == "block_stats" and d["dst"] == d["dst_m2"]:  # one variable for both results: one is lost
            raise GraphError("attributes", f"{kg.describe(n)}: dst and dst_m2 are both {d['dst']!r}; the mean "
                             "and the M2 need a register each", n)
        if op == "shfl" and (d["mode"] not in SHFL_MODES or d["dtype"] in STORAGE_DTYPES + ("mbarrier",)):
            raise GraphError("attributes", f"{kg.describe(n)}: shuffle mode {d['mode']!r} / dtype {d['dtype']!r}; "
                             f"expected one of {', '.join(SHFL_MODES)} and a register type (float32, int32, ...)", n)
        if op in FLOAT32_ONLY and d["dtype"] != "float32":
            raise GraphError("attributes", f"{kg.describe(n)}: {op} into a {d['dtype']!r} register; it is a "
                             "float32 instruction", n)
        if op in MATH and d["dtype"] not in FLOAT_REGISTERS:
            raise GraphError("attributes", f"{kg.describe(n)}: {op} into a {d['dtype']!r} register; it computes in "
                             f"{' or '.join(FLOAT_REGISTERS)}", n)
        if op == "cvt_pack" and (d["to"] not in HALF_DTYPES + FP8_DTYPES or d["dtype"] != "uint32"):
            raise GraphError("attributes", f"{kg.describe(n)}: packs to {d['to']!r} into a {d['dtype']!r} register; "
                             f"expected one of {', '.join(HALF_DTYPES + FP8_DTYPES)} into uint32", n)
        if op == "mma" and d.get("a_space") not in (None, "register"):
            raise GraphError("attributes", f"{kg.describe(n)}: a_space {d['a_space']!r}; give 'register' (A from "
                             "registers) or leave it out (A a shared tile)", n)
        if op == "alloc" and (d["space"] not in SPACES or d["dtype"] not in DTYPES):
            raise GraphError("attributes", f"{kg.describe(n)}: space {d['space']!r} / dtype {d['dtype']!r} "
                             "not supported", n)


def _depends(kg: KernelGraph, walked: list[int], parent: dict[int, int],
             kids: dict[int, list[int]]) -> dict[int, list[int]]:
    """Check the depends edges; return each scope's children in sibling order."""
    # every edge joins siblings (else the first in id order is named), so each orders its scope's
    # children as it is: :func:`sibling_edges` without lifting any
    edges: dict[int, list] = {}
    apart = False
    for a, b, kind in kg.edges():
        if kind == DEPENDS:
            pa = parent.get(a)
            if pa is not None and parent.get(b) == pa:
                edges.setdefault(pa, []).append((a, b))
            elif pa != parent.get(b):
                apart = True
            # else: the root's self-edge, which orders nothing (sibling_edges drops it too)
    if apart:
        for a, b in kg.depends_edges():
            if parent.get(a) != parent.get(b):
                raise GraphError("depends-siblings", f"depends edge {kg.describe(a)} -> {kg.describe(b)} joins "
                                 "nodes of different scopes; order their enclosing siblings instead", b)
    orders = {}
    nodes = kg.node_table
    for scope in walked:
        if nodes[scope]["op"] in SCOPES:
            if scope not in edges:  # no edge orders its children: the sort takes them in id order
                orders[scope] = kids.get(scope, [])
                continue
            got = order_among(kids.get(scope, []), edges[scope])
            if got is None:  # a cycle: the scheduler's sort names it
                try:
                    got = sibling_order(kg, scope, {scope: [(a, b, (a, b)) for a, b in edges[scope]]})
                except ScheduleError as e:
                    raise GraphError("depends-acyclic", str(e), scope) from None
            orders[scope] = got
    return orders


def _buffers(kg: KernelGraph, by_op: dict[str, list[int]]) -> dict[str, int]:
    """``kg.buffers()`` from the nodes by op read already."""
    nodes = kg.node_table
    return {nodes[n]["buf"]: n for n in by_op.get("alloc", ())}


def _program_order(kg: KernelGraph, orders: dict[int, list[int]]) -> list[int]:
    """``linear_order`` from the sibling orders :func:`_depends` found (each scope is sorted once)."""
    return _preorder(kg.root, orders)


def _ident_attrs(kg: KernelGraph, n: int) -> Iterator[tuple[str, Any]]:
    d, op = kg[n], kg.op(n)
    for k in ident_keys(op):
        if d.get(k) is not None:
            yield k, d[k]
    if op == "kernel":
        for p in d["params"]:
            yield f"parameter {getattr(p, 'kind', '?')}", getattr(p, "name", p)


def _identifiers(kg: KernelGraph, walked: list[int]) -> None:
    """Every name codegen prints is an identifier, and names one thing in the kernel: a parameter, a
    buffer, a register (written any number of times) or loop variables (siblings may share one;
    a nested loop may not reuse an enclosing loop's variable)."""
    what: dict[str, tuple[str, int]] = {}  # name -> (kind, first node)

    def claim(name: str, kind: str, n: int, reuse: bool) -> None:
        had = what.get(name)
        if had and not (reuse and had[0] == kind):
            raise GraphError("name-unique", f"{kg.describe(n)}: {kind} {name!r} is already the {had[0]} of "
                             f"{kg.describe(had[1])}; the generated CUDA would mix them up: rename one", n)
        what.setdefault(name, (kind, n))

    nodes, keys_of = kg.node_table, {}
    for n in walked:
        d = nodes[n]
        op = d["op"]
        keys = keys_of.get(op)
        if keys is None:
            keys = keys_of[op] = ident_keys(op)
        if op == "kernel":
            named = list(_ident_attrs(kg, n))
        else:  # the same pairs as _ident_attrs, without a generator a node
            named = [(k, d[k]) for k in keys if d.get(k) is not None]
        for key, name in named:
            why = problem(name, RULES)
            if why:
                raise GraphError("identifier", f"{kg.describe(n)}: {key} {name!r} {why[0]}; {why[1]}", n)
            if op == "kernel" and key != "name":  # the kernel's own name is outside its body
                claim(name, key, n, False)
            elif op == "alloc":
                claim(name, "buffer", n, False)
            elif op == "for":
                claim(name, "loop variable", n, True)
                if name in {kg[a]["var"] for a in kg.ancestors(n) if kg.op(a) == "for"}:
                    raise GraphError("name-unique", f"{kg.describe(n)}: loop variable {name!r} is already the "
                                     "variable of an enclosing loop; give the inner loop its own", n)
            elif key in ("dst", "dst_m2") and (op == "load" or OPS[op].category == "compute"):
                claim(name, "register", n, True)


def _values(kg: KernelGraph, walked: list[int]) -> None:
    """Integer attributes are ints in range, enumerations hold known values, and every term is
    made of known operators, device functions and constants (infinities and NaN only where a value
    is computed: an index, bound or predicate holding one is a mistake)."""
    nodes = kg.node_table
    for n in walked:
        d = nodes[n]
        op = d["op"]
        for key, low in INT_KEYS.get(op, ()):
            bad = attribute_problem(op, key, d[key]) if d.get(key) is not None else None
            if bad:
                most = f" and <= {INT_HIGH[op, key]}" if (op, key) in INT_HIGH else ""
                raise GraphError("int-valued", f"{kg.describe(n)}: {key} must be int(s) >= {low}{most}: {bad}", n)
        for key in ENUM_KEYS.get(op, ()):
            bad = attribute_problem(op, key, d[key]) if d.get(key) is not None else None
            if bad:
                raise GraphError("attributes", f"{kg.describe(n)}: {key} {bad}", n)
        if op == "alloc" and d.get("align") and d["align"] & (d["align"] - 1):
            raise GraphError("int-valued", f"{kg.describe(n)}: align {d['align']} is not a power of two", n)
        if "dtype" in d and d["dtype"] not in DTYPES:
            raise GraphError("attributes", f"{kg.describe(n)}: dtype {d['dtype']!r} is not one of "
                             f"{', '.join(DTYPES)}", n)
        if op == "reduce" and (d["kind"] not in ("block", "serial") or d["combine"] not in REDUCE_COMBINE):
            raise GraphError("attributes", f"{kg.describe(n)}: reduce kind {d['kind']!r} / combine "
                             f"{d['combine']!r}; expected block|serial and {'|'.join(REDUCE_COMBINE)}", n)
        for key in OPS[op].terms:
            v = d.get(key)
            for t in (v if isinstance(v, tuple) else () if v is None else (v,)):
                why = term_problem(t, key not in _VALUE_KEYS)  # a term read before answers at once
                if why:
                    raise GraphError("term", f"{kg.describe(n)}: {key} {why}", n)
    for p in kg.kernel()["params"]:
        if getattr(p, "kind", None) not in ("symbol", "tensor", "tmap") or getattr(p, "dtype", None) not in DTYPES:
            raise GraphError("attributes", f"{kg.describe(kg.root)}: parameter {p!r} has an unknown kind or dtype",
                             kg.root)
        if p.kind == "tmap" and p.split and not _split_ok(p):  # a graph from a trace file: as the builder checks
            raise GraphError("attributes", f"{kg.describe(kg.root)}: tensor map {p.name!r} has split {p.split!r} "
                             f"and box {p.box!r}; expected (dimension, inner extent) pairs the builder accepts for "
                             f"its rank-{len(p.shape)} tensor and a box of the view's rank", kg.root)


def _split_ok(p: Any) -> bool:
    try:
        pairs = normalize_split(p.name, dict(p.split), len(p.shape))
    except (TmaSplitError, TypeError, ValueError):
        return False
    return pairs == tuple(p.split) and len(p.box) == len(p.shape) + len(pairs)


_VALUE_KEYS = ("value", "args", "src")  # terms that compute a value (a reduce's src), not an index


_MEMORY_OPS = ("load", "store", "copy", "tma_load", "tma_store")  # their src and dst name buffers (a load's dst: a register)


def _names(kg: KernelGraph, walked: list[int], parent: dict[int, int], by_op: dict[str, list[int]]) -> None:
    """Every buffer and register read has a definition (or comes from the host), and every name in
    a term is bound where it is used: an enclosing loop's variable, a symbol, a builtin or a register."""
    params = kg.params()
    symbols = {p for p in params if params[p].kind == "symbol"}
    buffers = _buffers(kg, by_op)
    written_bufs, registers = set(), set()
    for d in kg.node_table.values():
        if d["op"] in ("tma_load", "store", "copy"):
            written_bufs.add(d["dst"])
        if OPS[d["op"]].category == "compute" or d["op"] == "load":
            registers.add(d["dst"])
            if d["op"] == "block_stats":
                registers.add(d["dst_m2"])
    everywhere = symbols | set(BUILTINS) | registers  # one lookup a name besides the loops around it
    # the variables of the loops around each scope (a scope's own included), parents first
    scope_vars: dict[int, frozenset] = {}
    nodes = kg.node_table
    for n in walked:
        d = nodes[n]
        if d["op"] in SCOPES:
            p = parent.get(n)
            around = scope_vars[p] if p is not None else frozenset()
            scope_vars[n] = around | {d["var"]} if d["op"] == "for" else around
    for n in kg.nodes():
        d = nodes[n]
        op = d["op"]
        for key in ("src", "dst", "barrier") if op in _MEMORY_OPS else ("barrier",):
            buf = d.get(key)
            if buf is not None:
                is_reg = key == "dst" and op == "load"
                if not is_reg and buf not in buffers and not (buf in params and params[buf].kind == "tensor"):
                    raise GraphError("buffer-defined", f"{kg.describe(n)} uses buffer {buf!r}, which is "
                                     "neither allocated nor a tensor parameter", n)
        if op == "mma":
            for key in ("acc", "a", "b"):
                if d[key] not in buffers:
                    raise GraphError("buffer-defined", f"{kg.describe(n)} uses buffer {d[key]!r} as its {key}, "
                                     "which is not allocated", n)
            want = ("register", "uint32") if d.get("a_space") == "register" else None
            got = (nodes[buffers[d["a"]]]["space"], nodes[buffers[d["a"]]]["dtype"])
            if want is not None and got != want or want is None and got[0] != "shared":
                raise GraphError("attributes", f"{kg.describe(n)} reads {d['a']!r} ({got[0]} {got[1]}) as its A, "
                                 f"which must be {'a uint32 register array (a packed operand)' if want else 'shared'}"
                                 f" for a_space {d.get('a_space')!r}", n)
        if op in ("load", "copy", "tma_store"):
            src = d["src"]
            if src in buffers and src not in written_bufs:
                raise GraphError("buffer-written", f"{kg.describe(n)} reads buffer {src!r}, which no node "
                                 "writes", n)
        if op == "tma_load" and (d["tmap"] not in params or params[d["tmap"]].kind != "tmap"):
            raise GraphError("buffer-defined", f"{kg.describe(n)} names tensor map {d['tmap']!r}, which is "
                             "not a tmap parameter of the kernel", n)
        if op == "kernel":  # the launcher computes the grid on the host, from the symbols alone
            for t in d["grid"]:
                bad = sorted(set(t.names()) - symbols) if isinstance(t, Term) else [t]
                if bad:
                    raise GraphError("name-defined", f"{kg.describe(n)}: grid {t} uses {bad[0]!r}, which is not "
                                     "a symbol of the kernel", n)
        p = parent.get(n)
        loop_vars = scope_vars[p] if p is not None else frozenset()
        if op == "for":  # no enclosing loop reuses it (_identifiers)
            loop_vars = loop_vars - {d["var"]}
        for t in term_values(op, d):
            for name in t.names():  # kept on the term: cloned nodes share their terms
                if name not in loop_vars and name not in everywhere:
                    raise GraphError("name-defined", f"{kg.describe(n)} uses {name!r} in {t}, which is not a "
                                     "loop variable in scope, a symbol, a builtin or a register", n)


def _barriers(kg: KernelGraph, order: list[int], by_op: dict[str, list[int]]) -> None:
    """Each barrier array is initialised before any other use and invalidated after the last.

    Program order says nothing about an else branch run by other threads at the same time (a
    warp-specialized producer): its uses are left to the protocol checker of the interpreter."""
    uses: dict[str, list[int]] = {}
    concurrent = {d for e in by_op.get("else", ()) for d in kg.descendants(e)}
    nodes = kg.node_table
    for n in order:
        if nodes[n]["op"] in BARRIER_OPS and n not in concurrent:
            uses.setdefault(kg[n]["barrier"], []).append(n)
    buffers = _buffers(kg, by_op)
    for bar, ns in uses.items():
        if bar in buffers and kg[buffers[bar]]["dtype"] != "mbarrier":
            raise GraphError("barrier-type", f"{kg.describe(ns[0])} uses {bar!r}, which is allocated as "
                             f"{kg[buffers[bar]]['dtype']}, not mbarrier", ns[0])
        if kg.op(ns[0]) != "mbarrier_init":
            raise GraphError("barrier-init", f"{kg.describe(ns[0])} uses barrier {bar!r} before any "
                             "mbarrier_init", ns[0])
        if kg.op(ns[-1]) != "mbarrier_inval":
            raise GraphError("barrier-inval", f"barrier {bar!r} is not invalidated after its last use "
                             f"{kg.describe(ns[-1])}", ns[-1])


def _block_shape(kg: KernelGraph, by_op: dict[str, list[int]]) -> None:
    bx, by, bz = kg.kernel()["block"]
    for n in kg.nodes() if bx < 32 else by_op.get("reduce", []) + by_op.get("block_stats", []) + by_op.get("shfl", []):
        d = kg[n]  # (with a block of 32 threads or more only the warp collectives to check)
        if d["op"] == "shfl" and (bx * by * bz) % WARP_SIZE:
            raise GraphError("shfl-warps", f"{kg.describe(n)}: a warp shuffle with the full mask needs every lane of "
                             f"its warp, and a block of {bx * by * bz} threads ends in a partial warp; use a multiple "
                             f"of {WARP_SIZE} threads", n)
        if bx < 32 and any(t.op == "call" and t.value == "elect_one" for t in _subterms(term_values(d["op"], d))):
            raise GraphError("elect-one-warp", f"{kg.describe(n)} uses elect_one() but blockDim.x = {bx} "
                             "< 32; the elect-one predicate needs one full warp", n)
        if d["op"] == "reduce" and d["kind"] == "block" and (bx * by * bz) % 32:
            raise GraphError("block-reduce-warps", f"{kg.describe(n)}: a block reduction needs a block of "
                             f"whole warps, got {bx * by * bz} threads", n)
        if d["op"] == "block_stats":  # the merge's butterfly pairs equal halves: 2^k whole warps
            threads = d.get("count") or bx * by * bz
            if by * bz != 1:  # the prelude's lanes and warps count threadIdx.x alone
                raise GraphError("block-stats-warps", f"{kg.describe(n)}: block statistics need a one-dimensional "
                                 f"block, got {bx}x{by}x{bz}; put the threads along x", n)
            if not isinstance(threads, int) or threads % 32 or (threads // 32) & (threads // 32 - 1):
                raise GraphError("block-stats-warps", f"{kg.describe(n)}: block statistics merge equal halves of "
                                 f"the block: it needs a power-of-two count of whole warps, got {threads} threads; "
                                 "use 32, 64, 128, 256, 512 or 1024 threads", n)


def _subterms(ts):
    for t in ts:
        yield t
        yield from _subterms(t.args)
