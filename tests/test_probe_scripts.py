"""The hand-edited CUDA variants of the GPU probes still apply to the generated code and compile (NVRTC,
no GPU): each edit insists on finding the text it replaces, so a change to the rules or to a kernel's
defaults that moves that text fails here rather than on the H200."""
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.xdist_group("probe-scripts")
ROOT = Path(__file__).resolve().parents[1]


def _run(*argv: str) -> str:
    r = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


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
    assert out.count("blocks/SM=3") == 6  # the same occupancy as ops.py's choice


def test_resident_probe_path_edits_drop_the_tma():
    """``direct`` reads every vector from global memory and nothing through the TMA or the barriers;
    ``shared`` still reads the slots, after each thread copied its vectors there."""
    from cbrules import api
    from cbrules.kernels import reductions
    from benchmarks import resident_probe
    (_, params, _), *_ = resident_probe.variants((16384, 16384), "path")
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
    (_, params, _), *_ = resident_probe.variants((16384, 16384), "reduce")
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
