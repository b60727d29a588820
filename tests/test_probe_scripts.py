"""The hand-edited CUDA variants of the GPU probes still apply to the generated code and compile (NVRTC,
no GPU): each edit insists on finding the text it replaces, so a change to the rules or to a kernel's
defaults that moves that text fails here rather than on the H200."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*argv: str) -> str:
    r = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def _edit_base(which: str) -> dict:
    """The parameters the resident probe's hand edits of set ``which`` apply to: ops.py's choice as the TMA,
    two-pass kernel (its 16384-column half-precision choice is now the direct, stable one)."""
    from benchmarks import resident_probe
    (_, params, _), *_ = resident_probe.variants((16384, 16384), which)
    assert params.get("direct") and params.get("stats") == "stable", params
    return resident_probe.edit_base(params)


def test_profile_tc_variants_compile(tmp_path):
    out = _run("benchmarks/profile_tc.py", "--cpu", "--out", str(tmp_path))
    assert "store-swizzle:" in out and "no-epilogue" in out and "spills 0/0" in out


@pytest.mark.parametrize("second", [False, True], ids=["first-set", "second-set"])
def test_probe_memcheck_variants_compile(second):
    out = _run("benchmarks/probe_memcheck.py", "--compile-only", *(["--second"] if second else []))
    assert "fence-before-issue:" in out and "registers=" in out


def test_pingpong_probe_variants_compile(tmp_path):
    out = _run("benchmarks/pingpong_probe.py", "--cpu", "--out", str(tmp_path))
    assert "pingpong:" in out and "coop-pers-wgstore:" in out and "spills 0/0" in out
    assert "registers, spills" in _run("benchmarks/pingpong_probe.py", "--cpu", "--cluster", "--out", str(tmp_path))


def test_pingpong_probe_128_set_compiles_unserialized(tmp_path):
    """The 128x128 ping-pong (4 and 5 stages) and the fixed 64x256 one compile without spills and
    without ptxas serializing their wgmma (C7514); the 64x256 one as run in run1-run3 still does."""
    out = _run("benchmarks/pingpong_probe.py", "--cpu", "--pp128", "--out", str(tmp_path))
    lines = dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)
    for name in ("coop128-pers", "one128-pers", "pingpong128", "pingpong128-s5", "pingpong"):
        assert "spills 0/0" in lines[name] and "C7514" not in lines[name], (name, lines[name])
    assert "C7514" in lines["pingpong-c7514"]
    assert "pingpong128.cu" in {f.name for f in tmp_path.iterdir()}


def test_resident_probe_sync_edits_compile():
    """The hand edits dropping block syncs from the 16384-column normalize (each edit found once)."""
    out = _run("benchmarks/resident_probe.py", "--set", "syncs", "--compile-only")
    assert out.count("16384x16384 ") == 5 and "none of the three: regs=" in out and "blocks/SM=3" in out


def test_resident_probe_path_edits_compile():
    """The hand edits bringing the row in without the TMA (each edit found as often as expected)."""
    out = _run("benchmarks/resident_probe.py", "--set", "path", "--compile-only")
    assert out.count("16384x16384 ") == 6 and "LDG.128+STS+LDS, no loop syncs: regs=" in out
    assert out.count("blocks/SM=3") == 5  # the same occupancy as the TMA kernel they edit (ops.py's before)


def test_resident_probe_path_edits_drop_the_tma():
    """``direct`` reads every vector from global memory and nothing through the TMA or the barriers;
    ``shared`` still reads the slots, after each thread copied its vectors there."""
    from cbrules import api
    from cbrules.kernels import reductions
    from benchmarks import resident_probe
    params = _edit_base("path")
    text = api.generate(reductions.persistent(**params)).text
    body = text[text.index('extern "C"'):]
    assert "&x_tmap" in body and body.count("cb_mbar_wait(") == 2
    for how, global_reads, slot_reads in (("direct", 4, 0), ("shared", 2, 4)):
        edited = resident_probe._edit(text, (how,), params)
        body = edited[edited.index('extern "C"'):]
        assert "&x_tmap" not in body and "cb_mbar_wait(" not in body and "cb_mbar_arrive_expect_tx(" not in body
        assert body.count("&x[(int)blockIdx.x * 16384 + ") == global_reads
        assert body.count("], &tile[") == slot_reads


def test_resident_probe_reduce_edits_compile():
    """The hand edits of the statistics apply (at 256 and 512 threads) and compile."""
    out = _run("benchmarks/resident_probe.py", "--set", "reduce", "--compile-only")
    assert out.count("16384x16384 ") == 8 and "threads=512 S=4 one reduction + bf16 row: regs=" in out


def test_resident_probe_one_reduction_replaces_both():
    """"one reduction" leaves one block reduction (of both sums, taken as the row arrives) and no variance
    pass; "bf16 row" holds the row as bfloat16 and stores the vectors' elements unconverted."""
    from cbrules import api
    from cbrules.kernels import reductions
    from benchmarks import resident_probe
    params = _edit_base("reduce")
    text = api.generate(reductions.persistent(**params)).text
    body = text[text.index('extern "C"'):]
    assert body.count("cb_block_reduce<float>(") == 2 and "float vals[64];" in body
    one = resident_probe._edit(text, ("one reduction",), params)
    body = one[one.index('extern "C"'):]
    assert "cb_block_reduce<float>(" not in body and body.count("cb_block_sum2(s1, s2, ") == 1
    assert body.count("s2 = CbSum()(s2, v") == 4 and "vals[q]" not in body
    row = resident_probe._edit(text, ("bf16 row",), params)
    body = row[row.index('extern "C"'):]
    assert "cb_bf16 vals[64];" in body and body.count("] = cb_vec_") == 4


def test_probe_elements_reads_booleans_and_counts():
    from benchmarks.probe_elements import _value
    assert _value("true") is True and _value("false") is False and _value("132") == 132
    with pytest.raises(ValueError):
        _value("yes")
    assert _value("stable", word=True) == "stable"  # a parameter whose default is text (stats=)


def test_scaling_probe_variants_compile():
    """Both sets of hand edits of the scaling probe apply and compile, at the occupancy each names."""
    out = _run("benchmarks/scaling_probe.py", "--compile-only", "--wide-rows", "")
    assert out.count("16384 columns ") == 7 and "no set-up, no tensor map: regs=" in out
    assert out.count("blocks/SM=3") == 5 and "direct, 512 threads: regs=" in out
    assert "ours (ops.py S=4): regs=57 spills=0 smem=256 blocks/SM=2" in out  # direct, stats="stable"
    out = _run("benchmarks/scaling_probe.py", "--compile-only", "--set", "row", "--wide-rows", "")
    lines = dict(line.split(": ", 1) for line in out.splitlines())
    assert len(lines) == 9 and all("blocks/SM=2" in v for k, v in lines.items() if "two blocks" in k or "512" in k)



def test_scaling_probe_stats_set_compiles():
    """The stable-statistics set applies and compiles: seven edits beside ours, the 512-thread ones two
    blocks an SM, none spilling."""
    out = _run("benchmarks/scaling_probe.py", "--compile-only", "--set", "stats", "--wide-rows", "")
    lines = dict(line.split(": ", 1) for line in out.splitlines())
    assert len(lines) == 10 and all("spills=0" in v for v in lines.values())
    assert all("blocks/SM=2" in v for k, v in lines.items() if "512" in k)


def test_resident_probe_stable_reduction_is_one_block_reduction():
    """The stable edit leaves one block reduction (cb_block_chan of the thread's own mean and M2, with the
    compile-time count and warps) and no other; without the set-up and the main sync, a direct kernel keeps
    the reduction's one block sync and no barrier."""
    from cbrules import api
    from cbrules.kernels import reductions
    from benchmarks import resident_probe
    params = dict(row=16384, width=4096, threads=512, box=256, dtype="bfloat16", stages=4)
    text = api.generate(reductions.persistent(**params)).text
    edited = resident_probe._edit(text, ("direct", "no set-up", "main sync", "stable reduction"), params)
    body = edited[edited.index('extern "C"'):]
    assert "cb_block_reduce" not in body and body.count("cb_block_chan<32, 16>(v2, s2, ") == 1
    assert "__syncthreads" not in body and "cb_mbar_" not in body
    assert "v2 = (s1) * (1.0f / 32);" in body and "v7 = (s2) / (16384.0f);" in body
    with pytest.raises(ValueError, match="power-of-two"):
        resident_probe._edit(text, ("stable reduction",), dict(params, threads=384))


@pytest.mark.parametrize("threads", [256, 512])
def test_stable_merge_survives_a_large_mean(threads):
    """The merge as the kernel computes it (float32, lane by lane): on rows of mean 1e4 and spread 1, Chan's
    merge of (mean, M2) keeps the variance to 1e-4 of float64's; the one-pass E[x^2] - mean^2 loses it
    entirely (there it is off by more than the variance itself). On a centred row both agree."""
    import numpy as np
    from benchmarks.resident_probe import statistics_as_built
    rng = np.random.default_rng(threads)
    for mu, sd in ((1e4, 1.0), (-3e4, 2.0), (0.0, 1.0)):
        row = (mu + sd * rng.standard_normal(16384)).astype(np.float32)
        want_mean, want_var = row.astype(np.float64).mean(), row.astype(np.float64).var()
        mean, var = statistics_as_built(row, threads, "stable reduction")
        assert abs(mean - want_mean) <= 1e-6 * max(abs(want_mean), 1) and abs(var / want_var - 1) < 1e-4
        _, naive = statistics_as_built(row, threads, "one reduction")
        if mu:
            assert abs(naive - want_var) > want_var
        else:
            assert abs(naive / want_var - 1) < 1e-4


def _element_map(text: str, source: str) -> dict:
    """(thread, slot of vals) -> element of the row, for the loads (``source`` "x") or the stores ("out")
    of a direct normalize's CUDA, its index expressions evaluated as Python (threads 0, 1, 37 and 255)."""
    import re
    found = {}
    body = text[text.index("// main"):]
    if source == "x":  # a load, then the vals slot its elements go to; the main loop has j = 0
        pairs = re.findall(r"&x\[\(int\)blockIdx\.x \* 16384 \+ (.*?)\]\);\n.*?\n.*?\n.*?\n\s+vals\[(.*?)\] =", body)
        ranges = [(0,)] * 2 + [(1, 2, 3)] * 2
        steps = [(index, slot, {"j": j}) for (index, slot), js in zip(pairs, ranges) for j in js]
    else:  # the store of vals[q2 * 8 + u]
        (index,) = re.findall(r"&out\[\(int\)blockIdx\.x \* 16384 \+ (.*?)\], ", body)
        steps = [(index, "q2 * 8 + u", {"q2": q2}) for q2 in range(8)]
    for t in (0, 1, 37, 255):
        for index, slot, env in steps:
            for u in range(8):
                at = dict(env, u=u)
                found[t, eval(slot, at)] = eval(index.replace("(int)threadIdx.x", str(t)), at) + u
    return found


@pytest.mark.parametrize("edits", [("direct",), ("direct", "contiguous")], ids=["as-generated", "contiguous"])
def test_resident_probe_element_edits_store_what_they_load(edits):
    """A thread stores each element where it loaded it from, with or without "contiguous" (which gives a
    thread 16 adjacent elements a stage instead of two vectors 2048 apart)."""
    from cbrules import api
    from cbrules.kernels import reductions
    from benchmarks import resident_probe
    params = _edit_base("path")
    text = resident_probe._edit(api.generate(reductions.persistent(**params)).text, edits, params)
    loads, stores = _element_map(text, "x"), _element_map(text, "out")
    assert loads == stores and len(loads) == 4 * 64
    adjacent = loads[1, 8] - loads[1, 0]
    assert adjacent == (8 if "contiguous" in edits else 2048)


def test_resident_probe_setup_and_row_edits():
    """The direct kernel without its set-up has no barrier left and, without the tensor map, launches with
    x, out and M only; plain loads drop __restrict__ from x alone; no block reductions leaves none; two
    blocks an SM pads the shared memory to that occupancy. The set-up edits need the direct path."""
    from cbrules import api
    from cbrules.kernels import reductions
    from benchmarks import resident_probe
    params = _edit_base("path")
    text = api.generate(reductions.persistent(**params)).text
    ck = resident_probe.build(params, ("direct", "no set-up", "no tensor map"))
    body = ck.source.text[ck.source.text.index('extern "C"'):]
    assert "cb_mbar_" not in body and "pre-prologue" not in body and "post-epilogue" not in body
    assert [p.name for p in ck.source.params] == ["M", "x", "out"] and "CUtensorMap" not in body
    with pytest.raises(ValueError, match="directly"):
        resident_probe._edit(text, ("no set-up",), params)
    plain = resident_probe._edit(text, ("direct", "plain loads"), params)
    assert "const cb_bf16* x," in plain and "cb_bf16* __restrict__ out" in plain
    alone = resident_probe._edit(text, ("no block reductions",), params)
    assert "cb_block_reduce<float>(" not in alone[alone.index('extern "C"'):] and "v2 = s1;" in alone
    two = resident_probe.build(params, ("two blocks an SM",))
    assert two.source.shared_bytes == 115712 and "blocks/SM=2" in resident_probe.note(two, params)


def test_scaling_probe_fit_and_report(tmp_path):
    """The fit recovers a line's intercept and slope; the report of a --json file gives the ratios to
    Triton's row kernel a shape, over the rounds, and a row."""
    import json
    from benchmarks import scaling_probe
    a, b, res = scaling_probe.fit([1024, 2048, 4096], [3.0 + 0.5 * m for m in (1024, 2048, 4096)])
    assert abs(a - 3.0) < 1e-9 and abs(b - 0.5) < 1e-12 and max(map(abs, res)) < 1e-9
    rows = (1024, 2048, 4096, 8192, 16384, 32768, 65536)
    entry = lambda a, b, m: {"median": a + b * m, "round_medians": [a + b * m] * 3, "ok": True,  # noqa: E731
                             "note": "", "fed": 3, "pairs": 1, "rounds_run": 3}
    table = {m: {"triton row": entry(0.004, 1e-5, m), "ours": entry(0.005, 1.01e-5, m)} for m in rows}
    path = tmp_path / "s.json"
    path.write_text(json.dumps({16384: table}))
    out = _run("benchmarks/scaling_probe.py", "--from-json", str(path))
    assert "65536x16384 ours" in out and "0.989x triton (rounds 0.989-0.989)" in out
    assert "ours                                           a=   5.00 us" in out and "0.9901x triton a row" in out

def test_persist_probe_variants_compile(tmp_path):
    """Session 6's persistent-kernel probes (timelines, the dynamic tile scheduler, the static
    permutations, the producer warps' early return, the stmatrix epilogue) apply to the generated
    code and compile without spills or wgmma serialization."""
    out = _run("benchmarks/persist_probe.py", "--cpu", "--out", str(tmp_path))
    lines = dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)
    for name in ("coop-pers-dyn", "coop-pers-exit", "coop-pers-dynstatic", "coop-pers-pairA", "coop-pers-dyn-stm",
                 "coop-pers-dyn-tl", "coop-tl", "coop-pers-ctr-exit"):
        assert "spills 0/0" in lines[name] and "C7514" not in lines[name], (name, lines[name])
    dyn = (tmp_path / "coop-pers-dyn.cu").read_text()
    assert "atomicAdd(&cb_sched[0], 1)" in dyn and "cb_tile_of[" in dyn and "return;" in dyn
    assert "stmatrix.sync.aligned.m8n8.x4" in (tmp_path / "coop-stm.cu").read_text()
    assert "cb_tl + (long long)(tile) * 8" in (tmp_path / "coop-pers-tl.cu").read_text()


def test_ncu_stalls_groups_samples_by_instruction_kind(tmp_path):
    """benchmarks/ncu_stalls.py sums an ncu source page's samples by instruction kind, per kernel."""
    reasons = ["stall_long_sb", "stall_barrier"]
    head = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed", *reasons]
    rows = [["0x10", "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R3+URZ], R0", "30", "4", "30", "0"],
            ["0x20", "WARPGROUP.DEPBAR.LE gsb0, 0x1", "60", "4", "0", "60"],
            ["0x30", "HGMMA.64x256x16.F32.BF16 R24, gdesc[UR8], R24", "10", "4", "0", "0"]]
    csv_text = "\n".join(",".join(f'"{c}"' for c in r) for r in
                         [["Kernel Name", "k1"], head, *rows, ["Kernel Name", "k2"], head, rows[2]])
    path = tmp_path / "source.csv"
    path.write_text(csv_text + "\n")
    out = _run("benchmarks/ncu_stalls.py", str(path), "--labels", "first,second")
    first, second = out.split("second (k2):")
    assert "60.0 %  wgmma wait (WARPGROUP.DEPBAR)  (barrier 60.0)" in first
    assert "30.0 %  mbarrier try-wait  (long_sb 30.0)" in first
    assert "100.0 %  wgmma issue (HGMMA)" in second
