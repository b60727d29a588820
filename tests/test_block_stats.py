"""block_stats: a block's (mean, M2) from each thread's in ONE numerically stable reduction (pairwise merges of
equal counts), and persistent(stats="stable", direct=True) built on it. CPU only: the merge as the
interpreter models it against float64, the normalisation through the interpreter on rows whose mean is large
against their spread, the CUDA (compiled by NVRTC), and the named errors of hostile use."""
import dataclasses
import functools

import numpy as np
import pytest

from cbrules import api
from cbrules.check import Checker, trip_counts
from cbrules.errors import CbrulesError
from cbrules.ir.bind import NP_DTYPES
from cbrules.ir.builder import Kernel, threadIdx
from cbrules.ir.terms import as_term
from cbrules.ir.verify import GraphError
from cbrules.kernels import KERNELS, reductions
from cbrules.kernels.reductions import KernelParameterError
from cbrules.reference.hwsim import block_stats
from cbrules.reference.interp import run

SPEC = KERNELS["persistent"]


def _thread_pairs(x: np.ndarray, threads: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Each thread's (mean, M2) of K consecutive elements of the row, in float32 as a kernel takes them."""
    v = x.astype(np.float32).reshape(threads, -1)
    mean = v.sum(axis=1, dtype=np.float32) * np.float32(1.0 / v.shape[1])
    m2 = ((v - mean[:, None]) ** 2).sum(axis=1, dtype=np.float32)
    return mean, m2, v.shape[1]


@pytest.mark.parametrize("threads", [32, 128, 512, 1024])
@pytest.mark.parametrize("mu, sd", [(0.0, 1.0), (1e4, 1.0), (-3e4, 2.0), (4e3, 0.25)])
def test_the_merge_keeps_the_variance_where_one_pass_loses_it(threads, mu, sd):
    """hwsim.block_stats (the prelude's merge order) against float64: the mean to float32's rounding and the
    variance to 1e-4 at a mean 1e4 times the spread and more, where E[x^2] - mean^2 in float32 is useless; every
    thread gets the same pair."""
    x = mu + sd * np.random.default_rng(threads).standard_normal(16 * threads)
    x32 = x.astype(np.float32)
    mean, m2, k = _thread_pairs(x32, threads)
    got_mean, got_m2 = block_stats(mean, m2, k)
    assert got_mean.dtype == np.float32 and len(set(got_mean.tolist())) == 1 and len(set(got_m2.tolist())) == 1
    x64 = x32.astype(np.float64)
    assert abs(got_mean[0] - x64.mean()) <= 2e-7 * max(abs(x64.mean()), sd)
    assert abs(got_m2[0] / len(x64) / x64.var() - 1) < 1e-4
    if mu:  # the one-pass variance from the same float32 sums is off by more than the variance
        s1, s2 = x32.sum(dtype=np.float32), (x32 * x32).sum(dtype=np.float32)
        naive = s2 / np.float32(len(x32)) - (s1 / np.float32(len(x32))) ** 2
        assert abs(naive - x64.var()) > 0.5 * x64.var()


def _rows(dtype: str, shape: tuple, mu: float, seed: int) -> dict:
    """persistent's inputs shifted to mean ``mu``, then rounded to ``dtype`` (the reference takes the
    rounded values)."""
    args = SPEC.make_inputs(shape, np.random.default_rng(seed), "float32")
    return {k: (v + np.float32(mu) if k == "x" else v).astype(NP_DTYPES[dtype]) for k, v in args.items()}


# dtype, row, width, threads, box, mean: float32 far off centre; half types as far as their spacing allows
CASES = [("float32", 2048, 512, 128, 128, 1e4), ("bfloat16", 2048, 1024, 128, 256, 256.0),
         ("float16", 2048, 1024, 64, 256, 512.0)]


@pytest.mark.parametrize("direct", [False, True], ids=["tma", "direct"])
@pytest.mark.parametrize("dtype, row, width, threads, box, mu", CASES)
def test_stable_normalize_in_the_interpreter(dtype, row, width, threads, box, mu, direct):
    """persistent(stats="stable") through the interpreter matches the float64 normalisation of rows whose mean
    is large against their spread (the outputs NaN-poisoned first)."""
    shape = (3, row)
    k = reductions.persistent(2, row=row, width=width, threads=threads, box=box, dtype=dtype, stats="stable",
                              direct=direct)
    args = _rows(dtype, shape, mu, row + threads)
    args["out"][...] = np.nan
    got = run(api.lower(k), args, {"M": shape[0]})["out"].astype(np.float64)
    rtol, atol = SPEC.tolerances(shape, dtype)
    tol = 1e-3 if dtype == "float32" else 0  # float32 x - mean at 1e4 keeps ~1e-3 of a unit spread
    np.testing.assert_allclose(got, SPEC.expected(args)["out"], rtol, atol + tol)


def test_a_walk_merges_over_the_consumers_through_a_named_barrier():
    """Warp-specialized and walking: the statistics merge over the consumers only (named barrier 2 over
    threads 0..127, keeping the sync that guards the scratch for the next row), and the interpreter, which
    runs the producer warp group beside them, normalizes every row."""
    k = reductions.persistent(2, row=2048, width=1024, threads=128, box=256, dtype="bfloat16", one_box=True,
                              walk=2, warp_specialize=True, stats="stable")
    text = api.generate(k).text
    body = text[text.index('extern "C"'):]
    assert body.count("cb_block_stats_named<16, false>(") == 1 and ", 2, 128);" in body
    assert "cb_block_reduce" not in body
    args = _rows("bfloat16", (5, 2048), 64.0, 5)
    args["out"][...] = np.nan
    with np.errstate(divide="ignore"):
        got = run(api.lower(k), args, {"M": 5})["out"].astype(np.float64)
    np.testing.assert_allclose(got, SPEC.expected(args)["out"], *SPEC.tolerances((5, 2048), "bfloat16"))


def test_the_direct_stable_kernel_is_one_sync_and_vector_loads():
    """ops.py's 16384 half-precision kernel: 16-byte loads straight from x (no TMA, barrier or tensor map),
    one block_stats (its closing sync left out: nothing follows it) and no other reduction or sync."""
    k = reductions.persistent(4, row=16384, width=4096, threads=512, box=256, dtype="bfloat16", stats="stable",
                              direct=True)
    src = api.generate(k)
    body = src.text[src.text.index('extern "C"'):]
    assert body.count("cb_vcopy<16>(&cb_vec_") == 1 and "&x[(int)blockIdx.x * 16384 + j * 4096" in body
    assert body.count("cb_block_stats<32, true>(") == 1
    for gone in ("cb_mbar", "cb_tma_load", "CUtensorMap", "__syncthreads", "cb_block_reduce"):
        assert gone not in body, gone
    assert [p.name for p in src.params] == ["M", "x", "out"] and src.shared_bytes == 256
    assert "cb_block_stats_named" in src.text  # the prelude's helpers, appended only where used
    two_pass = api.generate(reductions.persistent(4, row=16384, width=4096, threads=512, box=256, dtype="bfloat16"))
    assert "cb_block_stats" not in two_pass.text


@pytest.mark.parametrize("dtype", [pytest.param(d, marks=pytest.mark.xdist_group(f"stats-nvrtc-{d}"))
                                   for d in ("float32", "bfloat16", "float16")])
def test_stable_variants_compile(dtype):
    """NVRTC compiles the stable statistics in every form: through TMA stages, direct, walking
    warp-specialized (the named form); no spills."""
    row = 16384 if dtype != "float32" else 8192
    forms = [dict(width=4096, threads=512, box=256), dict(width=4096, threads=512, box=256, direct=True),
             dict(width=row // 2, threads=512, box=256, one_box=True, walk=132, warp_specialize=True)]
    for form in forms:
        ck = api.compile(reductions.persistent(2, row=row, dtype=dtype, stats="stable", **form))
        assert ck.cubin.resources.spill_stores == 0, form


def _stable_spec(**kw):
    return dataclasses.replace(SPEC, name="persistent_stable",
                               factory=functools.partial(reductions.persistent, stats="stable", **kw))


@pytest.mark.parametrize("ws", [False, True])
def test_stable_statistics_pass_the_checker(ws):
    """``cbrules check``'s trip counts with the stable statistics (S = 2), with and without warp
    specialization: the merge's syncs and the pipeline's barriers agree."""
    checker = Checker(dtype="bfloat16")
    results = [checker.check(_stable_spec(), t, 2, warp_specialize=ws) for t in trip_counts(2)]
    bad = [f"{r.trips}: {r.status} {r.detail}" for r in results if not r.ok]
    assert not bad, "\n".join(bad)


def _stats_kernel(block, **kw) -> Kernel:
    k = Kernel("stats", block=block)
    out = k.tensor("out", (64,), "float32")
    mean, m2 = k.block_stats(threadIdx.x, 1.0, 4, **kw)
    k.store(out, threadIdx.x, k.add(mean, m2))
    return k


def test_hostile_block_stats_are_named_errors():
    """A count that is not a whole number, one register for both results, a block that is no power-of-two
    count of warps, and persistent's parameters that cannot work: named errors, nothing lowered."""
    for bad in (0, -1, 2.5, True, "4"):
        with pytest.raises(CbrulesError, match="n=.*whole number"):
            Kernel("s", block=64).block_stats(1.0, 1.0, bad)
    with pytest.raises(CbrulesError, match="dst and dst_m2 are both 'r'"):
        Kernel("s", block=64).block_stats(1.0, 1.0, 4, dst="r", dst_m2="r")
    with pytest.raises(GraphError, match="block-stats-warps.*96 threads"):
        api.lower(_stats_kernel(96))
    api.lower(_stats_kernel(64))
    with pytest.raises(GraphError, match="block-stats-warps.*one-dimensional block, got 32x2x1"):
        api.lower(_stats_kernel((32, 2)))
    with pytest.raises(KernelParameterError, match="stats='mean'"):
        reductions.persistent(stats="mean")
    with pytest.raises(KernelParameterError, match="threads=384 must be a power-of-two"):
        reductions.persistent(row=3072, width=768, threads=384, stats="stable")
    with pytest.raises(KernelParameterError, match="direct=True"):
        reductions.persistent(direct=True, warp_specialize=True)
    for bad in ("yes", 1, None):
        with pytest.raises(KernelParameterError, match=r"direct=.*give True"):
            reductions.persistent(direct=bad)


def test_block_stats_every_thread_gets_the_merge():
    """A raw block_stats in the interpreter: thread t's pair (t, 1) of 4 elements gives the mean of
    0..63 and M2 = 64 + 4 * sum (t - mean)^2 in every thread."""
    out = run(api.lower(_stats_kernel(64)), {"out": np.full(64, np.nan, np.float32)})["out"]
    t = np.arange(64.0)
    assert np.allclose(out, t.mean() + 64 + 4 * ((t - t.mean()) ** 2).sum(), rtol=1e-6)


def test_the_closing_sync_stays_where_a_reduction_follows():
    """The merge's scratch is the block reductions': its closing sync is left out only where no reduction
    can run after it (the last scratch user, outside every loop)."""
    def text(then_reduce: bool, in_loop: bool) -> str:
        k = Kernel("stats", block=64)
        out = k.tensor("out", (64,), "float32")
        if in_loop:
            with k.loop("i", 2):
                mean, m2 = k.block_stats(threadIdx.x, 1.0, 4, dst="mean", dst_m2="m2")
        else:
            mean, m2 = k.block_stats(threadIdx.x, 1.0, 4)
        total = k.reduce(m2) if then_reduce else m2
        k.store(out, threadIdx.x, k.add(mean, total))
        return api.generate(k).text
    assert "cb_block_stats<4, true>(" in text(False, False)
    assert "cb_block_stats<4, false>(" in text(True, False) and "cb_block_stats<4, false>(" in text(False, True)


@pytest.mark.parametrize("op, args", [("fma", 2), ("select", 4), ("exp", 2), ("add", 1), ("block_stats", 1),
                                      ("block_stats", 3), ("block_stats", None)])
def test_args_of_the_wrong_count_are_named_errors(op, args):
    """A node whose args codegen prints by position (fmaf(a, b, c), the merge's (mean, M2)) holds exactly
    that many terms: a graph from a rule, a trace file or the builder's internals with another count is
    refused by name, not printed as CUDA that does not compile (or a Python traceback)."""
    k = Kernel("s", block=64)
    attrs = dict(dst="a", dtype="float32", args=as_term(1.0) if args is None else tuple(as_term(1.0) for _ in range(args)))
    if op == "block_stats":
        attrs.update(dst_m2="b", n=4)
    k._node(op, **attrs)
    with pytest.raises(GraphError, match=rf"\[attributes\] .*{op}\(dst=a\).*: args (holds {args} value|is Term)"):
        api.generate(k)


def test_one_register_for_both_results_of_block_stats_is_refused():
    """The builder refuses dst == dst_m2; a graph made otherwise (a rule's template) is refused by verify:
    both results in one variable would silently lose one."""
    k = Kernel("s", block=64)
    k._node("block_stats", dst="a", dst_m2="a", args=(as_term(1.0), as_term(0.0)), n=4, dtype="float32")
    with pytest.raises(GraphError, match="dst and dst_m2 are both 'a'"):
        api.generate(k)


def test_a_rule_that_builds_args_of_the_wrong_count_is_named_at_its_text(tmp_path):
    """A user rule inserting an fma with two args: the error names the rule file, line and column."""
    from tests.rulekit import write_rules
    from cbrules.rewrite import engine
    from cbrules.rewrite.rulefile import load
    path = write_rules(tmp_path / "r", """
        (phases p)
        (graph-rule two-args
          :phase p
          :match ((kernel ?K :tag (absent)))
          :rewrite ((set ?K :tag "done")
                    (insert-at-entry ?K (fma :dst "r9" :args (tuple 1.0 2.0) :dtype "float32"))))
        """)
    with pytest.raises(CbrulesError, match=rf"{path.name}:\d+:\d+.*fma :args: holds 2 value\(s\); fma takes exactly 3"):
        engine.lower(Kernel("s", block=64).graph, load([tmp_path / "r"]), simplify=False)


def test_a_count_beyond_float32s_exact_integers_is_refused():
    """The merge weighs with n as a float32: counts above 2**24 are refused by name (2**31 reached
    NVRTC as a template argument it could not take)."""
    for n, ok in ((1 << 24, True), ((1 << 24) + 1, False), (1 << 31, False)):
        k = Kernel("s", block=64)
        k.block_stats(1.0, 0.0, n)
        if ok:
            api.generate(k)
        else:
            with pytest.raises(GraphError, match=r"\[int-valued\].*n must be .*<= 16777216"):
                api.generate(k)
