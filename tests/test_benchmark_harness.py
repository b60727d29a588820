"""The benchmark harness, run as a user runs it (a subprocess: the product's tests import nothing from
``benchmarks/``): a dry run builds and compiles every generated variant it would measure, with no GPU."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_a_bfloat16_dry_run_builds_every_variant_in_bfloat16(tmp_path):
    """``--dtype bfloat16`` reaches every generated variant, stages="auto" included (it used to be built
    in float32, and then refused at launch with the bfloat16 tensors)."""
    out = subprocess.run([sys.executable, "benchmarks/run.py", "--dry-run", "--dtype", "bfloat16", "--ops", "exp",
                          "--shapes", "16384x16384", "--stages", "1,2", "--out", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    records = json.loads((tmp_path / "results.json").read_text())["records"]
    generated = [r for r in records if r["impl"].startswith("generated")]
    assert {r["impl"] for r in generated} == {"generated", "generated-auto"}
    assert len(generated) == 3
    for r in generated:
        assert r["resources"]["tensor_dtypes"] == ["bfloat16"], r
        assert "dtype=bfloat16" in r["kernel"], r
