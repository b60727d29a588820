set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit 1
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv,noheader
git log --oneline -1 2>/dev/null
echo "== gpu suite"; timeout 240 python3 -m pytest -q -m gpu tests/ -n 8 -p no:cacheprovider > $OUT/gpu.log 2>&1; echo rc=$?; tail -3 $OUT/gpu.log
echo "== sanitizer"
for tool in racecheck synccheck; do
  timeout 150 compute-sanitizer --tool $tool python3 benchmarks/sanitize_tc.py "dict(stages=4, persistent=132)" "dict(stages=4)" > $OUT/san_tc_$tool.log 2>&1; echo "$tool matmul_tc rc=$?"; grep -E "OK|WRONG|SUMMARY|rror" $OUT/san_tc_$tool.log | tail -6
  timeout 120 compute-sanitizer --tool $tool python3 benchmarks/probe_elements.py persistent 134,32768 bfloat16 2 width=16384 threads=512 box=256 one_box=true walk=132 warp_specialize=true > $OUT/san_walk_$tool.log 2>&1; echo "$tool walk rc=$?"; tail -2 $OUT/san_walk_$tool.log
done
echo "== matmul_tc"; timeout 300 python3 benchmarks/matmul_tc.py --out $OUT/mm --rounds 5 > $OUT/mm.log 2>&1; echo rc=$?; tail -25 $OUT/mm.log
