"""Helpers for tests that write rule files into temporary folders, and the one mutation harness: a
table of :class:`Mutation` (a rule folder's text, the failures that count as caught, the build keywords),
:func:`mutation_folders` to write them, :func:`lower_case` to build, lower and make inputs, and
:func:`assert_caught` for the named failure."""
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import pytest

from cbrules import api
from cbrules.ir.builder import Kernel, threadIdx
from cbrules.ir.graph import KernelGraph
from cbrules.reference import protocol
from cbrules.rewrite import rulefile


def write_rules(folder: Path, text: str, name: str = "test.rules") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


@dataclass(frozen=True)
class Mutation:
    """One mutation of the shipped rules: the text of its rule folder ("" changes nothing: a control),
    the failures that count as caught (none: the case must run clean) and the keywords its kernel is
    built with (``KernelSpec.build``'s: war, warp_specialize, registers, tma_store, ...)."""
    rules: str
    caught: tuple = ()
    build: dict = field(default_factory=dict)


def mutation_folders(base: Path, mutations: dict) -> Path:
    """One rule folder under ``base`` per :class:`Mutation` of ``mutations`` (name -> Mutation)."""
    for name, m in mutations.items():
        write_rules(base / name, m.rules or ";; no change\n")
    return base


def lower_case(spec, trips: Optional[int] = None, rules=None, dtype: str = "float32", seed: int = 0,
               shape: Optional[tuple] = None, kernel=None, **build) -> tuple:
    """(shape, lowered graph, inputs) of ``spec``'s problem of ``trips`` iterations (or ``shape``), built
    with ``build`` (or ``kernel`` as given) and lowered with the rule folder ``rules`` (a path, a list of
    paths or a loaded rule set) besides the shipped rules; inputs in ``dtype`` from ``seed``."""
    shape = tuple(shape) if shape is not None else spec.shape_for_trips(trips)
    if kernel is None:
        kernel = spec.build(shape, trips=trips, dtype=dtype, **build)
    rules = [rules] if isinstance(rules, (str, Path)) else rules
    kg = api.lower(kernel, rules=rules)
    return shape, kg, spec.make_inputs(shape, np.random.default_rng(seed), dtype)


def assert_caught(call: Callable[[], Any], caught: tuple, exact: bool = False) -> protocol.ProtocolError:
    """``call()`` fails with a protocol error of one of the classes ``caught`` (exactly that class with
    ``exact``) that names its node; returns the error for the caller's own checks."""
    with pytest.raises(protocol.ProtocolError) as e:
        call()
    got = e.value
    assert (type(got) in caught) if exact else isinstance(got, caught), f"{type(got).__name__}: {got}"
    assert got.node is not None and f"#{got.node}" in str(got), str(got)
    return got


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
