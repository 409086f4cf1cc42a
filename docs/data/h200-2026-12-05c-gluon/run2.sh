#!/bin/bash
# session 40, GPU call 2
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $OUT/env.txt 2>&1
timeout 100 python3 -m pytest -m gpu -v -n 8 tests/kernels/test_gluon_persistent_gpu.py -k "snake or heaviest" > $OUT/t2.log 2>&1; echo "rc $?" >> $OUT/t2.log
grep -E "FAILED|ERROR" $OUT/t2.log | head; tail -2 $OUT/t2.log
D128=grid-d128-512,grid-d128-1024,grid-d128-2048,grid-d128-4096,grid-d128-8192,grid-d128-16384,llama3-8b-train-8k,llama3-70b-tp8-train-4k,mistral-7b-train-2k,qwen-28h-train-4k,llama3-8b-prefill-2k,chunked-prefill-1k-of-16k
timeout 170 python3 benchmarks/gluon_fwd.py --grid --realistic --rows $D128 --configs persistent --persistent-order both --rounds 2 --out $OUT/fwd2.json > $OUT/fwd2.log 2>&1; echo "rc $?" >> $OUT/fwd2.log
tail -6 $OUT/fwd2.log
timeout 230 python3 benchmarks/gluon_bwd.py --grid --realistic --rows $D128 --gluon all --rounds 2 --rep 30 --out $OUT/bwd.json > $OUT/bwd.log 2>&1; echo "rc $?" >> $OUT/bwd.log
tail -7 $OUT/bwd.log
