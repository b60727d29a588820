"""The attention kernel on a Hopper GPU: L in 1, 17, 128, 1000, 4096 x D in 64, 128, 256 x causal both x warp
specialization both, bfloat16 (and float16, queries and keys of different lengths, a softmax scale), outputs
poisoned first, against a float32 reference (torch's SDPA in float32 when torch is importable, else numpy).
FP8 (e4m3, e5m2) against the float64 numpy model of the kernel's own rounding of P (specs.attention_fp8_reference)."""
import numpy as np
import pytest

from cbrules import api
from cbrules.kernels import KERNELS
from cbrules.kernels.attention import attention
from cbrules.kernels.specs import attention_reference
from gpucheck import poisoned_launch, poisoned_run, unwritten_or_not_finite

pytestmark = pytest.mark.gpu
SPEC = KERNELS["attention"]
LENGTHS = (1, 17, 128, 1000, 4096)
TOL = {"bfloat16": 1.5e-2, "float16": 4e-3}


def _compiled(cache={}, **kw):
    key = tuple(sorted(kw.items()))
    if key not in cache:
        cache[key] = api.compile(attention(**kw))
    return cache[key]


def _reference(args, scale, causal):
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        torch = None
    if torch is not None and torch.cuda.is_available():
        q, k, v = (torch.from_numpy(np.asarray(args[n]).astype(np.float32)).cuda() for n in ("q", "k", "v"))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
        s = (q @ k.transpose(1, 2)) * scale
        if causal:
            lq, lk = s.shape[1:]
            s = s.masked_fill(torch.ones(lq, lk, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
        return {"o": o.double().cpu().numpy(), "lse": torch.logsumexp(s, dim=-1).double().cpu().numpy()}
    o, lse = attention_reference(args["q"], args["k"], args["v"], scale, causal, dtype=np.float32)
    return {"o": o.astype(np.float64), "lse": lse.astype(np.float64)}


def _run(shape, d, causal, dtype="bfloat16", scale=None, seed=0, **options):
    ck = _compiled(head_dim=d, causal=causal, dtype=dtype, lse=True, scale=scale, **options)
    spec = SPEC.variant(head_dim=d, causal=causal, lse=True, scale=scale)
    args = spec.make_inputs(shape, np.random.default_rng(seed), dtype)
    want = _reference(args, d ** -0.5 if scale is None else scale, causal)
    failures = poisoned_run(ck, args, want, ("o", "lse"), TOL[dtype], TOL[dtype], shape)  # both poisoned
    got_lse = np.asarray(args["lse"]).astype(np.float64)
    if not np.allclose(got_lse, want["lse"], rtol=1e-4, atol=1e-4):  # float32 statistics: tighter
        failures.append(f"shape {shape}: lse differs (max error {np.nanmax(np.abs(got_lse - want['lse'])):.3g})")
    return failures


@pytest.mark.parametrize("ws", [False, True], ids=["plain", "warp-specialized"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_lengths(d, causal, ws):
    failures = [f for n in LENGTHS for f in _run((3 if n < 4096 else 2, n, n), d, causal, stages=2,
                                                    warp_specialize=ws, seed=n)]
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("d", [64, 128])
def test_float16_three_stages(d):
    failures = [f for n in (17, 1000) for f in _run((2, n, n), d, True, "float16", stages=3, warp_specialize=True)]
    assert not failures, "\n".join(failures)


def test_queries_and_keys_of_other_lengths_and_a_scale():
    failures = [f for shape in ((2, 100, 3000), (2, 3000, 100), (1, 333, 777))
                for causal in (False, True)
                for f in _run(shape, 64, causal, scale=0.2, stages=2, warp_specialize=True)]
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("d", [64, 128, 256])
def test_persistent(d):
    """A block per SM (and fewer blocks than tiles: each walks several) at every length, its defaults'
    stages; queries and keys of other lengths, more heads than blocks."""
    shapes = [(5, n, n) for n in LENGTHS] + [(7, 100, 3000), (3, 3000, 100)]
    failures = [f for shape in shapes for blocks in (132, 5)
                for f in _run(shape, d, False, warp_specialize=True, persistent=blocks, seed=shape[1])]
    assert not failures, "\n".join(failures)


FP8_LENGTHS = (16, 128, 1008, 4096)  # V^T's rows (Lk bytes) in multiples of 16


def _run_fp8(shape, d, causal, dtype="float8_e4m3", seed=0, **options):
    """Every element written (outputs poisoned) and finite; o against the exact attention of the dequantized
    inputs by the norm of the difference (P's FP8 rounding), lse within the FP8 tensor cores' drift: the
    spec's device check, what `cbrules run` judges by (cbrules.kernels.specs.attention_fp8_check)."""
    ck = _compiled(head_dim=d, causal=causal, dtype=dtype, lse=True, **options)
    spec = SPEC.variant(head_dim=d, causal=causal, lse=True).for_dtype(dtype)
    args = spec.make_inputs(shape, np.random.default_rng(seed), dtype)
    want = spec.expected(args)
    poisoned_launch(ck, args, ("o", "lse"))
    failures = unwritten_or_not_finite(args, ("o", "lse"), shape)
    for name in ("o", "lse"):
        good, what = spec.device_check(name, args[name], want, args)
        if not good:
            failures.append(f"shape {shape}: {name}: {what}")
    return failures


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_fp8_lengths(d, causal):
    failures = [f for n in FP8_LENGTHS for f in _run_fp8((3 if n < 4096 else 1, n, n), d, causal,
                                                          warp_specialize=True, seed=n)]
    assert not failures, "\n".join(failures)


def test_fp8_e5m2_plain_persistent_and_other_lengths():
    failures = [f for shape in ((2, 100, 3008), (2, 3000, 112)) for f in _run_fp8(shape, 128, False, "float8_e5m2",
                                                                                   warp_specialize=True)]
    failures += [f for shape in ((5, 1000, 1008), (3, 333, 784)) for f in _run_fp8(shape, 64, True, stages=2)]
    failures += [f for blocks in (132, 5) for f in _run_fp8((5, 1000, 1008), 128, False, warp_specialize=True,
                                                             persistent=blocks)]
    assert not failures, "\n".join(failures)
