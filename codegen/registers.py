"""The register pool of a warp-specialized block: what its ``setmaxnreg`` instructions ask of it.

``setmaxnreg.dec`` gives a warp group's registers to a pool kept per block and ``setmaxnreg.inc``
takes them from it, waiting until the pool holds enough (PTX ISA, setmaxnreg). The pool is what the
block was launched with: its threads times the registers ptxas gave the kernel. A split that asks
for more than that (a kernel that needs few registers, so two blocks share an SM, given the split
of one that has the SM to itself) never finishes its ``setmaxnreg.inc``: the block hangs. Codegen
records what each ``setmaxnreg`` asks (count and threads); :func:`pool_problem` compares it with
the compiled kernel's registers before anything is launched."""
from __future__ import annotations

from typing import Optional

from ..ir.terms import Term


def _threads_below(pred: object) -> Optional[int]:
    """C for a predicate ``threadIdx.x < C`` (C a constant), else None."""
    if isinstance(pred, Term) and pred.op == "<" and len(pred.args) == 2:
        lhs, rhs = pred.args
        if lhs.op == "name" and lhs.value == "threadIdx.x" and rhs.op == "const" and isinstance(rhs.value, int) \
                and not isinstance(rhs.value, bool):
            return rhs.value
    return None


def demands(program, threads: int) -> tuple[tuple[int, Optional[int]], ...]:
    """(count, threads) of every ``setmaxnreg`` in ``program`` (a scheduled Step tree run by ``threads``
    threads): the threads that run it follow from enclosing ``threadIdx.x < C`` branches, None where
    another predicate decides."""
    out: list[tuple[int, Optional[int]]] = []

    def walk(step, n: Optional[int]) -> None:
        if step.op == "setmaxnreg":
            out.append((step.attrs["count"], n))
        if step.op == "if":
            c = _threads_below(step.attrs.get("pred"))
            then_n = None if c is None or n is None else min(n, max(c, 0))
            else_n = None if then_n is None else n - then_n
            for b in step.body:
                walk(b, else_n if b.op == "else" else then_n)
            return
        for b in step.body:
            walk(b, n)

    walk(program, threads)
    return tuple(out)


def pool_problem(name: str, demand: tuple, block_threads: int, registers: int) -> Optional[str]:
    """Why the block cannot finish its ``setmaxnreg`` (the pool of ``block_threads`` threads times
    ``registers``, rounded up to ptxas's unit of 8, is smaller than what they ask), else None."""
    if not demand:
        return None
    if any(n is None for _, n in demand):
        return (f"kernel {name!r}: a setmaxnreg runs under a branch whose threads codegen cannot count, so the "
                "register pool cannot be checked; put warp groups on branches of the form threadIdx.x < C")
    asked = sum(count * n for count, n in demand)
    held = block_threads * (-(-registers // 8) * 8)
    if asked <= held:
        return None
    parts = " + ".join(f"{n} threads x {count}" for count, n in demand)
    return (f"kernel {name!r}: its setmaxnreg instructions ask the block's register pool for {parts} = {asked} registers, but "
            f"ptxas gave the kernel {registers} registers a thread, so the block holds {block_threads} x "
            f"{-(-registers // 8) * 8} = {held}: the setmaxnreg.inc would wait forever (the block hangs). Give a "
            f"register split that fits that pool (registers=(p, c) with the sum at most {held}), or registers=None")
