#!/bin/bash
# session 50, GPU call 5: the D=64 forward on SHAPES.md's two 512-token rows (gpt2-train-512 causal 0.816x cuDNN,
# bert-base-512 full 0.867x through the drop-in, run4): Triton and Gluon configs swept (benchmarks/shapes.py --sweep)
cd "$(dirname "$0")/../../.."
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/env5.txt 2>&1; cat $OUT/env5.txt
SECONDS=0
timeout 400 python3 benchmarks/shapes.py --rows gpt2-train-512 bert-base-512 --passes fwd --rep 50 \
    --sweep docs/data/h100-2026-12-06e-gluon/fwd_d64_sweep_in.json --sweep-out $OUT/fwd_d64_best.json \
    --out $OUT/fwd_d64_sweep.json > $OUT/fwd_d64_sweep.txt 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/fwd_d64_sweep.txt
sort -t: -k3 -n $OUT/fwd_d64_sweep.txt | grep "sweep gpt2" | sort -k2 | head -0
grep "sweep" $OUT/fwd_d64_sweep.txt | awk -F': ' '{print $NF, $0}' | sort -n | cut -d' ' -f2- | head -12
tail -8 $OUT/fwd_d64_sweep.txt
