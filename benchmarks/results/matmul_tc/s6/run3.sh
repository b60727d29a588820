#!/bin/bash
# Session 6, helper T5, device call 3 (repository root on the H200, after the wheel preamble): which
# part of the dynamic scheduler's code restores the mainloop (producer warps returning early; its code
# with the static order), timelines, and interleaved timing with every round kept -> $OUT/run3.tgz.
W=/tmp/w; rm -rf $W; mkdir -p $W
P=benchmarks/persist_probe.py
timeout 60 python3 $P --out $W/check --only coop-pers-exit,coop-pers-dynstatic,coop-pers-ctr-exit --check > $W/check.log 2>&1
echo "check rc=$?"; grep -c " ok" $W/check.log; grep -i "wrong\|error" $W/check.log | head
timeout 80 python3 $P --out $W/tl --timeline --only coop-pers-tl,coop-pers-exit-tl,coop-pers-dynstatic-tl,coop-pers-ctr-exit-tl,coop-pers-dyn-tl > $W/timeline.log 2>&1
echo "timeline rc=$?"
python3 - <<'PY'
import json
for s in json.load(open('/tmp/w/tl/timeline_summary.json')):
    print(s['variant'], s['shape'][2], s['launch'], 'span', s['span_us'], 'main', s['mainloop_cycles_a_kstep_p10_50_90'], 'epi', s['epilogue_cycles_p10_50_90'][1], 'wait', s['first_full_wait_cycles_p10_50_90'][1])
PY
timeout 200 python3 $P --out $W/time --rounds 11 \
  --only coop,coop-stm,coop-pers,coop-pers-exit,coop-pers-ctr-exit,coop-pers-dynstatic,coop-pers-dyn,coop-pers-dyn-stm > $W/time.log 2>&1
echo "time rc=$?"; grep -v "first launch" $W/time.log | grep "TFLOP\|rounds"
tar czf $OUT/run3.tgz -C $W .
