set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit 1
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv,noheader
echo "== gpu suite"; timeout 240 python3 -m pytest -q -m gpu tests/ -n 8 -p no:cacheprovider > $OUT/gpu.log 2>&1; echo rc=$?; tail -3 $OUT/gpu.log
echo "== sanitizer (block_stats)"
P=benchmarks/probe_elements.py
run() { tag=$1; shift; timeout 100 compute-sanitizer --tool $tool python3 $P "$@" > $OUT/san_${tag}_$tool.log 2>&1; echo "$tool $tag rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|hazard|differ|OK|all" $OUT/san_${tag}_$tool.log | tail -3; }
for tool in racecheck synccheck memcheck; do
  run direct persistent 512,16384 bfloat16 2 width=4096 threads=512 box=256 stats=stable direct=true
  run directwalk persistent 300,16384 bfloat16 2 width=4096 threads=512 box=256 stats=stable direct=true walk=132
  run tma persistent 300,16384 float32 2 width=4096 threads=256 box=256 stats=stable
  run wswalk persistent 134,32768 bfloat16 2 width=16384 threads=512 box=256 one_box=true walk=132 warp_specialize=true stats=stable
done
echo "== run.py normalize"
timeout 200 python3 benchmarks/run.py --dtype bfloat16 --ops normalize --shapes 16384x16384 --impls copy,torch,generated,triton --reps 20 --stages 2,4 --out $OUT/bf16 > $OUT/run_bf16.log 2>&1; echo rc=$?; tail -8 $OUT/run_bf16.log
timeout 150 python3 benchmarks/run.py --dtype float16 --ops normalize --shapes 16384x16384 --impls copy,torch,generated,triton --reps 20 --stages 2,4 --out $OUT/f16 > $OUT/run_f16.log 2>&1; echo rc=$?; tail -8 $OUT/run_f16.log
