"""Graph building and every invariant that verify() checks."""
import pytest

from cbrules.ir.builder import Buffer, BuildError, Kernel, threadIdx
from cbrules.ir.graph import KernelGraph
from cbrules.kernels.exp1d import exp1d_tma
from cbrules.ir.names import IdentifierError, NameClashError
from cbrules.ir.terms import Term, name, parse
from cbrules.ir.verify import GraphError


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


def test_edges_of_one_kind_share_their_data_which_cannot_change():
    """Each edge of a kind holds the same data dict (not one per edge); changing it would change every
    edge of the kind, so it is refused, while a copy's edges are its own."""
    kg = exp1d_tma().graph
    data = {id(d) for _, nbrs in kg.g._succ.items() for d in nbrs.values()}
    assert len(data) == 2 and len(kg.depends_edges()) > 5
    a, b = kg.depends_edges()[0]
    with pytest.raises(TypeError, match="shared by every edge of its kind"):
        kg.g.edges[a, b]["kind"] = "contains"
    with pytest.raises(TypeError):
        kg.g.add_edge(a, b, kind="contains")  # networkx changes an edge's data in place
    assert kg.g.edges[a, b]["kind"] == "depends"
    copy = kg.copy()
    copy.g.edges[a, b]["kind"] = "contains"  # the copy's own dict
    assert kg.g.edges[a, b]["kind"] == "depends"


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
    with pytest.raises(NameClashError, match="already names a symbol of kernel 'k'"):
        k.symbol("N")
    with pytest.raises(BuildError, match="kind 'sideways' is not one of"):
        with k.loop("i", 4, kind="sideways"):
            pass
    x = k.tensor("x", (4, 4))
    with pytest.raises(BuildError, match="rank"):
        k.tensor_map(x, box=(4,))


def test_errors_name_the_builder_call_site():
    k = Kernel("k")
    with pytest.raises(IdentifierError) as e:
        k.symbol("2N")
    assert str(e.value).startswith("symbol('2N') at ") and "test_graph.py:" in str(e.value)
    assert e.value.name == "2N" and "rename it" in e.value.fix


def test_sibling_loops_share_a_variable_nested_ones_do_not():
    k = Kernel("k", block=32)
    n = k.symbol("N")
    out = k.tensor("out", (n,))
    for _ in range(2):
        with k.loop("i", 4) as i:
            k.store(out, i, 1.0)
    with k.loop("j", 4):
        with pytest.raises(NameClashError, match="enclosing loop"):
            with k.loop("j", 2):
                pass
    k.graph.verify()


def test_auto_registers_skip_names_the_user_took():
    k = Kernel("k", block=32)
    k.symbol("v0")
    assert str(k.assign(1.0)) == "v1"


def test_forged_handles_are_refused():
    k = Kernel("k", block=32)
    with pytest.raises(BuildError, match="not a tensor or buffer of kernel 'k'"):
        k.load(Buffer("x; y", "float32", (4,), "shared"), 0)


def test_verify_refuses_a_name_that_is_not_an_identifier():
    kg = small().graph
    kg[kg.nodes("for")[0]]["var"] = "i; x"
    err = expect(kg, "identifier", "for")
    assert "'i; x'" in str(err) and "not a C identifier" in str(err)


def test_verify_refuses_names_used_for_two_things():
    kg = small().graph
    kg[kg.nodes("for")[0]]["var"] = "N"  # the loop would shadow the symbol
    err = expect(kg, "name-unique", "for")
    assert "'N'" in str(err)
    kg = small().graph
    kg[kg.nodes("exp")[0]]["dst"] = "x"  # a register named like a tensor
    expect(kg, "name-unique", "exp")


def test_verify_refuses_a_nested_loop_reusing_a_variable():
    k = Kernel("k", block=32)
    with k.loop("i", 4):
        with k.loop("j", 4):
            k.syncthreads()
    kg = k.graph
    kg[kg.nodes("for")[1]]["var"] = "i"
    expect(kg, "name-unique", "for")


def test_verify_names_the_rule_that_made_a_node():
    kg = small().graph
    n = kg.add("alloc", kg.root, origin={"by": "rule", "rule": "make-buf", "at": "my.rules:7"},
               buf="b\n#define x", space="shared", dtype="float32", shape=(4,))
    err = expect(kg, "identifier", "alloc")
    assert err.node == n and "rule make-buf @ my.rules:7" in str(err)
    assert "\n" not in str(err)  # the hostile name is shown escaped, on one line


@pytest.mark.parametrize("op, key, value", [("alloc", "shape", (0,)), ("alloc", "shape", (2.5,)),
                                            ("alloc", "align", True), ("bar_sync", "count", "32")])
def test_verify_refuses_int_attributes_that_are_not_ints(op, key, value):
    kg = small().graph
    attrs = {"alloc": dict(buf="b", space="shared", dtype="float32", shape=(4,)),
             "bar_sync": dict(id=1, count=32)}[op]
    n = kg.add(op, kg.root, **{**attrs, key: value})
    assert expect(kg, "int-valued", op).node == n


def test_verify_refuses_terms_codegen_cannot_print():
    kg = small().graph
    store = kg.nodes("store")[0]
    kg[store]["index"] = Term("call", (), "atomicAdd")
    assert "not a device function" in str(expect(kg, "term", "store"))
    kg[store]["index"] = Term("const", (), float("inf"))
    expect(kg, "term", "store")
    kg[store]["index"] = Term("; x", (name("i"),))
    expect(kg, "term", "store")


def test_a_term_may_not_name_a_tensor():
    kg = small().graph
    kg[kg.nodes("store")[0]]["index"] = parse("x + 1")  # a pointer, not an index
    expect(kg, "name-defined", "store")


def test_grid_terms_use_symbols_only():
    k = small()
    k.grid("N / 64 + i")  # i is a loop variable: the host cannot compute it
    expect(k.graph, "name-defined", "kernel")


def test_verify_walks_and_orders_as_the_graph_does():
    """verify() reads the tree and the depends edges once: the same walk as ``kg.walk()``, and an
    edge between nodes of different scopes named as before (the first in id order)."""
    from cbrules import api
    from cbrules.ir.verify import _tree
    from cbrules.kernels import KERNELS
    kg = api.lower(KERNELS["two_pass"].build(KERNELS["two_pass"].default_shape))  # nested scopes
    assert len(kg.nodes("for")) > 2 and _tree(kg)[0] == list(kg.walk())
    kg = small().graph
    (loop,) = kg.nodes("for")
    load, ex, store = kg.children(loop)
    kg.add_depends(store, loop)
    kg.add_depends(load, loop)
    assert expect(kg, "depends-siblings").node == loop and f"#{load} load" in str(expect(kg, "depends-siblings"))
    kg = small().graph
    kg.add_depends(kg.root, kg.root)  # orders nothing: as sibling_edges drops it, so does verify()
    kg.verify()


def test_valid_names_are_remembered_per_namespace():
    """A name found valid for the rules (cb_ prefix) is still refused to a user."""
    from cbrules.ir.names import RULES, USER, problem
    assert problem("cb_full_3", RULES) is None and problem("cb_full_3", RULES) is None
    assert problem("cb_full_3", USER) is not None
    assert problem("_Reserved", RULES) is not None and problem("ok_name", USER) is None
