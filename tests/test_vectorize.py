"""Vector accesses (rules/vectorize.rules, the copy op): which accesses the rules group, the
interpreter running the grouped kernels against numpy, the guards that keep the others per element
(a mutated rule shows the interpreter catches a misaligned vector), and the launcher's alignment check."""
import ml_dtypes
import numpy as np
import pytest

from cbrules import api
from cbrules.ir.builder import Kernel, blockIdx, circular_buffer, threadIdx
from cbrules.ir.terms import coefficient, divisor, evaluate, parse
from cbrules.kernels import KERNELS, reductions, tiled2d
from cbrules.reference import interp
from cbrules.reference.interp_memory import MisalignedVector

NP = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


# ------------------------------------------------------------------------------ linear facts of terms

@pytest.mark.parametrize("text, c", [("v", 1), ("t * 8 + v", 1), ("(t * 8 + v) + s * 1024", 1), ("v * 2 + 3", 2),
                                     ("8 - v", -1), ("-(v)", -1), ("t * 8", 0), ("v * N", None), ("v / 2", None),
                                     ("v % 8", None), ("min(v, 3)", None), ("(v + 1) * 4 - v * 4", 0)])
def test_coefficient(text, c):
    assert coefficient(parse(text), "v") == c


@pytest.mark.parametrize("text, d", [("8", 8), ("0", 0), ("t * 8", 8), ("t * 8 + 16", 8), ("t * 8 + 4", 4),
                                     ("(t + 3) * 8", 8), ("j % 3 * 1024", 1024), ("(t * 8) % 24", 8),
                                     ("t * 8 / 2", 1), ("N * 8 + t", 1), ("-(t * 4)", 4), ("t * 2 * 4", 8)])
def test_divisor(text, d):
    assert divisor(parse(text)) == d


def test_divisor_holds_for_every_value():
    """d divides the term for every value of its names (C division and remainder)."""
    rng = np.random.default_rng(0)
    for text in ("t * 8 + 16", "j % 3 * 1024 + t * 4", "(t * 8) % 24", "(t - 5) * 6 - 12"):
        t, d = parse(text), divisor(parse(text))
        for _ in range(50):
            env = {"t": int(rng.integers(-100, 100)), "j": int(rng.integers(-100, 100))}
            assert evaluate(t, env) % d == 0, (text, env)


# ------------------------------------------------------------------------------ the built-in kernels

def _run(kernel, args, outputs):
    got = interp.run(api.lower(kernel), args)
    return {o: got[o].astype(np.float64) for o in outputs}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("row, width, threads, vector", [(2048, 1024, 128, 16), (4096, 1024, 256, 8),
                                                         (1024, 512, 256, 4)])
def test_persistent_reads_and_writes_vectors(dtype, row, width, threads, vector):
    kernel = reductions.persistent(2, row=row, width=width, threads=threads, dtype=dtype)
    src = api.generate(kernel).text
    assert src.count(f"cb_vcopy<{vector}>(&cb_vec_") == 2  # the main loop's and the epilogue's tile reads
    assert src.count(f"cb_vcopy<{vector}>(&out[") == 1  # the normalised row leaves in vectors
    sp = KERNELS["persistent"]
    args = sp.make_inputs((5, row), np.random.default_rng(row), dtype)
    args["out"] = np.full((5, row), np.nan, NP[dtype])
    got = _run(kernel, args, ["out"])["out"]
    np.testing.assert_allclose(got, sp.expected(args)["out"], *sp.tolerances((5, row), dtype))


@pytest.mark.parametrize("dtype, width, vector", [("bfloat16", 1024, 8), ("float16", 2048, 16),
                                                  ("bfloat16", 512, 4)])
def test_inner_reduction_reads_vectors(dtype, width, vector):
    kernel = reductions.inner_reduction(3, width=width, dtype=dtype)
    assert api.generate(kernel).text.count(f"cb_vcopy<{vector}>(&cb_vec_") == 2 * (width // 256 * 2 // vector)
    x = np.random.default_rng(width).standard_normal((3, 5000)).astype(NP[dtype])
    got = _run(kernel, {"x": x, "out": np.full(3, np.nan, NP[dtype])}, ["out"])["out"]
    np.testing.assert_allclose(got, x.astype(np.float64).sum(1), rtol=1e-2, atol=0.5)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("op, params, reads, writes", [
    ("exp", dict(rows=1, width=1024, per_block=4), "cb_vcopy<8>(&cb_vec_", "cb_vcopy<8>(&out["),
    ("exp", dict(rows=4, width=256, per_block=4, tma_store=True), "cb_vcopy<8>(&cb_vec_", "cb_vcopy<8>(&cb_stage_"),
    ("add", dict(rows=1, width=512, per_block=4), "cb_vcopy<4>(&cb_vec_", "cb_vcopy<4>(&out["),
    ("add", dict(rows=8, width=256, tma_store=True), "cb_vcopy<16>(&cb_vec_", "cb_vcopy<16>(&cb_stage_"),
])
def test_pointwise_runs_of_a_thread(dtype, op, params, reads, writes):
    """Reads of the tiles come in vectors, and so do the stores, to the TMA staging slot or to global
    memory (at row * (N / vec * vec) + column: the kernel shows the rules the row pitch is a multiple
    of the run). 37 x 1000: the last tile of a row and the last row strip are partial."""
    kernel = (tiled2d.multi_dim if op == "exp" else tiled2d.pointwise)(3, dtype=dtype, **params)
    src = api.generate(kernel).text
    assert reads in src and writes in src
    rng = np.random.default_rng(len(src))
    x, y = (rng.standard_normal((37, 1000)).astype(NP[dtype]) for _ in range(2))
    args = {"x": x, "out": np.full_like(x, np.nan)} | ({"y": y} if op == "add" else {})
    got = _run(kernel, args, ["out"])["out"]
    xf, yf = x.astype(np.float32), y.astype(np.float32)
    want = (np.exp(xf) if op == "exp" else xf + yf).astype(NP[dtype]).astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=2.0 ** -7)


def test_swizzled_reads_keep_element_accesses():
    assert "cb_vcopy" not in api.generate(tiled2d.multi_dim(3, dtype="bfloat16", swizzle="128B")).text


def test_float32_kernels_keep_element_accesses():
    for kernel in (reductions.persistent(2, row=2048, width=1024, threads=128),
                   reductions.inner_reduction(3, width=1024), tiled2d.pointwise(3, rows=8, tma_store=True)):
        assert "cb_vcopy" not in api.generate(kernel).text


# ------------------------------------------------------------------------------ what stays per element

def _tile_kernel():
    """A kernel over x, out [M, 2048] bfloat16 with a [1, 1024] shared tile and x's map (``k.tmap``)."""
    k = Kernel("vk", block=128)
    m = k.symbol("M")
    x, out = k.tensor("x", (m, 2048), "bfloat16"), k.tensor("out", (m, 2048), "bfloat16")
    tile = k.alloc("tile", "shared", "bfloat16", (1, 1024))
    k.grid(m)
    k.tmap = k.tensor_map(x, box=(1, 256))
    return k, tile, out


def _vector_kernel(read_at, write_at, guarded=False):
    """out[row, col] = exp(x[row, col]) with a thread's 8 elements in a vectorize loop; ``read_at`` and
    ``write_at`` give the index of element v from the thread's first column ``c``."""
    k, tile, out = _tile_kernel()
    with k.loop("j", 2, circular_buffer=circular_buffer(2)) as j:
        k.tma_load(k.tmap, (blockIdx.x, j * 1024), tile, tile=(1, 1024))
        with k.loop("v", 8, kind="vectorize") as v:
            c = threadIdx.x * 8
            if guarded:
                with k.if_(threadIdx.x.lt(128)):
                    y = k.exp(k.load(tile, read_at(c, v)))
            else:
                y = k.exp(k.load(tile, read_at(c, v)))
            k.store(out, blockIdx.x * 2048 + j * 1024 + write_at(c, v), y)
    return k


def test_contiguous_aligned_accesses_become_vectors():
    src = api.generate(_vector_kernel(lambda c, v: c + v, lambda c, v: c + v)).text
    assert "cb_vcopy<16>(&cb_vec_" in src and "cb_vcopy<16>(&out[" in src


@pytest.mark.parametrize("read_at, why", [
    (lambda c, v: c // 2 + v + 1, "base not a multiple of 8"),  # 4t+1: stays inside the tile
    (lambda c, v: c // 2 + v * 2, "not contiguous"),
    (lambda c, v: (c + v) % 1024, "not linear in v"),
])
def test_other_reads_stay_per_element(read_at, why):
    src = api.generate(_vector_kernel(read_at, lambda c, v: c + v)).text
    assert "cb_vcopy<16>(&cb_vec_" not in src and "cb_vcopy<16>(&out[" in src, why


def test_guarded_read_stays_per_element():
    src = api.generate(_vector_kernel(lambda c, v: c + v, lambda c, v: c + v, guarded=True)).text
    assert "cb_vcopy<16>(&cb_vec_" not in src and "cb_vcopy<16>(&out[" in src


def test_base_the_loop_computes_stays_per_element():
    """The copy runs outside the loop: a base using a register the loop writes cannot move there."""
    from cbrules.ir.terms import name
    k, tile, out = _tile_kernel()
    with k.loop("j", 2, circular_buffer=circular_buffer(2)) as j:
        k.tma_load(k.tmap, (blockIdx.x, j * 1024), tile, tile=(1, 1024))
        with k.loop("v", 8, kind="vectorize") as v:
            k.assign(threadIdx.x, dst="first", dtype="int32")
            y = k.exp(k.load(tile, name("first") * 8 + v))
            k.store(out, blockIdx.x * 2048 + j * 1024 + name("first") * 8 + v, y)
    src = api.generate(k).text
    assert "cb_vcopy" not in src and "tile[first * 8 + v" in src


def test_write_with_a_symbolic_base_stays_per_element():
    """out[row * N + ...]: N is known only at launch, so the base is not provably a multiple of 8."""
    k = Kernel("vk", block=128)
    m, n = k.symbol("M"), k.symbol("N")
    out = k.tensor("out", (m, n), "bfloat16")
    k.grid(m)
    with k.loop("v", 8, kind="vectorize") as v:
        k.store(out, blockIdx.x * n + threadIdx.x * 8 + v, 1.0)
    assert "cb_vcopy" not in api.generate(k).text


MUTANT = """
(disable vectorize-reads)
(phase mutant :after vectorize)
(graph-rule vectorize-reads-unguarded
  :doc "mutant: vectorize-reads without the multiple-of guard"
  :phase mutant
  :match ((kernel ?K) (load ?r :src ?buf :index ?ix :tag (not "cb-vector"))
          (alloc ?a :buf ?buf :space "shared" :dtype ?dt)
          (nearest ?V (for) :around ?r) (for ?V :kind "vectorize" :var ?v :stop ?n) (child ?r ?V))
  :where ((= (coefficient ?ix ?v) 1))
  :rewrite ((let ?vec (str "cb_vec_" (id ?r)))
            (insert-at-entry ?K (alloc :buf ?vec :space "register" :dtype ?dt :shape (tuple (int ?n)) :align 16))
            (insert-before ?V (copy :dst ?vec :dst_index 0 :src ?buf :src_index (substitute ?ix ?v 0)
                                    :count (int ?n) :tag "cb-vector"))
            (set ?r :src ?vec :index (var ?v) :tag "cb-vector")))
"""


def test_interpreter_catches_a_misaligned_vector(tmp_path):
    """A rule that drops the alignment guard makes a vector at an odd element: the CPU run refuses it."""
    (tmp_path / "mutant.rules").write_text(MUTANT)
    kernel = _vector_kernel(lambda c, v: c // 2 + v + 1, lambda c, v: c + v)
    kg = api.lower(kernel, rules=[str(tmp_path)])
    x = np.zeros((2, 2048), ml_dtypes.bfloat16)
    with pytest.raises(MisalignedVector, match="a vector access starts at a multiple of its 8 elements"):
        interp.run(kg, {"x": x, "out": np.zeros_like(x)})


# ------------------------------------------------------------------------------ the launcher

def test_launcher_refuses_a_misaligned_vector_tensor(monkeypatch):
    from cbrules.codegen import runtime
    from cbrules.codegen.launch import LaunchError

    def reached(*_a, **_k):
        raise AssertionError("a launch check reached the CUDA driver")
    monkeypatch.setattr(runtime, "current_context", reached)

    class FakeCai:
        def __init__(self, shape, ptr):
            self.__cuda_array_interface__ = {"shape": shape, "typestr": "<f2", "strides": None,
                                             "data": (ptr, False), "version": 3}

    ck = api.compile(reductions.persistent(2, row=2048, width=1024, threads=128, dtype="float16"))
    assert dict(ck.source.aligned) == {"out": 16}
    ck.check(x=FakeCai((4, 2048), 0x7f00_0000_0000), out=FakeCai((4, 2048), 0x7f00_0010_0000))
    with pytest.raises(LaunchError, match="tensor 'out' .* is not 16-byte aligned, but the kernel accesses it 16"):
        ck.check(x=FakeCai((4, 2048), 0x7f00_0000_0000), out=FakeCai((4, 2048), 0x7f00_0010_0008))


# the half-precision tuned variants (cbrules/kernels/tuned.py: twice the float32 tile's elements), on
# shapes whose edges cut through the tiles
BENCH_CASES = [("exp", (37, 5000), False), ("exp", (37, 5000), True), ("add", (37, 5000), False),
               ("add", (37, 5000), True), ("inner_sum", (5, 12000), False), ("outer_sum", (600, 264), False),
               ("normalize", (3, 16384), False)]


@pytest.mark.parametrize("op, shape, tma_store", BENCH_CASES, ids=str)
def test_half_benchmark_variants(op, shape, tma_store):
    from cbrules.kernels.tuned import build_generated, tiles
    kernel = build_generated(op, shape, 3, "bfloat16", tma_store)
    assert "cb_vcopy<" in api.generate(kernel).text or op == "outer_sum"
    sp = KERNELS[tiles(op, shape)[0]]
    args = sp.make_inputs(shape, np.random.default_rng(shape[1]), "bfloat16")
    for o in sp.outputs:
        args[o] = np.full_like(args[o], np.nan)
    got = _run(kernel, args, sp.outputs)
    for o in sp.outputs:
        np.testing.assert_allclose(got[o], sp.expected(args)[o], *sp.tolerances(shape, "bfloat16"))


def test_codegen_refuses_a_copy_into_an_input_tensor(tmp_path):
    """A rule that sends a vector to a tensor the kernel only reads is named (its parameter is const)."""
    from cbrules.codegen.errors import CodegenError
    (tmp_path / "wrong.rules").write_text("""
(disable vectorize-writes)
(phase mutant :after vectorize)
(graph-rule vectorize-writes-to-the-input
  :doc "mutant: the vector of a store leaves for the input tensor"
  :phase mutant
  :match ((kernel ?K) (store ?w :dst "out" :index ?ix) (nearest ?V (for) :around ?w)
          (for ?V :kind "vectorize" :var ?v :stop ?n) (child ?w ?V))
  :rewrite ((let ?vec (str "cb_vec_" (id ?w)))
            (insert-at-entry ?K (alloc :buf ?vec :space "register" :dtype "bfloat16" :shape (tuple 8) :align 16))
            (set ?w :dst ?vec :index (var ?v) :tag "cb-vector")
            (insert-after ?V (copy :dst "x" :dst_index (substitute ?ix ?v 0) :src ?vec :src_index 0 :count 8))))
""")
    with pytest.raises(CodegenError, match="copy into tensor 'x', which the kernel does not write"):
        api.generate(_vector_kernel(lambda c, v: c + v, lambda c, v: c + v), rules=[str(tmp_path)])
