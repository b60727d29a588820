"""Helpers for tests that write rule files into temporary folders."""
import textwrap
from pathlib import Path

from cbrules.ir.builder import Kernel, threadIdx
from cbrules.ir.graph import KernelGraph
from cbrules.rewrite import rulefile


def write_rules(folder: Path, text: str, name: str = "test.rules") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def write_mutations(base: Path, mutations: dict) -> Path:
    """One rule folder under ``base`` per mutation (name -> (rule text, ...)); an empty text gives a
    folder that changes nothing (the unmutated control)."""
    for name, (text, *_) in mutations.items():
        write_rules(base / name, text or ";; no change\n")
    return base


def load_only(folder: Path) -> rulefile.RuleSet:
    """Rules of ``folder`` alone (no shipped rules)."""
    return rulefile.load([folder])


def two_reader_loop(**loop_annotations) -> KernelGraph:
    """A small kernel for rule tests: inside loop i (8 trips) load, store, sync, two loads from one
    shared buffer, a store, a sync -- in this schedule order."""
    k = Kernel("k", block=64)
    n = k.symbol("N")
    x, out = k.tensor("x", (n,)), k.tensor("out", (n,))
    s = k.alloc("s", "shared", "float32", (64,))
    with k.loop("i", 8, **loop_annotations) as i:
        v = k.load(x, i * 64 + threadIdx.x)
        k.store(s, threadIdx.x, v)
        k.syncthreads()
        a = k.load(s, threadIdx.x)
        b = k.load(s, 63 - threadIdx.x)
        k.store(out, i * 64 + threadIdx.x, k.add(a, b))
        k.syncthreads()
    return k.graph
