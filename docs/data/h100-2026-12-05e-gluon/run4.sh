#!/bin/bash
# session 43, GPU call 4: the determinism test as the defaults now are, then the GPU files that run the defaults
# at short D=128 lengths (call 3's run was cut by its timeout after one failure)
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/env4.txt 2>&1; cat $OUT/env4.txt
SECONDS=0
timeout 430 python3 -m pytest -m gpu -v -n 12 tests/kernels/test_attention_gpu.py tests/kernels/test_cuda_graphs_gpu.py tests/kernels/test_launch_plans.py tests/kernels/test_ops.py -k "not every_search_space_config" > $OUT/t4.log 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/t4.log
grep -E "FAILED|ERROR|^E " $OUT/t4.log | head -20; grep -c PASSED $OUT/t4.log; tail -2 $OUT/t4.log
