#!/bin/bash
# session 39, GPU call 1
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $OUT/env.txt 2>&1
timeout 150 python3 -m pytest -m gpu -v -n 8 tests/kernels/test_gluon_gpu.py -k "tma_store or trains_through" > $OUT/t1.log 2>&1; echo "rc $?" >> $OUT/t1.log
tail -3 $OUT/t1.log
timeout 50 python3 benchmarks/gluon_fwd.py --grid --realistic --rows grid-d128-512,grid-d128-2048,llama3-70b-tp8-train-4k --configs persistent --timer do_bench --host-time --rounds 3 > $OUT/timer-dobench.log 2>&1
timeout 70 python3 benchmarks/gluon_fwd.py --grid --realistic --rows grid-d128-512,grid-d128-2048,llama3-70b-tp8-train-4k --configs persistent --timer cushioned --rounds 3 > $OUT/timer-cushioned.log 2>&1
tail -4 $OUT/timer-dobench.log $OUT/timer-cushioned.log
timeout 70 python3 benchmarks/gluon_bwd.py --realistic --rows llama3-70b-tp8-train-4k --gluon all --rounds 5 --host-time > $OUT/bwd70b.log 2>&1
tail -4 $OUT/bwd70b.log
timeout 230 python3 benchmarks/gluon_fwd.py --grid --realistic --configs persistent --tma-store both --rounds 2 --out $OUT/fwd.json > $OUT/fwd.log 2>&1; echo "rc $?" >> $OUT/fwd.log
tail -8 $OUT/fwd.log
