#!/bin/bash
# session 41, GPU call 3: the turns bits test (fixed), the persistent forward's GPU file with the snake default
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/env3.txt 2>&1; cat $OUT/env3.txt
timeout 100 python3 -m pytest -m gpu -v -n 12 tests/kernels/test_gluon_bwd_gpu.py -k "turns" > $OUT/t4.log 2>&1; echo "rc $?" >> $OUT/t4.log
grep -E "FAILED|ERROR|^E " $OUT/t4.log | head -10; tail -2 $OUT/t4.log
timeout 170 python3 -m pytest -m gpu -n 12 tests/kernels/test_gluon_persistent_gpu.py > $OUT/t3.log 2>&1; echo "rc $?" >> $OUT/t3.log
grep -E "FAILED|ERROR" $OUT/t3.log | head -10; tail -2 $OUT/t3.log
