#!/bin/bash
# session 42, GPU call 4: launch plans and the persistent fp8 tests (timed out at 90 s before), then SHAPES.md end to end with the heuristic defaults
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $OUT/env4.txt 2>&1; cat $OUT/env4.txt
timeout 200 python3 -m pytest -m gpu -v -n 12 tests/kernels/test_launch_plans.py tests/kernels/test_gluon_persistent_gpu.py -k "plan or fp8" > $OUT/t4.log 2>&1; echo "rc $?" >> $OUT/t4.log
grep -E "PASSED|FAILED|ERROR|^E " $OUT/t4.log | head -20; tail -2 $OUT/t4.log
timeout 290 python3 benchmarks/shapes.py --rep 50 --out $OUT/shapes.json > $OUT/shapes.txt 2>&1; echo "rc $?" >> $OUT/shapes.txt
tail -8 $OUT/shapes.txt
