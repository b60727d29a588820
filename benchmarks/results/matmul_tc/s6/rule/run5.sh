set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit 1
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv,noheader
echo "== timing"; timeout 280 python3 benchmarks/persist_probe.py --out $OUT/pp --rounds 7 --only coop,coop-pers,coop-pers-exit,coop-rule,coop-pers-rule > $OUT/time.log 2>&1; echo rc=$?; tail -40 $OUT/time.log
echo "== timelines"; timeout 120 python3 benchmarks/persist_probe.py --out $OUT/pt --timeline --only coop-pers-exit-tl,coop-pers-rule-tl,coop-rule-tl > $OUT/tl.log 2>&1; echo rc=$?; tail -30 $OUT/tl.log
echo "== sass"; python3 - <<'PY' > $OUT/sass.log 2>&1
import os, subprocess, sys
sys.path.insert(0, "benchmarks")
import persist_probe as pp
from cbrules.codegen.nvrtc import compile_cuda
srcs = pp.sources(132)
for name in ("coop-pers-exit", "coop-pers-rule", "coop-pers"):
    r = compile_cuda(srcs[name].text, srcs[name].name)
    path = f"/tmp/{name}.cubin"; open(path, "wb").write(r.cubin)
    sass = subprocess.run(["cuobjdump", "-sass", path], capture_output=True, text=True).stdout
    open(os.environ["OUT"] + f"/{name}.sass", "w").write(sass)
    print(name, "instructions", sum(1 for l in sass.splitlines() if l.strip().startswith("/*") and "*/" in l))
PY
cat $OUT/sass.log
