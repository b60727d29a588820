"""The scheduler derives sibling order from depends edges only, deterministically."""
import pytest

from cbrules.ir.builder import Kernel, threadIdx
from cbrules.ir.graph import KernelGraph
from cbrules.schedule import ScheduleError, linear_order, print_program, schedule
from cbrules.kernels.exp1d import exp1d_tma


def test_order_follows_depends_not_creation():
    kg = KernelGraph("k", block=(32, 1, 1))
    a = kg.add("syncthreads", kg.root)
    b = kg.add("fence_proxy_async", kg.root)
    c = kg.add("fence_mbarrier_init", kg.root)
    assert linear_order(kg) == [kg.root, a, b, c]  # ties: creation order
    kg.add_depends(c, a)
    assert linear_order(kg) == [kg.root, b, c, a]


def test_cross_scope_edges_are_lifted_to_siblings():
    kg = KernelGraph("k", block=(32, 1, 1))
    s1 = kg.add("if", kg.root, pred=None)
    inner = kg.add("syncthreads", s1)
    s2 = kg.add("syncthreads", kg.root)
    kg.add_depends(s2, inner)  # lifted to s2 -> s1
    assert linear_order(kg) == [kg.root, s2, s1, inner]


def test_cycle_error_names_the_nodes():
    kg = KernelGraph("k")
    a = kg.add("syncthreads", kg.root)
    b = kg.add("fence_proxy_async", kg.root)
    kg.add_depends(a, b)
    kg.add_depends(b, a)
    with pytest.raises(ScheduleError) as e:
        schedule(kg)
    assert f"#{a} syncthreads" in str(e.value) and f"#{b} fence_proxy_async" in str(e.value)


def test_schedule_is_deterministic_and_keeps_program_order():
    p1 = print_program(schedule(exp1d_tma().graph))
    p2 = print_program(schedule(exp1d_tma().graph))
    assert p1 == p2
    ops = [line.split()[0] for line in p1.splitlines()]
    assert ops.index("mbarrier_arrive_expect_tx") < ops.index("tma_load") < ops.index("mbarrier_wait") \
        < ops.index("load") < ops.index("exp") < ops.index("store") < ops.index("mbarrier_inval")


def test_independent_compute_may_reorder_but_memory_keeps_order():
    k = Kernel("k", block=32)
    n = k.symbol("N")
    x, out = k.tensor("x", (n,)), k.tensor("out", (n,))
    a = k.load(x, threadIdx.x)
    k.store(out, threadIdx.x, a)
    k.syncthreads()
    k.load(x, threadIdx.x)
    kg = k.graph
    store, sync, load2 = kg.nodes("store")[0], kg.nodes("syncthreads")[0], kg.nodes("load")[1]
    edges = kg.depends_edges()
    assert (store, sync) in edges and (sync, load2) in edges
