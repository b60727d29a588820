"""Graph building and every invariant that verify() checks."""
import pytest

from cbrules.builder import Kernel, threadIdx
from cbrules.graph import KernelGraph
from cbrules.kernels.exp1d import exp1d_tma
from cbrules.terms import parse
from cbrules.verify import GraphError


def small():
    k = Kernel("k", block=64)
    n = k.symbol("N")
    x, out = k.tensor("x", (n,)), k.tensor("out", (n,))
    with k.loop("i", 4) as i:
        v = k.load(x, i * 64 + threadIdx.x)
        k.store(out, i * 64 + threadIdx.x, k.exp(v))
    return k


def test_builder_makes_scopes_and_depends_edges():
    kg = small().graph
    kg.verify()
    (loop,) = kg.nodes("for")
    assert kg.parent(loop) == kg.root
    ops = [kg.op(c) for c in kg.children(loop)]
    assert ops == ["load", "exp", "store"]
    load, ex, store = kg.children(loop)
    assert (load, ex) in kg.depends_edges() and (ex, store) in kg.depends_edges()
    assert kg.params()["out"].written and not kg.params()["x"].written


def test_every_node_has_an_origin_at_the_call_site():
    kg = exp1d_tma().graph
    for n in kg.nodes():
        o = kg[n]["origin"]
        assert o["by"] == "build"
        if n != kg.root:
            assert "exp1d.py:" in o["where"]


def test_copy_is_independent():
    kg = small().graph
    c = kg.copy()
    c[c.nodes("for")[0]]["var"] = "j"
    assert kg[kg.nodes("for")[0]]["var"] == "i"


def expect(kg, invariant, node_op=None):
    with pytest.raises(GraphError) as e:
        kg.verify()
    assert e.value.invariant == invariant, str(e.value)
    if node_op:
        assert kg.op(e.value.node) == node_op
    assert "#" in str(e.value)  # the message names a node
    return e.value


def test_second_root():
    kg = small().graph
    kg.add("kernel", kg.root, name="k2", params=(), block=(1, 1, 1), grid=(1, 1, 1))
    expect(kg, "single-root")


def test_orphan_node():
    kg = small().graph
    kg.add("syncthreads", None)
    expect(kg, "scope-tree", "syncthreads")


def test_two_parents():
    kg = small().graph
    loop = kg.nodes("for")[0]
    load = kg.nodes("load")[0]
    kg.g.add_edge(kg.root, load, kind="contains")
    expect(kg, "scope-tree", "load")
    assert loop in kg.g  # untouched


def test_child_of_non_scope():
    kg = small().graph
    load = kg.nodes("load")[0]
    kg.add("syncthreads", load)
    expect(kg, "scope-tree", "syncthreads")


def test_missing_attribute():
    kg = small().graph
    del kg[kg.nodes("store")[0]]["index"]
    expect(kg, "attributes", "store")


def test_bad_loop_kind():
    kg = small().graph
    kg[kg.nodes("for")[0]]["kind"] = "sideways"
    expect(kg, "attributes", "for")


def test_depends_across_scopes():
    kg = small().graph
    kg.add_depends(kg.nodes("load")[0], kg.nodes("for")[0])
    expect(kg, "depends-siblings")


def test_depends_cycle():
    kg = small().graph
    load, ex, _ = kg.children(kg.nodes("for")[0])
    kg.add_depends(ex, load)
    err = expect(kg, "depends-acyclic")
    assert "cycle" in str(err) and f"#{load}" in str(err) and f"#{ex}" in str(err)


def test_unknown_buffer():
    kg = small().graph
    kg[kg.nodes("load")[0]]["src"] = "nowhere"
    expect(kg, "buffer-defined", "load")


def test_buffer_read_without_writer():
    k = Kernel("k", block=32)
    s = k.alloc("s", "shared", "float32", (32,))
    k.load(s, threadIdx.x)
    expect(k.graph, "buffer-written", "load")


def test_unknown_name_in_term():
    kg = small().graph
    kg[kg.nodes("store")[0]]["index"] = parse("j * 64")
    err = expect(kg, "name-defined", "store")
    assert "'j'" in str(err)


def test_barrier_without_init():
    k = Kernel("k", block=32)
    b = k.alloc("b", "shared", "mbarrier", (1,))
    k.mbarrier_wait(b, 0, 0)
    k.mbarrier_inval(b, 0)
    expect(k.graph, "barrier-init", "mbarrier_wait")


def test_barrier_without_inval():
    k = Kernel("k", block=32)
    b = k.alloc("b", "shared", "mbarrier", (1,))
    k.mbarrier_init(b, 0, 1)
    k.mbarrier_wait(b, 0, 0)
    expect(k.graph, "barrier-inval", "mbarrier_wait")


def test_barrier_on_a_data_buffer():
    k = Kernel("k", block=32)
    b = k.alloc("b", "shared", "float32", (2,))
    k.mbarrier_init(b, 0, 1)
    k.mbarrier_inval(b, 0)
    expect(k.graph, "barrier-type", "mbarrier_init")


def test_elect_one_needs_a_warp():
    k = Kernel("k", block=16)
    with k.elect_one():
        k.syncthreads()
    expect(k.graph, "elect-one-warp", "if")


def test_block_reduce_needs_whole_warps():
    k = Kernel("k", block=48)
    k.reduce(1.0, kind="block")
    expect(k.graph, "block-reduce-warps", "reduce")


def test_unknown_op_is_refused():
    with pytest.raises(ValueError, match="unknown op"):
        KernelGraph("k").add("teleport", 0)


def test_builder_errors():
    k = Kernel("k")
    k.symbol("N")
    with pytest.raises(ValueError, match="already has a parameter"):
        k.symbol("N")
    with pytest.raises(ValueError, match="loop kind|is not one of"):
        with k.loop("i", 4, kind="sideways"):
            pass
    x = k.tensor("x", (4, 4))
    with pytest.raises(ValueError, match="rank"):
        k.tensor_map(x, box=(4,))
