#!/bin/bash
# session 42, GPU call 3: the issue's goal figures over the 12 D=128 grid rows with the new config fields; launch plans
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $OUT/env3.txt 2>&1; cat $OUT/env3.txt
timeout 90 python3 -m pytest -m gpu -n 12 tests/kernels/test_launch_plans.py tests/kernels/test_gluon_persistent_gpu.py -k "plan or fp8" > $OUT/t3.log 2>&1; echo "rc $?" >> $OUT/t3.log
grep -E "FAILED|ERROR|^E " $OUT/t3.log | head -20; tail -2 $OUT/t3.log
G=grid-d128-512,grid-d128-1024,grid-d128-2048,grid-d128-4096,grid-d128-8192,grid-d128-16384
timeout 170 python3 benchmarks/gluon_fwd.py --grid --rows $G --configs persistent --tma-store on --o-tile both --rounds 2 --out $OUT/fwd_grid.json > $OUT/fwd_grid.log 2>&1; echo "rc $?" >> $OUT/fwd_grid.log
tail -6 $OUT/fwd_grid.log
timeout 250 python3 benchmarks/gluon_bwd.py --grid --rows $G --gluon fused --dq-first both --rounds 2 --rep 30 --out $OUT/bwd_grid.json > $OUT/bwd_grid.log 2>&1; echo "rc $?" >> $OUT/bwd_grid.log
tail -6 $OUT/bwd_grid.log
