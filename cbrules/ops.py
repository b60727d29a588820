"""The vocabulary of node kinds: which attributes each op takes and what it reads and writes.

This table is the single source of truth for the graph checker (``verify``), the builder, the
dependence analysis and, later, the rule checker's "unknown op / attribute" messages.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from .terms import Term

SCOPES = ("kernel", "for", "if", "else")
LOOP_KINDS = ("serial", "unroll", "unswitch", "vectorize",
              "thread-x", "thread-y", "thread-z", "block-x", "block-y", "block-z")
SPACES = ("global", "shared", "register")
DTYPES = {"float32": "float", "float64": "double", "int32": "int", "int64": "long long",
          "uint32": "unsigned", "uint64": "unsigned long long", "mbarrier": "unsigned long long"}
DTYPE_BYTES = {"float32": 4, "float64": 8, "int32": 4, "int64": 8, "uint32": 4, "uint64": 8, "mbarrier": 8}
UNARY = ("exp", "log", "sqrt", "rsqrt", "neg", "abs")
BINARY = ("add", "sub", "mul", "div", "max", "min")
REDUCE_COMBINE = ("sum", "max", "min")
SYNC_TOKEN = "sync"
# Attributes any node may carry: rules use them to tag nodes (e.g. a pipeline stage) for later rules.
COMMON_ATTRIBUTES = ("stage", "tag", "part")  # the pseudo-resource that orders memory operations around barriers


@dataclass(frozen=True)
class OpSpec:
    """Required and optional attributes of one op; ``terms`` names the attributes holding terms."""

    required: tuple[str, ...]
    optional: tuple[str, ...] = ()
    terms: tuple[str, ...] = ()
    category: str = "compute"  # scope | memory | compute | sync
    defaults: Mapping[str, Any] = field(default_factory=dict)

    @property
    def attributes(self) -> tuple[str, ...]:
        return self.required + self.optional + COMMON_ATTRIBUTES


_BAR = ("barrier", "slot")
OPS: dict[str, OpSpec] = {
    # requires: (predicate term over symbols, message[, code]) entries the launcher checks before a launch
    # min_blocks: the kernel's __launch_bounds__ minimum of resident blocks (1 caps registers at entry,
    # which setmaxnreg needs)
    "kernel": OpSpec(("name", "params", "block", "grid"), ("symbols", "requires", "min_blocks"), category="scope"),
    "for": OpSpec(("var", "start", "stop", "step", "kind"), ("annotations",),
                  ("start", "stop", "step"), "scope", {"kind": "serial", "step": 1}),
    "if": OpSpec(("pred",), (), ("pred",), "scope"),
    # the else branch of the enclosing if: at most one, a direct child of the if (its place among the
    # if's children does not matter; code generation puts it after the then branch)
    "else": OpSpec((), (), (), "scope"),
    "alloc": OpSpec(("buf", "space", "dtype", "shape"), ("align",), category="memory"),
    # a tma_load without a barrier asks the rules to arrange its completion (circular buffering);
    # box is the hardware box, tile the logical tile it serves (a multiple of the box)
    "tma_load": OpSpec(("tmap", "coords", "dst", "offset", "bytes", "box"), ("barrier", "slot", "tile",
                       "circular_buffer"), ("coords", "offset", "slot"), "memory"),
    "tma_store": OpSpec(("tmap", "coords", "src", "offset"), (), ("coords", "offset"), "memory"),
    "load": OpSpec(("dst", "src", "index", "dtype"), (), ("index",), "memory"),
    "store": OpSpec(("dst", "index", "value"), (), ("index", "value"), "memory"),
    "assign": OpSpec(("dst", "value", "dtype"), (), ("value",)),
    # a block reduction with bar_id/count syncs through named barrier bar_id over threads 0..count-1 only
    "reduce": OpSpec(("dst", "src", "kind", "combine", "dtype"), ("bar_id", "count"), ("src",)),
    "fma": OpSpec(("dst", "args", "dtype"), (), ("args",)),
    "mbarrier_init": OpSpec(_BAR + ("count",), (), ("slot",), "sync"),
    "mbarrier_arrive": OpSpec(_BAR, (), ("slot",), "sync"),
    "mbarrier_arrive_expect_tx": OpSpec(_BAR + ("bytes",), (), ("slot",), "sync"),
    "mbarrier_wait": OpSpec(_BAR + ("parity",), (), ("slot", "parity"), "sync"),
    "mbarrier_inval": OpSpec(_BAR, (), ("slot",), "sync"),
    "syncthreads": OpSpec((), (), (), "sync"),
    "fence_proxy_async": OpSpec((), (), (), "sync"),
    "fence_mbarrier_init": OpSpec((), (), (), "sync"),
    "bar_sync": OpSpec(("id", "count"), (), (), "sync"),
    # setmaxnreg.inc / .dec: a warp group's register budget becomes count (warp specialization)
    "setmaxnreg": OpSpec(("action", "count"), (), (), "sync"),
}
for _op in UNARY + BINARY:
    OPS[_op] = OpSpec(("dst", "args", "dtype"), (), ("args",))


def term_values(op: str, attrs: Mapping[str, Any]) -> list[Term]:
    """Every term held by a node (tuples of terms flattened)."""
    out: list[Term] = []
    for key in OPS[op].terms:
        v = attrs.get(key)
        if isinstance(v, Term):
            out.append(v)
        elif isinstance(v, tuple):
            out.extend(x for x in v if isinstance(x, Term))
    return out


def effects(op: str, attrs: Mapping[str, Any]) -> tuple[set[str], set[str]]:
    """(reads, writes) of one node, as resource names: ``reg:v``, ``mem:buf``, ``sync``.

    Memory operations read the sync token and synchronisation writes it, so memory traffic never
    moves across a barrier, while independent loads between two barriers stay unordered.
    """
    reads = {f"reg:{n}" for t in term_values(op, attrs) for n in t.names()}
    writes: set[str] = set()
    spec = OPS[op]
    if "dst" in attrs and spec.category == "compute":
        writes.add(f"reg:{attrs['dst']}")
        if op == "reduce" and attrs.get("kind") == "serial":
            reads.add(f"reg:{attrs['dst']}")  # an accumulation reads its own previous value
    if op == "load":
        writes.add(f"reg:{attrs['dst']}")
        reads |= {f"mem:{attrs['src']}", SYNC_TOKEN}
    elif op == "store":
        writes.add(f"mem:{attrs['dst']}")
        reads.add(SYNC_TOKEN)
    elif op == "tma_load":
        writes.add(f"mem:{attrs['dst']}")
        reads |= {f"mem:{attrs['tmap']}", SYNC_TOKEN}
        if attrs.get("barrier"):
            reads.add(f"mem:{attrs['barrier']}")
    elif op == "tma_store":
        writes.add(f"mem:{attrs['tmap']}")
        reads |= {f"mem:{attrs['src']}", SYNC_TOKEN}
    elif op == "reduce" and attrs.get("kind") == "block":
        writes.add(SYNC_TOKEN)  # a block reduction synchronises the block
    elif spec.category == "sync":
        writes.add(SYNC_TOKEN)
        reads.add(SYNC_TOKEN)
        if "barrier" in attrs:
            writes.add(f"mem:{attrs['barrier']}")
    return reads, writes


def conflicts(a: tuple[set[str], set[str]], b: tuple[set[str], set[str]]) -> bool:
    """True when the two effect sets must keep their program order (RAW, WAR or WAW)."""
    (ra, wa), (rb, wb) = a, b
    return bool(wa & (rb | wb) or ra & wb)


def nearest_conflicts(seq: list[tuple[set[str], set[str]]], at: int,
                      mine: tuple[set[str], set[str]]) -> tuple[set[int], set[int]]:
    """Positions in ``seq`` (effects of siblings in program order) that a node placed at ``at``
    must follow and precede: per resource, the nearest writer on each side and, when the node
    writes, the readers between it and that writer. Everything farther away is already ordered
    through those, so the depends edges stay linear in the number of siblings."""
    reads, writes = mine
    before: set[int] = set()
    after: set[int] = set()
    for r in reads | writes:
        for span, out in ((range(at - 1, -1, -1), before), (range(at, len(seq)), after)):
            for i in span:
                their_reads, their_writes = seq[i]
                if r in their_writes:
                    out.add(i)
                    break
                if r in their_reads and r in writes:
                    out.add(i)
    return before, after


class DependenceTracker:
    """Builds depends edges for siblings added in program order, in time linear in their number:
    per resource it remembers the last writer and the readers since, which are exactly the
    nearest conflicting predecessors of the next node."""

    def __init__(self) -> None:
        self.writer: dict[str, int] = {}
        self.readers: dict[str, list[int]] = {}

    def add(self, node: int, effects_of_node: tuple[set[str], set[str]]) -> set[int]:
        """Record ``node``; return the earlier siblings it must follow."""
        reads, writes = effects_of_node
        preds: set[int] = set()
        for r in reads | writes:
            if r in self.writer:
                preds.add(self.writer[r])
        for r in writes:
            preds.update(self.readers.get(r, ()))
        for r in reads - writes:
            self.readers.setdefault(r, []).append(node)
        for r in writes:
            self.writer[r] = node
            self.readers[r] = []
        preds.discard(node)
        return preds
