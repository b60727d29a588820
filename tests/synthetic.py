"""Synthetic kernels of a chosen size, for the engine's scaling tests (and benchmarks/compile_times.py):
a circular-buffered loop holding a long chain of elementwise ops ("long body"), or many
circular-buffered loops ("many loops")."""


def synthetic(family: str, nodes: int):
    """A kernel of about ``nodes`` nodes as built."""
    from cbrules.ir.builder import Kernel, ceil_div, circular_buffer, threadIdx
    k = Kernel(f"synthetic_{family.replace(' ', '_')}", block=256)
    n = k.symbol("N")
    x, out = k.tensor("x", (n,)), k.tensor("out", (n,))
    xm = k.tensor_map(x, box=(256,))
    k.grid(1)
    if family == "long body":  # 6 fixed nodes + the chain
        tile = k.alloc("tile", "shared", "float32", (256,))
        with k.loop("j", ceil_div(n, 256), circular_buffer=circular_buffer(3)) as j:
            k.tma_load(xm, (j * 256,), tile)
            v = k.load(tile, threadIdx.x)
            for i in range(max(nodes - 6, 1)):
                v = k.add(v, float(i % 7 + 1)) if i % 2 else k.mul(v, 1.0001)
            k.store(out, j * 256 + threadIdx.x, v)
    else:  # many loops: 8 nodes each (alloc, for, tma_load, load, 3 ops, store)
        for q in range(max(nodes // 8, 1)):
            tile = k.alloc(f"tile{q}", "shared", "float32", (256,))
            with k.loop(f"j{q}", ceil_div(n, 256), circular_buffer=circular_buffer(3)) as j:
                k.tma_load(xm, (j * 256,), tile)
                v = k.load(tile, threadIdx.x)
                v = k.exp(k.add(k.mul(v, 2.0), float(q)))
                k.store(out, j * 256 + threadIdx.x, v)
    return k
