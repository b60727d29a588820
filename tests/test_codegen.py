"""CUDA text structure and NVRTC compiles of generated kernels (no GPU needed)."""
import re

import pytest

from cbrules import api
from cbrules.ir.builder import Kernel, threadIdx
from cbrules.kernels.exp1d import exp1d_tma
from cbrules.ir.terms import Term, name
from cbrules.codegen.cuda import emit
from cbrules.codegen.errors import CodegenError, CompileError
from cbrules.codegen.nvrtc import compile_cuda


def test_demo_kernel_text_structure():
    src = api.generate(exp1d_tma())
    t = src.text
    assert "#include" not in t  # self-contained
    assert re.search(r'extern "C" __global__ void __launch_bounds__\(256\) exp1d_tma\(', t)
    assert "const __grid_constant__ CUtensorMap x_tmap" in t
    assert "struct __align__(64) CUtensorMap { unsigned long long opaque[16]; };" in t
    body = t[t.index('extern "C"'):]
    # barrier protocol in order: init, sync, arm + TMA (elected), parity wait, compute, store, inval
    order = ["cb_mbar_init(", "__syncthreads();", "cb_mbar_arrive_expect_tx(", "cb_tma_load(", "cb_mbar_wait(",
             "expf(", "out[", "cb_mbar_inval("]
    pos = [body.index(s) for s in order]
    assert pos == sorted(pos)
    assert "cb_mbar_arrive_expect_tx(cb_smem_addr(&full[0]), 1024);" in body
    assert "cb_mbar_wait(cb_smem_addr(&full[0]), i % 2);" in body
    assert body.count("if (cb_elect_one())") == 3
    assert src.shared_bytes == 1024 + 8
    assert "mbarrier.try_wait.parity.shared::cta.b64" in t and "elect.sync" in t
    assert "cp.async.bulk.tensor.1d.shared::cluster.global.mbarrier::complete_tx::bytes" in t


def test_signed_builtins_in_index_math():
    t = api.generate(exp1d_tma()).text
    assert "(int)blockIdx.x * 8" in t and "(int)threadIdx.x" in t


def test_annotations_point_at_the_builder_call():
    t = api.generate(exp1d_tma(), annotate=True).text
    assert re.search(r"cb_tma_load\(.*// build @ .*exp1d\.py:\d+", t)
    assert "// build @" not in api.generate(exp1d_tma()).text


def test_demo_kernel_compiles_for_sm90a():
    ck = api.compile(exp1d_tma())
    assert ck.cubin.cubin[:4] == b"\x7fELF"
    assert ck.cubin.resources.registers > 0
    assert ck.cubin.resources.spill_stores == 0


def every_op_kernel():
    """A kernel touching every op codegen knows, to prove each one compiles."""
    k = Kernel("every_op", block=(64, 2))
    n = k.symbol("N")
    x, out = k.tensor("x", (n, 64)), k.tensor("out", (n, 64))
    xm = k.tensor_map(x, box=(2, 64))
    om = k.tensor_map(out, box=(2, 64))
    s = k.alloc("s", "shared", "float32", (2, 64))
    k.alloc("r", "register", "float32", (4,))
    b = k.alloc("b", "shared", "mbarrier", (2,))
    with k.elect_one():
        k.mbarrier_init(b, 0, 1)
        k.mbarrier_init(b, 1, 128)
    k.fence_mbarrier_init()
    k.syncthreads()
    acc = k.assign(0.0, dst="acc")
    with k.loop("i", 0, n, 2, kind="serial") as i:
        with k.elect_one():
            k.mbarrier_arrive_expect_tx(b, 0, xm.box_bytes)
            k.tma_load(xm, (i, 0), s, b, 0)
        k.mbarrier_wait(b, 0, i / 2 % 2)
        with k.loop("u", 2, kind="unroll") as u:
            v = k.load(s, u * 64 + threadIdx.x)
            w = k.fma(v, 2.0, 1.0)
            for op in ("exp", "log", "sqrt", "rsqrt", "neg", "abs"):
                w = getattr(k, op)(w)
            for op in ("add", "sub", "mul", "div", "max", "min"):
                w = getattr(k, op)(w, v)
            k.reduce(w, kind="serial", dst="acc")
        k.mbarrier_arrive(b, 1)
        k.mbarrier_wait(b, 1, i / 2 % 2)
        total = k.reduce(acc, kind="block", combine="max")
        k.store(s, threadIdx.x, total)
        k.fence_proxy_async()
        k.syncthreads()
        with k.elect_one():
            k.tma_store(om, (i, 0), s)
        k.bar_sync(1, 128)
    with k.loop("t", 64, kind="thread-x") as t:
        k.store(out, t, acc)
    with k.elect_one():
        k.mbarrier_inval(b, 0)
        k.mbarrier_inval(b, 1)
    return k


def test_every_op_compiles():
    k = every_op_kernel()
    k.graph.verify()
    ck = api.compile(k)
    t = ck.source.text
    for needle in ("expf(", "logf(", "sqrtf(", "rsqrtf(", "fabsf(", "fmaf(", "cb_block_reduce<float>",
                   "cb_tma_store(", "cb_bar_sync(1, 128)", "#pragma unroll", "float r[4];",
                   "threadIdx.y == 0", "cb_fence_proxy_async()", "cb_fence_mbarrier_init()"):
        assert needle in t, needle


def test_compile_error_shows_the_source_line():
    with pytest.raises(CompileError) as e:
        compile_cuda('extern "C" __global__ void broken(float* x) {\n  x[0] = undefined_name;\n}\n', "broken")
    assert "undefined_name" in str(e.value)
    assert "2" in str(e.value)


def _step(program, op):
    return next(s for s in program.walk() if s.op == op)


@pytest.mark.parametrize("op, key, value, message", [
    ("load", "dst", "v0; asm(\"trap;\")", "not a C identifier"),
    ("load", "src", "cb_smem", "used by the generated CUDA"),
    ("mbarrier_init", "count", "1); asm(\"trap;\"", "must be an int"),
    ("for", "var", "int", "keyword"),
    ("store", "index", Term("call", (name("i"),), "atomicAdd"), "not a device function"),
    ("store", "index", Term("const", (), 2 ** 70), "not a number in range"),
])
def test_codegen_refuses_what_verify_would_have(op, key, value, message):
    # the last gate: a hand-made linear program never reaches the text unchecked
    program = api.program(exp1d_tma())
    _step(program, op).attrs[key] = value
    with pytest.raises(CodegenError, match=message):
        emit(program)


def test_comment_text_cannot_leave_the_comment():
    program = api.program(exp1d_tma())
    _step(program, "syncthreads").attrs["part"] = "x\n#define expf(x) 0\r\\"
    body = emit(program, annotate=True).text.split('extern "C"')[1]
    assert not any(line.lstrip().startswith("#define") for line in body.splitlines())
    assert "// x\\x0a#define expf(x) 0\\x0d\\x5c" in body
    assert all(not line.endswith("\\") for line in body.splitlines())
