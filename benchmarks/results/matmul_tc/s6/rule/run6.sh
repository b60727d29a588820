set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit 1
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv,noheader
grep -c "threadIdx.x / 32 ==" rules/warp_specialize.rules
echo "== gpu suite"; timeout 240 python3 -m pytest -q -m gpu tests/ -n 8 -p no:cacheprovider > $OUT/gpu.log 2>&1; echo rc=$?; tail -3 $OUT/gpu.log
echo "== sanitizer"
for tool in racecheck synccheck; do
  timeout 150 compute-sanitizer --tool $tool python3 benchmarks/sanitize_tc.py "dict(stages=4, persistent=132)" "dict(stages=4)" > $OUT/san_tc_$tool.log 2>&1; echo "$tool matmul_tc rc=$?"; grep -E "OK|WRONG|SUMMARY|rror" $OUT/san_tc_$tool.log | tail -6
  timeout 120 compute-sanitizer --tool $tool python3 benchmarks/probe_elements.py persistent 134,32768 bfloat16 2 width=16384 threads=512 box=256 one_box=true walk=132 warp_specialize=true > $OUT/san_walk_$tool.log 2>&1; echo "$tool walk rc=$?"; tail -2 $OUT/san_walk_$tool.log
done
echo "== probe"; timeout 200 python3 benchmarks/persist_probe.py --out $OUT/pp --rounds 7 --only coop,coop-pers,coop-pers-exit,coop-rule,coop-pers-rule > $OUT/time.log 2>&1; echo rc=$?; grep -E "TFLOP|rounds" $OUT/time.log
echo "== timelines"; timeout 100 python3 benchmarks/persist_probe.py --out $OUT/pt --timeline --only coop-pers-exit-tl,coop-pers-rule-tl > $OUT/tl.log 2>&1; echo rc=$?; grep -o '"variant": "[^"]*", "launch": 1, "shape": \[[0-9, ]*\]\|"mainloop_cycles_a_kstep_p10_50_90": \[[0-9., ]*\]' $OUT/tl.log
echo "== matmul_tc"; timeout 300 python3 benchmarks/matmul_tc.py --out $OUT/mm --rounds 7 > $OUT/mm.log 2>&1; echo rc=$?; grep "TFLOP/s (" $OUT/mm.log; tail -8 $OUT/mm.log
