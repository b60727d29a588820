#!/bin/bash
# Session 6, helper T5, device call 1 (run from the repository root on the H200, after the wheel
# preamble): first launches of the new variants, per-tile timelines, ncu of one launch each at 8192^3
# and 8192x8192x1024, interleaved timing. Everything lands in $W and comes back as $OUT/run1.tgz.
W=/tmp/w; rm -rf $W; mkdir -p $W
P=benchmarks/persist_probe.py
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv > $W/smi0.csv 2>&1
timeout 60 python3 $P --out $W/check --only coop-pers-ctr,coop-pers-dyn --check > $W/check.log 2>&1
rc=$?; echo "check rc=$rc"; tail -4 $W/check.log
if [ $rc = 0 ]; then DYN=,coop-pers-dyn; TLD=,coop-pers-dyn-tl; N=8; else DYN=; TLD=; N=6; fi
timeout 90 python3 $P --out $W/tl --timeline --only coop-tl,coop-pers-tl$TLD > $W/timeline.log 2>&1
echo "timeline rc=$?"; grep -c variant $W/timeline.log
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
$NCU --query-metrics --chip gh100 > $W/ncu_metrics.txt 2>&1
M=sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.max
M=$M,sm__pipe_tensor_op_hmma_cycles_active.min,sm__pipe_tensor_op_hmma_cycles_active.avg,dram__bytes_read.sum
M=$M,dram__bytes_write.sum,lts__t_bytes.sum,lts__t_sector_hit_rate.pct,sm__cycles_elapsed.avg.per_second
M=$M,gpu__time_duration.sum,sm__cycles_active.min,sm__cycles_active.max,sm__cycles_active.avg,sm__cycles_elapsed.max
for m in lts__t_sectors_srcunit_ltcfabric lts__t_sectors_srcunit_tex lts__t_sectors_srcnode_gpc lts__t_sectors_lookup_miss lts__t_sectors_lookup_hit; do
  grep -qw "^$m" $W/ncu_metrics.txt && M=$M,$m.sum
done
echo "metrics: $M"
timeout 170 $NCU --clock-control none -k regex:matmul -c $N --section SpeedOfLight --section WarpStateStats \
  --section SourceCounters --section MemoryWorkloadAnalysis --metrics $M -f -o $W/prof \
  python3 $P --out $W/once --once coop,coop-pers,triton$DYN > $W/ncu_run.log 2>&1
echo "ncu rc=$?"; tail -3 $W/ncu_run.log
$NCU -i $W/prof.ncu-rep --page details --csv > $W/ncu_details.csv 2> $W/ncu_details.err
$NCU -i $W/prof.ncu-rep --page raw --csv > $W/ncu_raw.csv 2> $W/ncu_raw.err
$NCU -i $W/prof.ncu-rep --page source --csv --print-source sass > $W/ncu_source.csv 2> $W/ncu_source.err
ls -la $W
timeout 200 python3 $P --out $W/time --rounds 5 --only coop,coop-pers,coop-pers-ctr$DYN > $W/time.log 2>&1
echo "time rc=$?"; grep TFLOP $W/time.log
rm -f $W/ncu_metrics.txt
tar czf $OUT/run1.tgz -C $W .
ls -la $OUT
