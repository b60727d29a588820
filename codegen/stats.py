"""CUDA for the ``block_stats`` node: the block's (mean, M2) from each thread's, merged pairwise
(``prelude_stats.cu``, appended only to kernels that use it, so every other kernel's source stays as it
was). The merge's partials pass through the block-reduction scratch; its closing sync, which guards that
scratch against the next reduction, is left out where no reduction can follow."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from .ctext import as_int, c_term, ident

STATS_PRELUDE = (Path(__file__).with_name("prelude_stats.cu")).read_text()
HELPER = "cb_block_stats"


def uses_scratch(step) -> bool:
    """Whether the step passes partials through the block-reduction scratch."""
    return step.op == "block_stats" or (step.op == "reduce" and step.attrs.get("kind") == "block")


def last_scratch_user(program) -> Optional[int]:
    """The node of the block_stats after which no scratch user can run: the program's last scratch user,
    outside every loop (a loop could run it, or one before it, again); None if there is none."""
    found: list[tuple[object, bool]] = []

    def walk(step, in_loop: bool) -> None:
        if uses_scratch(step):
            found.append((step, in_loop))
        for c in step.body:
            walk(c, in_loop or step.op == "for")

    walk(program, False)
    if not found or found[-1][1] or found[-1][0].op != "block_stats":
        return None
    return found[-1][0].node


def statement(step, a, e) -> str:
    """``block_stats``: the block's merge of the thread's (mean, M2) = args into dst and dst_m2."""
    mean, m2 = (c_term(t) for t in a["args"])
    n = as_int(a["n"], "block_stats n (elements a thread's pair covers)", 1)
    last = "true" if step.node == e.stats_last else "false"
    head = f"{mean}, {m2}, {ident(a['dst'])}, {ident(a['dst_m2'])}, reinterpret_cast<float*>(cb_smem + {e.reduce_offset})"
    if a.get("bar_id") is not None:  # over the threads before `count` only, through a named barrier
        return (f"{HELPER}_named<{n}, {last}>({head}, {as_int(a['bar_id'], 'a named barrier id', 1)}, "
                f"{as_int(a['count'], 'a named barrier thread count', 32)});")
    return f"{HELPER}<{n}, {last}>({head});"
