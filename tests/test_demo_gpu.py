"""The hand-built TMA kernel against numpy on a Hopper GPU, outputs poisoned before each launch."""
import numpy as np
import pytest

from cbrules import api
from cbrules.kernels.exp1d import exp1d_tma

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def kernel():
    return api.compile(exp1d_tma())


@pytest.mark.parametrize("n", [128, 1000, 1024, 2048, 2**24])
def test_exp1d_matches_numpy(kernel, n):
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n, dtype=np.float32)
    out = np.empty(n, np.float32)
    bound = kernel.bind(x=x, out=out)
    bound.arrays["out"].fill_bytes(0xFF)  # NaN everywhere: an unwritten element cannot pass
    bound.launch()
    bound.finish()
    np.testing.assert_allclose(out, np.exp(x), rtol=1e-5, atol=1e-6)


def test_exp1d_with_a_torch_tensor_in_place(kernel):
    torch = pytest.importorskip("torch")
    x = torch.randn(5000, device="cuda")
    out = torch.full((5000,), float("nan"), device="cuda")
    kernel(x=x, out=out)
    torch.cuda.synchronize()
    assert torch.allclose(out, torch.exp(x), rtol=1e-5, atol=1e-6)
