set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit 1
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv,noheader
echo "== matmul_tc"; timeout 400 python3 benchmarks/matmul_tc.py --out $OUT/mm --rounds 11 > $OUT/mm.log 2>&1; echo rc=$?; grep "^|" $OUT/mm.log; tail -3 $OUT/mm.log
