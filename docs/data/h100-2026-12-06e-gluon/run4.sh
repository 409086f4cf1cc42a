#!/bin/bash
# session 50, GPU call 4: launch plans with the D=256 Gluon backward's cases (tests/kernels/test_launch_plans.py),
# then every SHAPES.md row through the drop-in beside SDPA's backends (the D=256 backward on)
cd "$(dirname "$0")/../../.."
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/env4.txt 2>&1; cat $OUT/env4.txt
SECONDS=0
timeout 200 python3 -m pytest -m gpu -v -n 4 tests/kernels/test_launch_plans.py > $OUT/plans4.log 2>&1
echo "rc $? in ${SECONDS}s" >> $OUT/plans4.log
grep -E "FAILED|ERROR|^E " $OUT/plans4.log | head -20; tail -2 $OUT/plans4.log
SECONDS=0
timeout 300 python3 benchmarks/shapes.py --rep 50 --out $OUT/shapes4.json > $OUT/shapes4.txt 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/shapes4.txt
tail -50 $OUT/shapes4.txt
