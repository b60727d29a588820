"""How deep a kernel may nest and how large its terms may be: terms and scopes past a bound are refused
by name (the builder at the call, verify for a graph made any other way), never a RecursionError from a
walk that could not take them or a hang printing a term that repeats a subexpression; up to the
builder's bounds a kernel lowers (circular buffering included) and compiles."""
import contextlib

import pytest

from cbrules import api
from cbrules.ir.builder import BuildError, Kernel, circular_buffer, threadIdx
from cbrules.ir.graph import KernelGraph, Param
from cbrules.ir.ops import BUILT_SCOPE_DEPTH, MAX_SCOPE_DEPTH
from cbrules.ir.terms import BUILT_TERM_DEPTH, BUILT_TERM_PARTS, MAX_TERM_DEPTH, MAX_TERM_PARTS, extent, name
from cbrules.ir.verify import GraphError
from cbrules.rewrite.action_values import MAX_VALUE_DEPTH, MAX_VALUE_SIZE


def chain(t, levels: int):
    """``t`` under ``levels`` operators the simplifier cannot fold: (((t + 1) % 1000003) + 1) ..."""
    for i in range(levels):
        t = t + 1 if i % 2 == 0 else t % 1000003
    return t


def kernel():
    k = Kernel("deep", block=32)
    n = k.symbol("N")
    return k, k.tensor("x", (n,)), k.tensor("out", (n,))


def doubled(t, times: int):
    """``t + t``, that doubled ``times`` times: 2**times leaves as printed, times + 1 objects."""
    for _ in range(times):
        t = t + t
    return t


def deeper_than(t, levels: int) -> bool:
    return extent(t)[1] > levels


def test_extent_is_measured_without_recursion_and_each_shared_part_once():
    t = chain(threadIdx.x, 50_000)  # far past Python's recursion limit
    assert extent(t) == (50_000 * 2 + 1, 50_000)  # each + 1 and % 1000003 adds an operator and a constant
    assert extent(threadIdx.x) == (1, 0) and extent(threadIdx.x + 1) == (3, 1)
    assert len(list(t.names())) == 1  # names() walks it too
    assert extent(doubled(threadIdx.x, 60)) == (2 ** 61 - 1, 60)  # at once: 61 objects


def test_the_builder_refuses_a_term_that_repeats_a_subexpression_past_its_size():
    k, x, out = kernel()
    with pytest.raises(BuildError) as e:
        k.load(x, doubled(threadIdx.x, 40))  # printed, 2**40 leaves: it used to hang the builder
    assert f"more than {BUILT_TERM_PARTS} parts" in str(e.value) and "index" in str(e.value)
    v = k.load(x, doubled(threadIdx.x, 11))  # 4,095 parts: taken
    k.store(out, threadIdx.x, v)
    lowered = api.lower(k)
    (load,) = lowered.nodes("load")
    assert lowered[load]["index"] == doubled(threadIdx.x, 11)  # the whole term, not cut or refused


def test_verify_refuses_a_term_past_the_graph_size_by_name():
    kg = graph_with()
    kg.add("store", kg.root, dst="x", index=doubled(threadIdx.x, 40), value=name("v"))
    with pytest.raises(GraphError) as e:
        kg.verify()
    assert e.value.invariant == "term" and f"more than {MAX_TERM_PARTS} parts" in str(e.value)


def test_the_builder_refuses_a_term_past_its_bound_at_the_call():
    k, x, out = kernel()
    with pytest.raises(BuildError) as e:
        k.load(x, chain(threadIdx.x, BUILT_TERM_DEPTH + 1))
    msg = str(e.value)
    assert "test_depth_bounds.py" in msg and "index" in msg and str(BUILT_TERM_DEPTH) in msg and "in steps" in msg
    with pytest.raises(BuildError, match="index"):  # an index deep enough to crash any recursive walk
        k.load(x, chain(threadIdx.x, 5000))
    with pytest.raises(BuildError, match="grid"):
        k.grid(chain(name("N"), 3000))
    v = k.load(x, threadIdx.x)
    with pytest.raises(BuildError, match="index"):
        k.store(out, chain(threadIdx.x, 3000), v)


def test_the_builder_refuses_tma_coordinates_past_the_bound_before_its_coverage_check():
    k = Kernel("deep_tma", block=32)
    n = k.symbol("N")
    x = k.tensor("x", (n,))
    xm = k.tensor_map(x, box=(32,))
    tile = k.alloc("tile", "shared", "float32", (32,))
    with pytest.raises(BuildError, match=r"coords\[0\]"):
        k.tma_load(xm, (chain(threadIdx.x * 0, 3000),), tile)


def test_a_term_at_the_bound_lowers_through_circular_buffering_and_compiles():
    k = Kernel("deep_cb", block=256)
    n = k.symbol("N")
    x, out = k.tensor("x", (n,)), k.tensor("out", (n,))
    xm = k.tensor_map(x, box=(256,))
    k.grid(1)
    tile = k.alloc("tile", "shared", "float32", (256,))
    with k.loop("j", (n + 255) // 256, circular_buffer=circular_buffer(3)) as j:
        k.tma_load(xm, (j * 256,), tile)
        v = k.load(tile, threadIdx.x)
        k.store(out, chain(j * 256 + threadIdx.x, BUILT_TERM_DEPTH - 2), v)  # the sum is 2 deep
    lowered = api.lower(k)
    assert any(deeper_than(t, BUILT_TERM_DEPTH - 1) for n2 in lowered.nodes("store")
               for t in (lowered[n2]["index"],))
    text = api.compile(k).source.text  # codegen and NVRTC take it, the chain whole in a store of the CUDA
    assert max(ln.count("% 1000003") for ln in text.splitlines() if "out[" in ln) == (BUILT_TERM_DEPTH - 2) // 2


def test_the_builder_refuses_scopes_past_its_bound():
    k, x, out = kernel()
    with contextlib.ExitStack() as nest:
        for i in range(BUILT_SCOPE_DEPTH):  # the kernel's own scope is the first
            nest.enter_context(k.loop(f"i{i}", 2))
        with pytest.raises(BuildError) as e:
            with k.loop("one_more", 2):
                pass
    assert "nested more than" in str(e.value) and "flatten" in str(e.value) and "test_depth_bounds.py" in str(e.value)


def test_scopes_at_the_builders_bound_lower_and_compile():
    k, x, out = kernel()
    with contextlib.ExitStack() as nest:
        for i in range(BUILT_SCOPE_DEPTH - 1):
            nest.enter_context(k.loop(f"i{i}", 2))
        v = k.load(x, threadIdx.x)
        k.store(out, threadIdx.x, v)
    compiled = api.compile(k)
    text = compiled.source.text
    # every loop of the nest reaches the CUDA, each inside the one before, and ptxas builds it
    heads = [text.index(f"for (int i{i} = 0; i{i} < 2; i{i} += 1)") for i in range(BUILT_SCOPE_DEPTH - 1)]
    assert heads == sorted(heads)
    assert compiled.cubin.name == "deep" and compiled.cubin.resources.registers > 0 and compiled.cubin.cubin


def graph_with(depth_of_term: int = 0, depth_of_scopes: int = 0) -> KernelGraph:
    """A graph made without the builder (as a trace file or a program may make one)."""
    kg = KernelGraph("made", params=(Param("x", "tensor", "float32", (name("N"),)), Param("N", "symbol")),
                     block=(32, 1, 1))
    scope = kg.root
    for i in range(depth_of_scopes):
        scope = kg.add("for", scope, var=f"i{i}", start=0, stop=2, step=1, kind="serial")
    kg.add("load", scope, dst="v", src="x", index=chain(threadIdx.x, depth_of_term), dtype="float32")
    return kg


def test_verify_refuses_a_term_past_the_graph_bound_by_name():
    graph_with(depth_of_term=MAX_TERM_DEPTH).verify()
    for depth in (MAX_TERM_DEPTH + 1, 20_000):
        with pytest.raises(GraphError) as e:
            graph_with(depth_of_term=depth).verify()
        assert e.value.invariant == "term" and f"more than {MAX_TERM_DEPTH}" in str(e.value)


def test_verify_refuses_scopes_past_the_graph_bound_by_name():
    graph_with(depth_of_scopes=MAX_SCOPE_DEPTH).verify()
    with pytest.raises(GraphError) as e:
        graph_with(depth_of_scopes=MAX_SCOPE_DEPTH + 1).verify()
    assert e.value.invariant == "scope-depth" and str(MAX_SCOPE_DEPTH) in str(e.value)


def test_lowering_a_graph_past_the_bound_names_the_term_not_a_recursion():
    with pytest.raises(Exception) as e:
        api.lower(graph_with(depth_of_term=20_000))
    assert not isinstance(e.value, RecursionError) and "RecursionError" not in str(e.value)
    assert f"more than {MAX_TERM_DEPTH}" in str(e.value)


def test_rules_are_held_to_the_bound_verify_takes():
    assert MAX_VALUE_DEPTH == MAX_TERM_DEPTH and BUILT_TERM_DEPTH < MAX_TERM_DEPTH
    assert MAX_VALUE_SIZE == MAX_TERM_PARTS and BUILT_TERM_PARTS < MAX_TERM_PARTS
    assert BUILT_SCOPE_DEPTH < MAX_SCOPE_DEPTH
