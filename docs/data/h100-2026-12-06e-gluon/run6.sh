#!/bin/bash
# session 50, GPU call 6: the D=64 forward's defaults against the 512-token sweep's winners (run5) over the whole
# D=64 standard grid: causal the Triton 64x64 w4 s3, full the Gluon persistent kernel with O tiles, 2 x 64 x 128,
# 3 slots, no ping-pong (fwd_d64_candidates.json); two runs of benchmarks/attention.py in one call (defaults, then
# the candidates), each row's ratio to cuDNN in the same run
cd "$(dirname "$0")/../../.."
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/env6.txt 2>&1; cat $OUT/env6.txt
for which in default candidates; do
  extra=""; [ $which = candidates ] && extra="--configs docs/data/h100-2026-12-06e-gluon/fwd_d64_candidates.json"
  SECONDS=0
  timeout 110 python3 benchmarks/attention.py --head-dims 64 --passes fwd --rounds 2 $extra --out $OUT/fwd_d64_$which.json \
      > $OUT/fwd_d64_$which.txt 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/fwd_d64_$which.txt
  tail -16 $OUT/fwd_d64_$which.txt
done
