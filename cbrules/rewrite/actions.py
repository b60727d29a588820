"""Rewrite actions: the small, generic vocabulary of a graph rule's ``:rewrite``.

| action | effect |
|---|---|
| ``(insert-before ?n T...)`` / ``(insert-after ?n T...)`` | new nodes from templates right before/after ?n |
| ``(insert-at-entry ?s T...)`` / ``(insert-at-exit ?s T...)`` | new nodes first/last in scope ?s |
| ``(erase ?n)`` | remove ?n and its subtree, keeping the order of what ran around it |
| ``(set ?n :key V ...)`` | set attributes (term attributes take terms) |
| ``(set-option ?L NAME :key V ...)`` | set keys of loop ?L's annotation dictionary NAME (made if absent) |
| ``(replace ?n T)`` | a new node where ?n was; ?n is erased |
| ``(wrap ?n T)`` | a new scope from template T where ?n was, with ?n moved inside it |
| ``(wrap-body ?s T)`` | a new scope from template T (no children) becomes ?s's only child, holding ?s's former body |
| ``(move ?n :into ?s [:at entry|exit])`` | re-parent ?n |
| ``(clone ?L [:as ?M] [:set (:k V ...)] [:keep P] [:substitute (P NAME TERM)])`` | copy scope ?L right before it, keeping the leaves matching P, substituting NAME by TERM in the kept nodes matching P: the generic clone-by-schedule primitive the pipeline rules build the prologue, main loop and epilogue with |
| ``(add-edge ?a ?b)`` / ``(remove-edge ?a ?b)`` | depends edges between siblings |
| ``(rewrite-terms ?s FROM TO)`` | every occurrence of term FROM in the terms of the nodes inside ?s becomes TO |
| ``(let ?x V)`` | bind a value for later actions |
| ``(fail [:code CODE] "message {?x}")`` | refuse the kernel with a named error; CODE (a word) names the refusal for programs and tests |

A template is ``(OP :key V ... [:as ?x] CHILD-TEMPLATE ...)``; children only for ``for``/``if``.
Placement: at entry a new node precedes every sibling, at exit it follows every sibling; before ?n
it follows ?n's predecessors and precedes ?n, after ?n it follows ?n and precedes ?n's successors.
Against the other siblings it keeps memory order: conflicting effects (RAW/WAR/WAW on registers,
buffers and the sync token) order it by its position in the scope's current schedule.

Actions keep the graph a tree with acyclic sibling order whatever the bindings: moving a node into
itself or a descendant, placing or wrapping next to the kernel node, a node inside a non-scope, an
edge between non-siblings, a self-edge or one closing a cycle are refused with a
:class:`RuleError` naming the nodes (the engine adds the rule's file:line); so is a value (term,
text, tuple) past :data:`MAX_VALUE_SIZE` parts plus :data:`VALUE_PARTS_PER_NODE` a node of the graph, or
:data:`MAX_VALUE_DEPTH` levels, which a rule feeding its own output back builds, doubling it at each
application (a value that lists something per loop, like the kernel's ``:requires``, grows with the graph).
"""
from __future__ import annotations

import re
from typing import Any, Optional

from ..userio import printable
from ..ir.ops import OPS, conflicts, nearest_conflicts_among
from ..ir.order import sibling_pairs
from .schema import ACTIONS, settable as _settable, split_keys, split_keys_once  # noqa: F401  (ACTIONS: public)
from ..sexpr import Atom, RuleError, SList, derived
from ..ir.terms import Term, as_term, extent, substitute
from .match import Matcher
from .memory import Memory
from .values import Env, NodeRef, compiled
from .action_values import (MAX_VALUE_DEPTH, MAX_VALUE_SIZE, VALUE_PARTS_PER_NODE, check_bounded,  # noqa: F401
                            coerce, check_printable, replace_term, show_value)


# a template's literal attribute values (a string, number or symbol in the rule's text), coerced and
# checked the first time the template is used: most of a template's keys are literals (:dtype, :part,
# :tag), and a lowering instantiates each template once a loop
def _literal_values(t: SList) -> dict:
    """The template's literal attribute values checked so far (key -> value), kept on its text."""
    return derived(t).setdefault("literals", {})


def _small(value: Any) -> bool:
    """Whether a value is within the size bound of a graph of any size (then the checks it passed once
    pass again; a long literal text may pass only in a large graph, whose bound grows with it)."""
    if isinstance(value, str):
        return len(value) < MAX_VALUE_SIZE
    return not isinstance(value, Term) or extent(value)[0] <= MAX_VALUE_SIZE


def _remember_literal(t: SList, key: str, value: Any) -> None:
    _literal_values(t)[key] = value


class RuleFailure(Exception):
    """A rule's ``(fail ...)``: the kernel asks for something the rules refuse; ``code`` is the
    rule's ``:code`` (None when it gave none)."""

    def __init__(self, message: str, code: Optional[str] = None):
        super().__init__(message)
        self.code = code


class Rewriter:
    """Applies one rule application's actions to the engine's private copy of the graph, through the
    engine's :class:`cbrules.rewrite.memory.Memory` of it: each change goes through the memory, or is
    told to it (``touch``), so that what it keeps stays true."""

    def __init__(self, memory: Memory, bindings: dict, origin: dict):
        self.mem = memory
        self.kg = kg = memory.kg
        self.b = dict(bindings)
        self.origin = origin
        self.created: list[int] = []
        self.erased: list[int] = []
        self.changed: list[int] = []
        self.moved: list[int] = []  # nodes given a new parent: what is inside them has new scopes too
        self.erased_ops: set[str] = set()
        # one Env for the application: it reads ``self.b`` (changed in place by let, :as and clone's
        # :as), not a copy, so every value sees the bindings as they are when it is evaluated
        self._env = Env(self.b, kg.__getitem__)  # not a closure over self: that would be a reference cycle

    def env(self) -> Env:
        return self._env

    def value(self, e) -> Any:
        return compiled(e)(self._env)

    def node(self, e) -> int:
        v = self.value(e)
        if not isinstance(v, NodeRef) or v.id not in self.kg:
            raise RuleError(e.pos, f"{e} is not a node of the graph (got {v!r})")
        return v.id

    def scope(self, e, what: str) -> int:
        """The node ``e`` names, which must be a scope (it receives children)."""
        n = self.node(e)
        if not self.kg.is_scope(n):
            raise RuleError(e.pos, f"{what} needs a scope (kernel, for, if ...), but {e} is "
                            f"{self.kg.describe(n)}, which holds no statements")
        return n

    def not_root(self, e, n: int, what: str) -> None:
        """Refuse an action that would need a place next to (outside) the kernel node."""
        if n == self.kg.root:
            raise RuleError(e.pos, f"{what} {e}: {e} is the kernel node, which has no enclosing scope; "
                            "bind a statement inside the kernel instead")

    def touched_ops(self) -> set[str]:
        """The ops of every node this application created, erased, changed or gave new enclosing
        scopes (a rule whose patterns name none of them matches what it matched before)."""
        kg = self.kg
        ops = set(self.erased_ops)
        ops.update(kg.op(n) for n in (*self.created, *self.changed) if n in kg)
        for m in self.moved:
            if m in kg:
                ops.update(kg.op(d) for d in kg.descendants(m))
        return ops

    # ------------------------------------------------------------------ driver
    def run(self, actions: tuple) -> None:
        for a in actions:
            head = a.head()
            getattr(self, "_" + head.replace("-", "_"))(a, *a.items[1:])

    # ------------------------------------------------------------------ placement
    def place(self, n: int, scope: int, where: str, anchor: Optional[int] = None) -> None:
        """Put new node ``n`` into ``scope`` at entry/exit, or right before/after ``anchor``.

        entry: before every child; exit: after every child; before / after: next to the anchor.
        Against the other siblings, memory order follows from conflicting effects at that position.
        """
        kg, mem = self.kg, self.mem
        kept = mem.kept_order(scope)
        if kept is not None and n in kept.key:
            kept = None  # n moves within its scope: sorted again when next asked
        seq = kept.seq if kept is not None else [c for c in mem.sibling_order(scope) if c != n]
        if kg.parent(n) != scope:
            kg.contain(scope, n)
            mem.joined(n)  # the scopes around grow by n's effects
        # entry/exit: before the siblings nothing precedes / after those nothing follows; the rest
        # is ordered through them (edges stay linear in the number of siblings)
        if where in ("entry", "exit"):
            if kept is not None:  # its sources and sinks, in order
                ends = sorted(kept.sources if where == "entry" else kept.sinks, key=kept.key.__getitem__)
            else:
                pairs = sibling_pairs(kg, seq)
                led = {b for _, b in pairs} if where == "entry" else {a for a, _ in pairs}
                ends = [c for c in seq if c not in led]
        if where == "entry":
            at, before, after = 0, [], ends
        elif where == "exit":
            at, before, after = len(seq), ends, []
        else:
            at = kept.index(anchor) if kept is not None else seq.index(anchor)
            at, before, after = (at, [], [anchor]) if where == "before" else (at + 1, [anchor], [])
        anchor_preds = kept.preds(kg, seq[at]) if kept is not None and at < len(seq) and anchor else []
        for s in before:
            mem.add_depends(s, n, scope)
        for s in after:
            mem.add_depends(n, s, scope)
        # only the siblings that touch n's resources, by the scope's resource index
        label = kept.key if kept is not None else {c: i for i, c in enumerate(seq)}  # orders siblings as seq does
        preds, succs = nearest_conflicts_among(seq, mem.effects, at, mem.effects(n), mem.sibling_resources(scope), label)
        for s in sorted(preds, key=label.__getitem__):
            mem.add_depends(s, n, scope)
        for s in sorted(succs, key=label.__getitem__):
            mem.add_depends(n, s, scope)
        # the new order without sorting the scope again: at entry n precedes every source and at
        # exit follows every sink, whatever its id; a new node (the largest id) next to an anchor
        # joins where the sort would put it when that moves no other sibling (see memory.KeptOrder)
        if kept is not None and kept.place(kg, n, where, at, anchor_preds):
            mem.remember_order(scope, kept)

    def instantiate(self, t: SList, parent: Optional[int]) -> int:
        """Create the nodes of a template under ``parent`` (not yet ordered among its siblings)."""
        op = t.head()
        pos, keys = split_keys_once(t, 1)
        spec = OPS[op]
        attrs = {}
        known = _literal_values(t)
        for k, v in keys.items():
            if k in known:  # a literal checked when the template was first used: the same value each time
                attrs[k] = known[k]
            elif k != "as":
                _settable(k, v)
                attrs[k] = coerce(spec, k, self.value(v))
                check_bounded(k, attrs[k], v, len(self.kg))
                check_printable(op, k, attrs[k], v)
                if isinstance(v, Atom) and v.kind != "var" and _small(attrs[k]):
                    _remember_literal(t, k, attrs[k])
        n = self.mem.add(op, parent, self.origin, **attrs)
        self.created.append(n)
        if "as" in keys:
            self.b[keys["as"].value] = NodeRef(n)
        kids = [self.instantiate(child, n) for child in pos]  # body of a scope, in program order
        self.mem.order_by_effects(kids)
        return n

    def _insert(self, where: str, target, templates) -> None:
        if where in ("entry", "exit"):
            ref = self.scope(target, f"insert-at-{where}")
        else:
            ref = self.node(target)
            self.not_root(target, ref, f"insert-{where}")
        scope = ref if where in ("entry", "exit") else self.kg.parent(ref)
        anchor = None if where in ("entry", "exit") else ref
        if where in ("entry", "after"):
            templates = reversed(templates)  # each new node goes right at the anchor: keep written order
        for t in templates:
            n = self.instantiate(t, None)
            self.place(n, scope, where, anchor)

    def _insert_before(self, a, target, *ts): self._insert("before", target, ts)
    def _insert_after(self, a, target, *ts): self._insert("after", target, ts)
    def _insert_at_entry(self, a, target, *ts): self._insert("entry", target, ts)
    def _insert_at_exit(self, a, target, *ts): self._insert("exit", target, ts)

    # ------------------------------------------------------------------ removal and change
    def detach(self, n: int) -> None:
        """Take ``n`` out of its scope; a predecessor and a successor that conflict stay ordered."""
        kg, mem = self.kg, self.mem
        preds, succs = kg.detach_order(n)
        effects = mem.effects
        succ_effects = {s: effects(s) for s in succs}
        needed = {(p, s) for p in preds for s in succs if conflicts(effects(p), succ_effects[s])}
        # skip p -> s where p already precedes another predecessor that will precede s
        for p, s in needed:
            if not any((q, s) in needed and kg.has_depends(p, q) for q in preds if q != p):
                mem.add_depends(p, s)
        parent = kg.parent(n)
        if parent is not None:  # told before n leaves: the memory walks n's scopes
            mem.touch(n)
            mem.touch(parent)
            kg.remove_contains(parent, n)

    def _erase(self, a, target) -> None:
        n = self.node(target)
        if n == self.kg.root:
            raise RuleError(a.pos, "cannot erase the kernel node")
        gone = [n, *self.kg.descendants(n)]
        self.detach(n)
        self.erased_ops.update(self.kg.op(x) for x in gone)
        self.mem.remove_nodes(gone)
        self.erased.extend(gone)

    def _set(self, a, target, *kv) -> None:
        self._set_attrs(self.node(target), kv)

    def _set_attrs(self, n: int, kv) -> None:
        _, keys = split_keys(kv, 0)
        for k, v in keys.items():
            _settable(k, v)
            self._set_value(n, k, self.value(v), v)
        self._touched(n)

    def _set_value(self, n: int, k: str, value: Any, at) -> None:
        """Attribute ``k`` of ``n`` becomes ``value`` (what the expression ``at`` gave), checked as set's."""
        self.kg[n][k] = coerce(OPS[self.kg.op(n)], k, value)
        check_bounded(k, self.kg[n][k], at, len(self.kg))
        check_printable(self.kg.op(n), k, self.kg[n][k], at)

    def _set_option(self, a, target, annotation, *kv) -> None:
        """``(set-option ?L "circular_buffer" :key V ...)``: those keys of the loop's annotation dictionary
        ``circular_buffer`` (made if absent) become the values, the others kept, in order."""
        n = self.node(target)
        if self.kg.op(n) != "for":
            raise RuleError(a.pos, f"set-option {target}: {self.kg.describe(n)} is not a loop; options are a "
                                   "for node's annotations")
        name = self.value(annotation)
        if not isinstance(name, str) or not name:
            raise RuleError(annotation.pos, f"set-option: the annotation is named by a string, got {name!r}")
        _, keys = split_keys(kv, 0)
        annotations = dict(self.kg[n].get("annotations") or {})
        options = annotations.get(name) or {}
        if not isinstance(options, dict):
            raise RuleError(annotation.pos, f"set-option: annotation {name!r} of {self.kg.describe(n)} is "
                                            f"{options!r}, not a dictionary of options")
        options = dict(options)
        for k, v in keys.items():
            options[k] = self.value(v)
        annotations[name] = options
        self._set_value(n, "annotations", annotations, a)
        self._touched(n)

    def _touched(self, n: int) -> None:
        """``n``'s attributes changed: the engine matches it again (a node this step made is new anyway)."""
        self.mem.touch(n)
        if n not in self.created:
            self.changed.append(n)

    def _replace(self, a, target, t) -> None:
        self._insert("before", target, (t,))
        self._erase(a, target)

    def _wrap(self, a, target, t) -> None:
        n = self.node(target)
        self.not_root(target, n, "wrap")
        kg, mem = self.kg, self.mem
        parent = kg.parent(n)
        s = self.instantiate(t, None)
        if not kg.is_scope(s):
            raise RuleError(t.pos, f"wrap needs a scope template (for, if ...) to hold {kg.describe(n)}, "
                            f"got {t.head()}")
        kg.contain(parent, s)
        mem.touch(parent)
        mem.touch(s)
        # the new scope takes ?n's place: its depends edges move over, then ?n moves inside. The
        # touch of parent above told the memory its children's order changed (what add_depends
        # would tell it again for each moved edge)
        kg.take_place(s, n)
        mem.touch(n)  # leaves parent's resource index
        kg.remove_contains(parent, n)
        mem.touch(s)
        mem.touch(parent)
        if kg.children(s):
            self.place(n, s, "exit")  # after the template's own body
        else:
            kg.contain(s, n)
        self.changed.append(n)
        self.moved.append(n)

    def _wrap_body(self, a, target, t) -> None:
        s = self.node(target)
        kg, mem = self.kg, self.mem
        if not kg.is_scope(s):
            raise RuleError(a.pos, f"wrap-body: {kg.describe(s)} is not a scope")
        if split_keys(t.items, 1)[0]:
            raise RuleError(t.pos, "wrap-body: the template is an empty scope; the body of the target fills it")
        body = kg.children(s)
        new = self.instantiate(t, None)
        # the body keeps its depends edges: its nodes stay siblings, now inside the new scope
        for c in body:
            mem.touch(c)  # leaves s's resource index
            kg.remove_contains(s, c)
            kg.contain(new, c)
        kg.contain(s, new)
        mem.touch(new)
        mem.touch(s)
        self.changed.extend(body)
        self.moved.extend(body)

    def _move(self, a, target, *kv) -> None:
        n = self.node(target)
        self.not_root(target, n, "move")
        _, keys = split_keys(kv, 0)
        if ("into" in keys) == ("before" in keys):
            raise RuleError(a.pos, "move needs :into SCOPE (with :at entry|exit) or :before NODE, one of them")
        anchor = None
        if "before" in keys:  # right before a statement, in its scope: where the anchor is, not at an end
            key = "before"
            anchor = self.node(keys["before"])
            if anchor == self.kg.root:
                raise RuleError(keys["before"].pos, f"move {target} :before {keys['before']}: the kernel node has no "
                                "place among statements; name a statement")
            scope = self.kg.parent(anchor)
        else:
            key = "into"
            scope = self.scope(keys["into"], "move :into")
        if scope == n or scope in self.kg.descendants(n) or anchor == n:
            raise RuleError(keys[key].pos, f"move {target} :{key} {keys[key]} would put "
                            f"{self.kg.describe(n)} inside itself (into {self.kg.describe(scope)}); "
                            "guard the rule so the target scope is not the moved node or inside it")
        if anchor is not None:
            if "at" in keys:
                raise RuleError(keys["at"].pos, "move :before NODE takes no :at (it places the node right before NODE)")
            where = "before"
        else:
            where = str(self.value(keys["at"])) if "at" in keys else "exit"
            if where not in ("entry", "exit"):
                raise RuleError(keys["at"].pos, f"move :at takes entry or exit, got {where!r}")
        self.detach(n)
        self.place(n, scope, where, anchor)
        self.changed.append(n)
        self.moved.append(n)

    # ------------------------------------------------------------------ edges, bindings, failure
    def _add_edge(self, a, x, y) -> None:
        u, v = self.node(x), self.node(y)
        kg = self.kg
        if u == v:
            raise RuleError(a.pos, f"add-edge {x} {y}: a node cannot run before itself ({kg.describe(u)})")
        if u == kg.root or kg.parent(u) != kg.parent(v):
            raise RuleError(a.pos, f"add-edge {x} {y}: {kg.describe(u)} and {kg.describe(v)} are not in the "
                            "same scope; depends edges order siblings (order their enclosing siblings instead)")
        if self._reaches(v, u):
            raise RuleError(a.pos, f"add-edge {x} {y}: {kg.describe(v)} already runs before {kg.describe(u)}, "
                            "so the edge would make the order cyclic; remove-edge the other way first or "
                            "guard the rule")
        self.mem.add_depends(u, v)

    def _reaches(self, a: int, b: int) -> bool:
        """Whether depends edges lead from ``a`` to ``b`` (siblings)."""
        successors, seen, stack = self.kg.successors, {a}, [a]
        while stack:
            n = stack.pop()
            for s in successors(n):
                if s not in seen:
                    if s == b:
                        return True
                    seen.add(s)
                    stack.append(s)
        return False

    def _remove_edge(self, a, x, y) -> None:
        u, v = self.node(x), self.node(y)
        if self.kg.has_depends(u, v):  # never a contains edge
            self.mem.remove_depends(u, v)

    def _rewrite_terms(self, a, scope, old, new) -> None:
        frm, to = as_term(self.value(old)), as_term(self.value(new))
        check_printable("assign", "value", to, new)
        needs = next(frm.names(), None)  # a term that does not mention it cannot hold FROM
        for n in self.kg.descendants(self.scope(scope, "rewrite-terms")):
            attrs = self.kg[n]
            for key in OPS[attrs["op"]].terms:
                v = attrs.get(key)
                names = v.__dict__.get("_names") if isinstance(v, Term) else None  # only where read already
                if needs is not None and names is not None and needs not in names:
                    continue
                nv = tuple(replace_term(x, frm, to) for x in v) if isinstance(v, tuple) else \
                    replace_term(v, frm, to) if isinstance(v, Term) else v
                if nv is not v and nv != v:
                    attrs[key] = nv
                    self.mem.touch(n)
                    self.changed.append(n)

    def _let(self, a, var, expr) -> None:
        value = self.value(expr)
        check_bounded(var.value, value, expr, len(self.kg))  # a let chain doubling a tuple grows as a set would
        self.b[var.value] = value

    def _fail(self, a, *args) -> None:
        pos, keys = split_keys(args, 0)
        text = re.sub(r"\{(\?[\w-]+)\}", lambda m: show_value(self.b.get(m.group(1), m.group(1)), self.kg),
                      str(self.value(pos[0])))
        code = str(self.value(keys["code"])) if "code" in keys else None
        raise RuleFailure(printable(text), code)  # the rule's own text: one line, no terminal escapes

    # ------------------------------------------------------------------ clone: the clone-by-schedule primitive
    def _clone(self, a, target, *kv) -> None:
        src = self.node(target)
        self.not_root(target, src, "clone")
        _, keys = split_keys(kv, 0)
        matcher = Matcher(self.kg, memory=self.mem)
        leaves = {n for n in self.kg.descendants(src) if not self.kg.is_scope(n)}
        kept = leaves if "keep" not in keys else matcher.select(keys["keep"], self.b, src) & leaves
        mapping: dict[str, Term] = {}
        shifted: set[int] = set()
        if "substitute" in keys:
            if len(keys["substitute"]) != 3:
                raise RuleError(keys["substitute"].pos, ":substitute takes (FILTER NAME TERM)")
            pat, var, term = keys["substitute"].items
            mapping = {str(self.value(var)): as_term(self.value(term))}
            shifted = matcher.select(pat, self.b, src) & kept
        parent = self.kg.parent(src)
        holds, mixed = self._holding(src, kept, shifted)
        new = self._copy(src, kept, mapping, shifted, keys.get("substitute"), holds, mixed, root=True)
        if "set" in keys:  # before the copy joins the graph: it is placed by its own effects, read once
            if not isinstance(keys["set"], SList):
                raise RuleError(keys["set"].pos, "clone :set takes a list (:key value ...)")
            self._set_attrs(new, keys["set"].items)
        self.place(new, parent, "before", src)
        if "as" in keys:
            self.b[keys["as"].value] = NodeRef(new)

    def _holding(self, src: int, kept: set, shifted: set) -> tuple[set, set]:
        """The scopes inside ``src`` (``src`` too) that hold a kept leaf, and those that hold a kept
        leaf not in ``shifted``: one walk up from each kept leaf, not one walk down from each scope."""
        holds: set[int] = set()
        mixed: set[int] = set()
        kg = self.kg
        for leaf in kept:
            plain = leaf not in shifted
            s = kg.parent(leaf)
            while s is not None and (s not in holds or plain and s not in mixed):
                holds.add(s)
                if plain:
                    mixed.add(s)
                if s == src:
                    break
                s = kg.parent(s)
        return holds, mixed

    def _copy(self, n: int, kept: set, mapping: dict, shifted: set, at: Optional[SList], holds: set, mixed: set,
              root: bool = False) -> Optional[int]:
        """Copy ``n``'s subtree: kept leaves, and the scopes holding some (the root always); ``holds``
        and ``mixed`` as :meth:`_holding` gives them."""
        kg = self.kg
        scope = kg.is_scope(n)
        if not root and (n not in kept if not scope else n not in holds):
            return None
        # a leaf in the substituted set, or an inner scope holding only such leaves, sees the new value
        substituted = n in shifted or (not root and scope and n not in mixed)
        changed = {}
        if substituted:
            attrs = kg[n]
            for k in OPS[attrs["op"]].terms:
                v = attrs.get(k)
                if isinstance(v, Term):
                    changed[k] = substitute(v, mapping)
                elif isinstance(v, tuple):
                    changed[k] = tuple(substitute(x, mapping) if isinstance(x, Term) else x for x in v)
                check_bounded(k, changed.get(k, v), at, len(self.kg))
        first = kg[n]["origin"]
        source = first.get("source") or (f"{first['rule']} @ {first['at']}" if first.get("rule")
                                         else f"build @ {first.get('where', '?')}")
        new = self.mem.copy_node(n, {**self.origin, "from": n, "source": source}, changed)
        self.created.append(new)
        if not scope:
            return new
        seq = []
        for c in self.mem.sibling_order(n):
            cc = self._copy(c, kept, mapping, shifted, at, holds, mixed)
            if cc is not None:  # the copy is not in the graph's tree yet: nothing around it to tell
                kg.contain(new, cc)
                seq.append(cc)
        self.mem.order_by_effects(seq)  # the copies keep the original's order wherever effects conflict
        return new
