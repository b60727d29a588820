"""cbrules.torch on the CPU: the module stays out of ``import cbrules``; with torch installed (a CPU
build is enough), custom ops from kernels of one's own and the drop-in functions trace whole through
torch.export and torch.compile(fullgraph=True) (their fake implementations give the shapes), and every
misuse is a named TorchOpError. The stream launcher's argument checks need no GPU either."""
import subprocess
import sys

import pytest

from cbrules.codegen import runtime

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_import_cbrules_does_not_load_torch():
    r = _python("import sys, cbrules, cbrules.api, cbrules.cli, cbrules.kernels, cbrules.codegen.launch\n"
                "assert 'torch' not in sys.modules, 'torch loaded'\nprint('ok')")
    assert r.stdout.strip() == "ok", r.stderr


def test_without_torch_the_module_says_what_it_needs():
    r = _python("import sys\nsys.modules['torch'] = None\n"
                "try:\n    import cbrules.torch\nexcept ImportError as e:\n    print(e)")
    assert "cbrules.torch needs PyTorch" in r.stdout, r.stdout + r.stderr


def test_a_stream_must_be_a_stream():
    for bad in ("s", 1.5, -1, True, [0], 1 << 64):
        with pytest.raises(TypeError, match="stream="):
            runtime.launch_stream([], bad)
    assert runtime.launch_stream([], 7) == 7
    assert runtime.launch_stream([], type("S", (), {"cuda_stream": 9})()) == 9
    assert runtime.launch_stream([]) is None  # no torch tensor: the legacy default stream


torch = pytest.importorskip("torch")
cbt = pytest.importorskip("cbrules.torch")


def _graph_of(fn, *args):
    """The FX graph torch.export makes of ``fn`` (fake tensors: nothing runs)."""
    class M(torch.nn.Module):
        def forward(self, *a):
            return fn(*a)
    return torch.export.export(M(), args).graph


def _targets(graph) -> list[str]:
    return [str(n.target) for n in graph.nodes if n.op == "call_function"]


def test_the_drop_in_functions_trace_as_one_op_each_with_torch_shapes():
    x = torch.randn(4, 16, 64, dtype=torch.bfloat16)
    w = torch.randn(96, 64, dtype=torch.bfloat16)
    b = torch.randn(64, 40, dtype=torch.bfloat16)
    q, k = torch.randn(2, 3, 100, 128, dtype=torch.float16), torch.randn(2, 3, 70, 128, dtype=torch.float16)

    def fn(x, w, b, q, k):
        return cbt.linear(x, w, None, "silu"), cbt.matmul(x[0], b), cbt.attention(q, k, k, causal=True)
    graph = _graph_of(fn, x, w, b, q, k)
    targets = _targets(graph)
    for op in ("cbrules.linear.default", "cbrules.matmul.default", "cbrules.attention.default"):
        assert targets.count(op) == 1, targets
    shapes = [tuple(n.meta["val"].shape) for n in graph.nodes if str(n.target).startswith("cbrules.")]
    assert shapes == [(4, 16, 96), (16, 40), (2, 3, 100, 128)]


def test_grouped_query_attention_traces_with_the_query_heads():
    q = torch.randn(2, 8, 100, 64, dtype=torch.bfloat16)
    kv = torch.randn(2, 2, 70, 64, dtype=torch.bfloat16)
    graph = _graph_of(lambda q, k, v: cbt.attention(q, k, v, causal=True, enable_gqa=True), q, kv, kv)
    (node,) = [n for n in graph.nodes if str(n.target) == "cbrules.attention.default"]
    assert [tuple(a.meta["val"].shape) for a in node.args[:3]] == [(2, 8, 100, 64), (2, 8, 70, 64), (2, 8, 70, 64)]
    with pytest.raises(cbt.TorchOpError, match="must divide the query heads"):
        cbt.attention(q, kv[:, :1].expand(2, 3, 70, 64), kv[:, :1].expand(2, 3, 70, 64), enable_gqa=True)
    with pytest.raises(cbt.TorchOpError, match="enable_gqa=True"):
        cbt.attention(q, kv, kv)  # without it, fewer key heads are refused by name


def test_fp8_attention_traces_as_one_op_with_a_bfloat16_output():
    q = torch.randn(2, 3, 100, 128).to(torch.float8_e4m3fn)
    k = torch.randn(2, 3, 70, 128).to(torch.float8_e4m3fn)
    graph = _graph_of(lambda q, k, v: cbt.attention(q, k, v, causal=True, descale=(0.5, 0.25, 2.0)), q, k, k)
    (node,) = [n for n in graph.nodes if str(n.target) == "cbrules.attention_fp8.default"]
    assert tuple(node.meta["val"].shape) == (2, 3, 100, 128) and node.meta["val"].dtype == torch.bfloat16
    assert list(node.args[5]) == [0.5, 0.25, 2.0]
    kv = torch.randn(2, 1, 70, 128).to(torch.float8_e4m3fn)  # grouped-query: the key heads read repeated
    graph = _graph_of(lambda q, k, v: cbt.attention(q, k, v, enable_gqa=True, descale=(1.0, 1.0, 1.0)), q, kv, kv)
    (node,) = [n for n in graph.nodes if str(n.target) == "cbrules.attention_fp8.default"]
    assert [tuple(a.meta["val"].shape) for a in node.args[:3]] == [(2, 3, 100, 128), (2, 3, 70, 128), (2, 3, 70, 128)]


def test_fp8_attention_refusals_by_name():
    q8 = torch.randn(2, 10, 64).to(torch.float8_e4m3fn)
    q3, kv2 = (torch.randn(1, h, 10, 64).to(torch.float8_e4m3fn) for h in (3, 2))  # 2 key heads for 3 query heads
    cases = [
        (lambda: cbt.attention(q8, q8, q8), r"need descale=\(scale_q, scale_k, scale_v\)"),
        (lambda: cbt.attention(q8, q8, q8, descale=(1.0, 1.0)), "need descale"),
        (lambda: cbt.attention(q8, q8, q8, descale=(1.0, torch.tensor(2.0), 1.0)), "scale_k=tensor"),
        (lambda: cbt.attention(q8, q8, q8, descale=(1.0, 1.0, float("nan"))), "positive finite"),
        (lambda: cbt.attention(q8, q8.to(torch.float8_e5m2), q8, descale=(1, 1, 1)), "FP8 operands of one dtype"),
        (lambda: cbt.attention(q8, q8, q8, descale=(1, 1, 1)), "on cpu; cbrules kernels run on CUDA"),
        (lambda: cbt.attention(q8, q8[:, :, :32], q8, descale=(1, 1, 1)), "same leading dimensions"),
        (lambda: cbt.attention(q3, kv2, kv2, enable_gqa=True, descale=(1, 1, 1)), "must divide the query heads"),
        (lambda: cbt.attention(*(torch.randn(2, 10, 64, dtype=torch.bfloat16),) * 3, descale=(1, 1, 1)),
         "descale is for FP8"),
        (lambda: cbt.attention(torch.randn(2, 10, 64, dtype=torch.bfloat16), q8, q8), "all in one FP8 type"),
    ]
    for call, what in cases:
        with pytest.raises(cbt.TorchOpError, match=what):
            call()


def test_torch_compile_fullgraph_keeps_the_ops_whole():
    captured = []

    def backend(gm, example_inputs):
        captured.append(gm)
        return gm.forward
    torch._dynamo.reset()
    f = torch.compile(lambda x, w: torch.relu(cbt.linear(x, w) * 2), fullgraph=True, backend=backend)
    x, w = torch.randn(8, 64, dtype=torch.bfloat16), torch.randn(32, 64, dtype=torch.bfloat16)
    with pytest.raises(cbt.TorchOpError, match="x is on cpu"):  # traced whole, then refused on the CPU
        f(x, w)
    (gm,) = captured
    assert "cbrules.linear.default" in _targets(gm.graph)


def _rowsum_kernel():
    from cbrules.kernels.reductions import inner_reduction
    return inner_reduction(stages=2)


def test_a_kernel_of_ones_own_as_a_custom_op():
    op = cbt.kernel_op("cbrules_test::rowsum", _rowsum_kernel())
    assert str(torch.ops.cbrules_test.rowsum.default._schema) == "cbrules_test::rowsum(Tensor x) -> Tensor"
    graph = _graph_of(lambda x: op(x) + 1, torch.randn(5, 300))
    (node,) = [n for n in graph.nodes if str(n.target) == "cbrules_test.rowsum.default"]
    assert tuple(node.meta["val"].shape) == (5,) and node.meta["val"].dtype == torch.float32
    with pytest.raises(cbt.TorchOpError, match="on cpu"):
        op(torch.randn(5, 300))


def test_symbols_no_input_gives_and_scalars_are_arguments():
    from cbrules.ir.builder import Kernel
    k = Kernel("fill", block=128)
    n = k.symbol("N")
    alpha = k.scalar("alpha")
    x = k.tensor("x", (n,))
    out = k.tensor("out", (n * 2,))
    with k.loop("i", n * 2) as i:
        k.store(out, i, k.mul(k.load(x, i / 2), alpha))
    op = cbt.kernel_op("cbrules_test::spread", k)
    assert str(torch.ops.cbrules_test.spread.default._schema) == \
        "cbrules_test::spread(Tensor x, float alpha) -> Tensor"
    graph = _graph_of(lambda x: op(x, 2.0), torch.randn(7))
    (node,) = [n for n in graph.nodes if str(n.target) == "cbrules_test.spread.default"]
    assert tuple(node.meta["val"].shape) == (14,)


def test_registration_refusals_by_name():
    for name in ("rowsum", "a::b::c", "1x::y", "x:: y", None):
        with pytest.raises(cbt.TorchOpError, match="namespace::op"):
            cbt.kernel_op(name, _rowsum_kernel())
    with pytest.raises(cbt.TorchOpError, match="not a cbrules kernel"):
        cbt.kernel_op("cbrules_test::nothing", object())


def test_call_refusals_by_name():
    def cpu(*shape, dtype=torch.bfloat16):  # every check but the device's comes first
        return torch.empty(*shape, dtype=dtype)
    x, w = torch.randn(8, 64, dtype=torch.bfloat16), torch.randn(32, 64, dtype=torch.bfloat16)
    cases = [
        (lambda: cbt.linear(x, w, activation="tanh"), "activation='tanh'"),
        (lambda: cbt.linear(x, torch.randn(32, 48, dtype=torch.bfloat16)), "in_features"),
        (lambda: cbt.linear(x.float(), w.float()), "bfloat16 or float16"),
        (lambda: cbt.linear(x, w.half()), "of one dtype"),
        (lambda: cbt.matmul(x, torch.randn(60, 8, dtype=torch.bfloat16)), r"\[M, K\] and \[K, N\]"),
        (lambda: cbt.attention(*(cpu(2, 10, 96),) * 3), "head dimension 96"),
        (lambda: cbt.attention(*(cpu(2, 10, 64),) * 3), "on cpu; cbrules kernels run on CUDA"),
        (lambda: cbt.attention(cpu(2, 10, 64), cpu(3, 10, 64), cpu(3, 10, 64)), "leading"),
        (lambda: cbt.attention(*(cpu(2, 10, 64),) * 3, scale=-1.0), "positive finite"),
        (lambda: cbt.linear(cpu(8, 60), cpu(32, 60)), "multiples of 8"),
        (lambda: cbt.linear(x, w, bias=cpu(31)), "bias has shape"),
    ]
    for call, what in cases:
        with pytest.raises(cbt.TorchOpError, match=what):
            call()


def test_a_compiled_kernel_with_two_outputs_as_a_custom_op():
    from cbrules import api
    from cbrules.ir.builder import Kernel, threadIdx
    k = Kernel("split2", block=128)
    n = k.symbol("N")
    x = k.tensor("x", (n, 128))
    lo, hi = k.tensor("lo", (n, 128)), k.tensor("hi", (n,))
    with k.loop("r", n) as r:
        v = k.load(x, r * 128 + threadIdx.x)
        k.store(lo, r * 128 + threadIdx.x, k.min(v, 0.0))
        with k.if_(threadIdx.x.eq(0)):
            k.store(hi, r, v)
    op = cbt.kernel_op("cbrules_test::split2", api.compile(k))  # a compiled kernel, not a Kernel
    assert str(torch.ops.cbrules_test.split2.default._schema) == "cbrules_test::split2(Tensor x) -> (Tensor, Tensor)"
    graph = _graph_of(lambda x: op(x), torch.randn(6, 128))
    (node,) = [nd for nd in graph.nodes if str(nd.target) == "cbrules_test.split2.default"]
    assert [tuple(t.shape) for t in node.meta["val"]] == [(6, 128), (6,)]
    with pytest.raises(cbt.TorchOpError, match="has 1 dimensions, the kernel takes 2"):
        op(torch.randn(6))


def test_a_first_call_says_what_it_compiled(caplog):
    import logging
    with caplog.at_level(logging.INFO, logger="cbrules"), pytest.raises(cbt.TorchOpError, match="on cpu"):
        cbt.softmax(torch.randn(3, 640))  # a row length no other test builds: compiled here, before the device check
    assert any("compiled softmax for softmax, 640, float32" in r.getMessage() for r in caplog.records), \
        [r.getMessage() for r in caplog.records]
