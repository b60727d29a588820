"""The autotuner on a Hopper GPU: `cbrules tune` measures matmul_tc's declared configurations and a
second process takes the choice from the cache without compiling or measuring; the torch drop-ins,
autotuned, compute what torch does and leave their choice in the cache."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[1]


def _tune(folder: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "CBRULES_TUNE_DIR": str(folder)}
    return subprocess.run([sys.executable, "-m", "cbrules.cli", "tune", "matmul_tc", "--shape", "512,768,256",
                           "--workers", "4", *extra], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_tune_measures_then_a_second_process_reuses_the_choice(tmp_path):
    first = _tune(tmp_path)
    assert first.returncode == 0, first.stderr
    assert "<- chosen" in first.stdout and "compiled 5/5" in first.stderr
    assert "(from the tuning cache)" not in first.stdout
    assert len(first.stdout.splitlines()) >= 7, first.stdout  # header, five configurations, the choice
    second = _tune(tmp_path)
    assert second.returncode == 0, second.stderr
    assert "(from the tuning cache)" in second.stdout and "compiled" not in second.stderr
    chosen = [ln for ln in first.stdout.splitlines() if ln.startswith("chosen")]
    assert chosen and chosen[0] in second.stdout  # the same choice


def test_the_torch_functions_autotuned(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    monkeypatch.setenv("CBRULES_TUNE_DIR", str(tmp_path))
    import cbrules.torch as cbt
    cbt.set_autotune(True)
    try:
        x = torch.randn(1000, 512, dtype=torch.bfloat16, device="cuda")
        w = torch.randn(768, 512, dtype=torch.bfloat16, device="cuda") / 22
        y = cbt.linear(x, w, activation="silu")
        torch.testing.assert_close(y.float(), torch.nn.functional.silu(x.float() @ w.float().t()), rtol=2e-2,
                                   atol=2e-2)
        q = torch.randn(2, 4, 1000, 64, dtype=torch.bfloat16, device="cuda")
        o = cbt.attention(q, q, q)
        want = torch.nn.functional.scaled_dot_product_attention(q.float(), q.float(), q.float())
        torch.testing.assert_close(o.float(), want, rtol=2e-2, atol=2e-2)
    finally:
        cbt.set_autotune(False)
    assert len(list(tmp_path.glob("*.json"))) == 2  # one choice for each
