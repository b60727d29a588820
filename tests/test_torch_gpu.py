"""cbrules inside PyTorch programs on a Hopper GPU: launches go to torch's current stream (a side stream
between torch ops), never synchronise, replay from a CUDA graph; the custom ops run under
torch.compile(fullgraph=True); the drop-in functions against torch's own, outputs poisoned."""
import numpy as np
import pytest

from cbrules import api
from cbrules.codegen import runtime
from cbrules.ir.limits import TmaLimitError
from cbrules.kernels.reductions import inner_reduction

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("torch has no CUDA", allow_module_level=True)
cbt = pytest.importorskip("cbrules.torch")
F = torch.nn.functional


@pytest.fixture(scope="module")
def rowsum():
    return api.compile(inner_reduction(stages=3))


def _poisoned(*shape, dtype=torch.float32):
    return torch.full(shape, float("nan"), dtype=dtype, device="cuda")


def test_a_launch_between_torch_ops_on_a_side_stream_is_ordered_on_it(rowsum):
    s = torch.cuda.Stream()
    a = torch.randn(4096, 4096, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        x = (a @ a)[:512].contiguous()  # long enough that a launch on another stream would read it early
        out = _poisoned(512)
        assert runtime.launch_stream([runtime.as_device_array(x)]) == s.cuda_stream
        rowsum(x=x, out=out)
        y = out * 2  # and torch's next op sees the result
    s.synchronize()
    want = (a.double() @ a.double())[:512].sum(1) * 2
    torch.testing.assert_close(y.double(), want, rtol=1e-4, atol=1e-2 * 4096 ** 0.5)


def test_an_explicit_stream_wins(rowsum):
    s = torch.cuda.Stream()
    x = torch.randn(300, 1000, device="cuda")
    out = _poisoned(300)
    torch.cuda.synchronize()
    rowsum(x=x, out=out, stream=s)
    s.synchronize()
    torch.testing.assert_close(out, x.sum(1), rtol=1e-5, atol=1e-4)


def test_the_launcher_does_not_wait():
    q = torch.randn(16, 16384, 128, dtype=torch.bfloat16, device="cuda")
    ck = cbt._attention_kernel(torch.bfloat16, 128, False, 128 ** -0.5)
    o = torch.empty_like(q)
    ck(q=q, k=q, v=q, o=o)  # warm: the module is loaded
    torch.cuda.synchronize()
    ck(q=q, k=q, v=q, o=o)  # about 4 ms of work (a call returns in microseconds): still running
    assert not torch.cuda.current_stream().query()
    torch.cuda.synchronize()


def test_a_cuda_graph_replays_cbrules_launches(rowsum):
    x = torch.randn(256, 1024, device="cuda")
    w = torch.randn(512, 1024, dtype=torch.bfloat16, device="cuda")
    out = _poisoned(256)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up off the capture, as torch asks
        rowsum(x=x, out=out)
        cbt.linear(x.bfloat16(), w, activation="relu")
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        rowsum(x=x, out=out)
        y = cbt.linear(x.bfloat16(), w, activation="relu")
    for seed in (1, 2):
        x.copy_(torch.randn(256, 1024, generator=torch.Generator("cuda").manual_seed(seed), device="cuda"))
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, x.sum(1), rtol=1e-5, atol=1e-3)
        torch.testing.assert_close(y.float(), F.relu(F.linear(x.bfloat16(), w)).float(), rtol=2e-2, atol=0.3)


def test_custom_ops_under_torch_compile_fullgraph(rowsum):
    op = cbt.kernel_op("cbrules_gpu::rowsum", inner_reduction(stages=2))

    def block(x, w, b):
        h = cbt.linear(x, w, b, "gelu")
        return op(h.float()) + h.float().mean(1), cbt.attention(h.view(2, 4, 128, 64), h.view(2, 4, 128, 64),
                                                                h.view(2, 4, 128, 64), causal=True)
    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True)
    x = torch.randn(1024, 512, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(64, 512, dtype=torch.bfloat16, device="cuda") / 16
    b = torch.randn(64, dtype=torch.bfloat16, device="cuda")
    got = compiled(x, w, b)
    h = F.gelu(F.linear(x.float(), w.float(), b.float()))
    hb = h.bfloat16().view(2, 4, 128, 64)
    want = (h.sum(1) + h.mean(1), F.scaled_dot_product_attention(hb.float(), hb.float(), hb.float(), is_causal=True))
    torch.testing.assert_close(got[0], want[0], rtol=2e-2, atol=0.5)
    torch.testing.assert_close(got[1].float(), want[1], rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("activation", [None, "relu", "gelu", "gelu_tanh", "silu"], ids=str)
def test_linear_against_torch(dtype, activation):
    g = torch.Generator("cuda").manual_seed(0)
    for lead, n, k in (((3, 100), 264, 512), ((1000,), 1024, 136), ((7,), 8, 8)):
        x = torch.randn(*lead, k, dtype=dtype, device="cuda", generator=g)
        w = torch.randn(n, k, dtype=dtype, device="cuda", generator=g) / k ** 0.5
        bias = torch.randn(n, dtype=dtype, device="cuda", generator=g)
        for b in (None, bias):
            got = cbt.linear(x, w, b, activation)
            want = cbt._activate(F.linear(x.float(), w.float(), None if b is None else b.float()), activation)
            assert got.shape == want.shape and got.dtype == dtype
            torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)


def test_matmul_and_its_edges():
    g = torch.Generator("cuda").manual_seed(1)
    a = torch.randn(333, 256, dtype=torch.bfloat16, device="cuda", generator=g)
    b = torch.randn(256, 200, dtype=torch.bfloat16, device="cuda", generator=g)
    torch.testing.assert_close(cbt.matmul(a, b).float(), a.float() @ b.float(), rtol=2e-2, atol=0.1)
    at = torch.randn(256, 333, dtype=torch.bfloat16, device="cuda", generator=g).t()  # not contiguous
    torch.testing.assert_close(cbt.matmul(at, b).float(), at.float() @ b.float(), rtol=2e-2, atol=0.1)
    empty = torch.empty(0, 256, dtype=torch.bfloat16, device="cuda")
    assert cbt.matmul(empty, b).shape == (0, 200)
    no_k = cbt.matmul(torch.empty(5, 0, dtype=torch.bfloat16, device="cuda"),
                      torch.empty(0, 8, dtype=torch.bfloat16, device="cuda"))
    assert no_k.shape == (5, 8) and not no_k.any()


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_against_sdpa(d, causal):
    g = torch.Generator("cuda").manual_seed(d)
    for shape_q, lk in (((2, 3, 300), 300), ((1, 2, 1000), 700), ((4, 17), 17)):
        q = torch.randn(*shape_q, d, dtype=torch.bfloat16, device="cuda", generator=g)
        k, v = (torch.randn(*shape_q[:-1], lk, d, dtype=torch.bfloat16, device="cuda", generator=g) for _ in "kv")
        for scale in (None, 0.3):
            got = cbt.attention(q, k, v, causal=causal, scale=scale)
            want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal, scale=scale)
            torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)


def test_a_kernel_of_ones_own_runs_as_its_op():
    op = cbt.kernel_op("cbrules_gpu::rowsum_plain", inner_reduction(stages=2))
    x = torch.randn(77, 3000, device="cuda")
    torch.testing.assert_close(op(x), x.sum(1), rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(op(x.t().contiguous().t()), x.sum(1), rtol=1e-5, atol=1e-3)  # made contiguous
    assert np.isfinite(op(x).cpu().numpy()).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_the_row_functions_against_torch(dtype):
    g = torch.Generator("cuda").manual_seed(5)
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)
    for shape in ((4, 33, 4096), (1000, 1024)):
        x = torch.randn(*shape, dtype=dtype, device="cuda", generator=g) * 2 + 0.5
        w = torch.randn(shape[-1], dtype=dtype, device="cuda", generator=g)
        b = torch.randn(shape[-1], dtype=dtype, device="cuda", generator=g)
        xf, wf, bf = x.float(), w.float(), b.float()
        n = (shape[-1],)
        torch.testing.assert_close(cbt.rms_norm(x, n, w, 1e-6).float(), F.rms_norm(xf, n, wf, 1e-6), **tol)
        torch.testing.assert_close(cbt.rms_norm(x, n).float(), F.rms_norm(xf, n, eps=torch.finfo(dtype).eps), **tol)
        torch.testing.assert_close(cbt.layer_norm(x, n, w, b).float(), F.layer_norm(xf, n, wf, bf), **tol)
        torch.testing.assert_close(cbt.layer_norm(x, n).float(), F.layer_norm(xf, n), **tol)
        torch.testing.assert_close(cbt.softmax(x).float(), torch.softmax(xf, -1), **tol)
        torch.testing.assert_close(cbt.softmax(x.transpose(0, -1).contiguous().transpose(0, -1)).float(),
                                   torch.softmax(xf, -1), **tol)  # not contiguous: made so


def test_swiglu_and_the_residual_epilogue():
    g = torch.Generator("cuda").manual_seed(6)
    ab = torch.randn(3, 50, 2 * 1376, dtype=torch.bfloat16, device="cuda", generator=g)
    gate, up = ab.float().chunk(2, dim=-1)
    torch.testing.assert_close(cbt.swiglu(ab).float(), F.silu(gate) * up, rtol=2e-2, atol=2e-2)
    x = torch.randn(2, 300, 512, dtype=torch.bfloat16, device="cuda", generator=g)
    w = torch.randn(264, 512, dtype=torch.bfloat16, device="cuda", generator=g) / 22
    r = torch.randn(2, 300, 264, dtype=torch.bfloat16, device="cuda", generator=g)
    torch.testing.assert_close(cbt.linear(x, w, residual=r).float(), F.linear(x.float(), w.float()) + r.float(),
                               rtol=2e-2, atol=3e-2)


def test_the_transformer_block_example_matches_eager_torch():
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "examples" / "transformer_block.py"
    spec = importlib.util.spec_from_file_location("transformer_block", path)
    block = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(block)
    g = torch.Generator("cuda").manual_seed(7)
    p = block.make_weights(512, 4, 1376, g)
    x = torch.randn(2 * 256, 512, device="cuda", generator=g).bfloat16()
    want = block.block_torch(x.float(), {k: v.float() for k, v in p.items()}, 2, 4)
    got = block.block_cbrules(x, p, 2, 4)
    torch.testing.assert_close(got.float(), want, rtol=3e-2, atol=6e-2)


def test_numpy_beside_torch_is_refused_by_name(rowsum):
    from cbrules.codegen.launch import LaunchError
    with pytest.raises(LaunchError, match="numpy arrays .out. beside torch tensors"):
        rowsum(x=torch.randn(3, 256, device="cuda"), out=np.empty(3, np.float32))


def test_grouped_query_attention_against_sdpa():
    g = torch.Generator("cuda").manual_seed(8)
    q = torch.randn(2, 8, 300, 128, dtype=torch.bfloat16, device="cuda", generator=g)
    k, v = (torch.randn(2, 2, 300, 128, dtype=torch.bfloat16, device="cuda", generator=g) for _ in "kv")
    for causal in (False, True):
        got = cbt.attention(q, k, v, causal=causal, enable_gqa=True)
        want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal, enable_gqa=True)
        torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("causal", [False, True])
def test_fp8_attention_against_sdpa_of_the_dequantized_inputs(causal):
    """FP8 q, k, v [2, 3, L, 128] (Lk = 333: V^T's rows padded inside) against SDPA of the dequantized inputs:
    the norm of the difference within e4m3's unit roundoff of o's (P's rounding moves it by about 0.025;
    cbrules.kernels.specs.FP8_ATTENTION_ERROR)."""
    from cbrules.kernels.specs import FP8_ATTENTION_ERROR
    g = torch.Generator("cuda").manual_seed(9)
    q, k, v = (torch.randn(2, 3, n, 128, device="cuda", generator=g) for n in (300, 333, 333))
    scales = [float(x.abs().amax()) / 448 for x in (q, k, v)]
    q8, k8, v8 = ((x / s).to(torch.float8_e4m3fn) for x, s in zip((q, k, v), scales))
    got = cbt.attention(q8, k8, v8, causal=causal, descale=tuple(scales))
    assert got.dtype == torch.bfloat16 and got.shape == (2, 3, 300, 128) and bool(got.isfinite().all())
    qd, kd, vd = (x.double() * s for x, s in zip((q8, k8, v8), scales))
    want = F.scaled_dot_product_attention(qd, kd, vd, is_causal=causal)
    assert float((got.double() - want).norm() / want.norm()) <= FP8_ATTENTION_ERROR["float8_e4m3"]


def test_a_second_launch_of_the_same_layouts_takes_new_addresses_and_still_refuses_by_name(rowsum):
    """Later calls with tensors of the first call's layouts reuse its checked plan: new addresses each
    time (results right), a side stream followed, and an address the kernel cannot take (misaligned)
    still a named LaunchError."""
    xs = [torch.randn(300, 1000, device="cuda") for _ in range(3)]
    outs = [_poisoned(300) for _ in range(3)]
    for x, out in zip(xs, outs):
        assert rowsum(x=x, out=out) == {"M": 300, "N": 1000}
    planned = len(rowsum._plans)  # the fixture is shared: other tests' layouts may have plans too
    s = torch.cuda.Stream()
    late = _poisoned(300)
    with torch.cuda.stream(s):
        big = torch.randn(4096, 4096, device="cuda")
        x3 = (big @ big)[:300, :1000].contiguous()
        rowsum(x=x3, out=late)
    s.synchronize()
    for x, out in zip(xs + [x3], outs + [late]):
        torch.testing.assert_close(out, x.sum(1), rtol=1e-4, atol=1e-1)
    assert len(rowsum._plans) == planned
    base = torch.randn(300 * 1000 + 4, device="cuda")
    moved = base[4:].view(300, 1000)  # 16 bytes on: another address TMA can take, the same plan
    rowsum(x=moved, out=outs[0])
    torch.testing.assert_close(outs[0], moved.sum(1), rtol=1e-4, atol=1e-1)
    assert len(rowsum._plans) == planned
    with pytest.raises(TmaLimitError, match="16-byte aligned"):  # x is read by TMA: its address in 16 bytes
        rowsum(x=base[1:300 * 1000 + 1].view(300, 1000), out=outs[0])


def test_a_planned_launch_still_refuses_an_address_its_vectors_cannot_take():
    from cbrules.codegen.launch import LaunchError
    from cbrules.kernels.rows import row_op
    ck = api.compile(row_op("rms_norm", row=1024, dtype="bfloat16", eps=1e-6))
    w = torch.ones(1024, dtype=torch.bfloat16, device="cuda")
    base = torch.randn(8 * 1024 + 8, dtype=torch.bfloat16, device="cuda")
    out = torch.empty(8, 1024, dtype=torch.bfloat16, device="cuda")
    ck(x=base[:8 * 1024].view(8, 1024), weight=w, out=out)  # the plan: 16-byte vectors of x
    with pytest.raises(LaunchError, match="16-byte aligned"):
        ck(x=base[2:8 * 1024 + 2].view(8, 1024), weight=w, out=out)
