"""``(clone ?L ...)``: the generic clone-by-schedule primitive the pipeline rules build the prologue,
main loop and epilogue with (a copy of scope ?L placed before it, keeping the leaves a pattern selects,
substituting a name by a term in some of them); mixed into :class:`cbrules.rewrite.actions.Rewriter`."""
from __future__ import annotations

from typing import Optional

from ..ir.ops import OPS
from ..ir.order import sibling_order
from ..ir.terms import Term, as_term, substitute
from .action_values import check_bounded
from .match import Matcher
from .schema import split_keys
from .sexpr import RuleError, SList
from .values import NodeRef


class Cloning:
    """``_clone`` and the subtree copy under it (needs the Rewriter's graph, bindings, origin, ``node``,
    ``value``, ``place`` and ``_set_attrs``)."""

    def _clone(self, a, target, *kv) -> None:
        src = self.node(target)
        self.not_root(target, src, "clone")
        _, keys = split_keys(kv, 0)
        matcher = Matcher(self.kg)
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
        new = kg.copy_node(n, {**self.origin, "from": n, "source": source}, changed)
        self.created.append(new)
        if not scope:
            return new
        seq = []
        for c in sibling_order(kg, n):
            cc = self._copy(c, kept, mapping, shifted, at, holds, mixed)
            if cc is not None:  # the copy is not in the graph's tree yet: nothing around it to tell
                kg.contain(new, cc)
                seq.append(cc)
        kg.order_by_effects(seq)  # the copies keep the original's order wherever effects conflict
        return new
