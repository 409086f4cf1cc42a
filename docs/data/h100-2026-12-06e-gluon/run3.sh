#!/bin/bash
# session 50, GPU call 3: a search of the D=256 backward key (the wide kernel's family_defaults among its trials,
# each checked against the reference), then the GPU suite's shard 3 (-v: failures named) with the D=256 kernel on
cd "$(dirname "$0")/../../.."
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/env3.txt 2>&1; cat $OUT/env3.txt
SECONDS=0
timeout 170 python3 -m flashtune search --head-dim 256 --seq-len 4096 --causal --pass bwd --trials 10 --no-progress \
    --db $OUT/d256.db > $OUT/search_d256.txt 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/search_d256.txt
timeout 30 python3 -m flashtune results --db $OUT/d256.db >> $OUT/search_d256.txt 2>&1
tail -30 $OUT/search_d256.txt
SECONDS=0
timeout 360 python3 -m pytest -m gpu -v -n 14 -o faulthandler_timeout=120 tests --ignore=tests/kernels/test_gluon_bwd_gpu.py \
    --ignore=tests/kernels/test_launch_plans.py --ignore=tests/kernels/test_gluon_gpu.py \
    --ignore=tests/kernels/test_gluon_persistent_gpu.py --ignore=tests/kernels/test_gluon_trace_gpu.py \
    --ignore=tests/kernels/test_decode_gpu.py > $OUT/suite3.log 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/suite3.log
grep -E "FAILED|ERROR" $OUT/suite3.log | head -20; tail -2 $OUT/suite3.log
