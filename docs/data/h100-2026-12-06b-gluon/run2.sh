#!/bin/bash
# session 47, GPU call 2: SKIP_DEAD_STEPS on and the causal D=128 long default a step late with the share first
# (family 4, dq_first 1): the launch plans and the search space's backward configs; the standard grid through
# the drop-in (benchmarks/attention.py)
cd "$(dirname "$0")/../../.."
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $OUT/env2.txt 2>&1
grep -n "^SKIP_DEAD_STEPS" flashtune/kernels/gluon_backward.py >> $OUT/env2.txt; grep -n '^_SM90_BWD\[(_bf, 128, "long"' flashtune/kernels/config.py >> $OUT/env2.txt; cat $OUT/env2.txt
SECONDS=0
timeout 200 python3 -m pytest -m gpu -v -n 14 tests/kernels/test_launch_plans.py tests/kernels/test_attention_gpu.py tests/kernels/test_gluon_bwd_gpu.py -k "launch_plans or replay or every_search_space_config or (matches_the_reference and fused) or trains_through" > $OUT/t2.log 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/t2.log
grep -E "FAILED|ERROR" $OUT/t2.log | head -20; grep -c PASSED $OUT/t2.log; tail -2 $OUT/t2.log
SECONDS=0
timeout 220 python3 benchmarks/attention.py --out $OUT/grid2.json > $OUT/grid2.txt 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/grid2.txt
tail -14 $OUT/grid2.txt
