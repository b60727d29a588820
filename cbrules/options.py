"""The circular-buffer options a kernel asked for, and the ones it was lowered with.

The builder and the command line record only the options the user gave; the ``cb-default-*``
rules fill in the rest with the defaults of the options schema (:mod:`cbrules.ir.option_schema`; a rule
folder may change a default). What a loop was lowered with is read
off the lowered graph, so a report never guesses a default the rules did not apply.
"""
from __future__ import annotations

from typing import Any

from .ir import option_schema
from .ir.graph import KernelGraph


def _given(kg: KernelGraph):
    """The circular_buffer dictionaries of the kernel as built (on a loop or on a TMA load)."""
    for n in kg.nodes():
        d = kg[n]
        cb = (d.get("annotations") or {}).get("circular_buffer") if d["op"] == "for" else d.get("circular_buffer")
        if isinstance(cb, dict):
            yield cb


def requested(kg: KernelGraph) -> set[str]:
    """The option names given anywhere in the kernel as built (on a loop or on a TMA load)."""
    return {k for cb in _given(kg) for k in option_schema.names() if cb.get(k) is not None}


def strict_trip_count(kg: KernelGraph) -> bool:
    """Whether the kernel as built asks ``strict_trip_count`` (a trip count below S is refused)."""
    return any(cb.get("strict_trip_count") is True for cb in _given(kg))


def effective(kg: KernelGraph) -> list[tuple[str, dict[str, Any]]]:
    """(loop variable, options) of every circular-buffered loop of ``kg``: its main part once
    lowered (a warp-specialized loop: its consumer part), the loop itself before that. Loops the
    rules made single-stage are included."""
    out = []
    for n in kg.nodes("for"):
        d = kg[n]
        cb = (d.get("annotations") or {}).get("circular_buffer")
        if isinstance(cb, dict) and d.get("part") in (None, "main", "consumer"):
            out.append((str(d["var"]), {k: cb[k] for k in option_schema.names() if cb.get(k) is not None}))
    return out


def describe(lowered: KernelGraph, built: KernelGraph) -> str:
    """One line: each loop's effective options, those filled in by the rules marked."""
    asked = requested(built)
    loops = []
    for var, opts in effective(lowered):
        shown = [f"{k}={v}" + ("" if k in asked else " (rule default)") for k, v in opts.items()]
        loops.append(f"loop {var}: " + " ".join(shown))
    return "effective options: " + ("; ".join(loops) if loops else "no circular-buffered loop")
