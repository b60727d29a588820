#!/bin/bash
# Session 6, helper T5, device call 2 (repository root on the H200, after the wheel preamble): the
# TPC-pairing test (static permutations), the stmatrix epilogue, timelines, ncu L2 counters, and
# interleaved timing with every round kept. Everything comes back as $OUT/run2.tgz.
W=/tmp/w; rm -rf $W; mkdir -p $W
P=benchmarks/persist_probe.py
NEW=coop-pers-pairA,coop-pers-apart,coop-stm,coop-pers-stm,coop-pers-dyn-stm,coop-pers-pairA-stm
timeout 90 python3 $P --out $W/check --only $NEW --check > $W/check.log 2>&1
echo "check rc=$?"; grep -c " ok" $W/check.log; grep -i "wrong\|error" $W/check.log | head
timeout 90 python3 $P --out $W/tl --timeline --only coop-tl,coop-pers-tl,coop-pers-dyn-tl,coop-pers-pairA-tl,coop-pers-apart-tl > $W/timeline.log 2>&1
echo "timeline rc=$?"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
M=sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,dram__bytes_read.sum,lts__t_bytes.sum
M=$M,lts__t_sector_hit_rate.pct,sm__cycles_elapsed.avg.per_second,gpu__time_duration.sum
M=$M,lts__t_sectors_srcunit_tex.sum,lts__t_sectors_srcunit_ltcfabric.sum,lts__t_sectors_lookup_miss.sum
timeout 100 $NCU --clock-control none -k regex:matmul -c 10 --metrics $M -f -o $W/prof2 \
  python3 $P --out $W/once --once coop,coop-pers,coop-pers-pairA,coop-pers-apart,coop-pers-dyn-stm > $W/ncu_run.log 2>&1
echo "ncu rc=$?"
$NCU -i $W/prof2.ncu-rep --page raw --csv > $W/ncu_raw.csv 2> $W/ncu_raw.err
timeout 220 python3 $P --out $W/time --rounds 11 \
  --only coop,coop-stm,coop-pers,coop-pers-pairA,coop-pers-apart,coop-pers-dyn,coop-pers-dyn-stm,coop-pers-pairA-stm \
  > $W/time.log 2>&1
echo "time rc=$?"; grep -v "first launch" $W/time.log | grep "TFLOP\|rounds"
tar czf $OUT/run2.tgz -C $W .
