"""Issue 32 on a Hopper GPU: kernels whose TMA copies carry an L2 cache hint (and their maps an L2
promotion) and whose waits back off exponentially, by a term, or with a timeout compute what numpy
does (outputs poisoned); a wait that never completes traps with its message instead of hanging."""
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from cbrules import api
from cbrules.kernels import get
from gpucheck import poisoned_run
from rulekit import write_rules
from test_authoring import CACHE_HINTS, EXP_BACKOFF, TERM_BACKOFF

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("which", ["hints", "exp-backoff", "term-backoff"])
@pytest.mark.parametrize("name", ["single_dim", "pointwise"])
def test_hinted_kernels_match_numpy(tmp_path, name, which):
    text = {"hints": CACHE_HINTS, "exp-backoff": EXP_BACKOFF, "term-backoff": TERM_BACKOFF}[which]
    write_rules(tmp_path / which, text)
    sp = get(name)
    ck = api.compile(sp.build(stages=3, tma_store=which == "hints"), rules=[tmp_path / which])
    failures = []
    for shape in sp.shapes[::3]:
        args = sp.inputs(shape, np.random.default_rng(hash((name, which, shape)) % 2**32))
        failures += poisoned_run(ck, args, sp.reference(args), sp.outputs, *sp.tolerance(shape), shape)
    assert not failures, "\n".join(failures)


HANG = textwrap.dedent(r'''
    import sys
    from cbrules.codegen import hints
    from cbrules.codegen.cuda import PRELUDE, KernelSource
    from cbrules.codegen.launch import CompiledKernel
    from cbrules.codegen.nvrtc import compile_cuda
    from cbrules.ir.terms import const
    # a barrier that expects two arrivals and gets one: the wait times out after 1 ms and traps
    text = "\n".join([PRELUDE, hints.WAIT_MODE, 'extern "C" __global__ void hang() {',
                      "  __shared__ unsigned long long bar;",
                      "  if (threadIdx.x == 0) cb_mbar_init(cb_smem_addr(&bar), 2);",
                      "  __syncthreads();",
                      "  if (threadIdx.x == 0) cb_mbar_arrive(cb_smem_addr(&bar));",
                      "  cb_mbar_wait_mode(cb_smem_addr(&bar), 0, 64u, 1024u, 0u, 0u, 1000000ull, 77);", "}"])
    src = KernelSource("hang", text, (), (32, 1, 1), (const(1), const(1), const(1)), 0)
    ck = CompiledKernel(src, compile_cuda(text, "hang"))
    ck()
    print("returned")
''')


def test_a_wait_with_a_timeout_traps_with_its_message():
    r = subprocess.run([sys.executable, "-c", HANG], capture_output=True, text=True, timeout=120, cwd=ROOT)
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "returned" not in r.stdout, out  # the launch fails: it did not hang or pass
    assert "cbrules: mbarrier_wait #77 timed out after 1000000 ns" in out, out
