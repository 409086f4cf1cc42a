#!/bin/bash
# session 42, GPU call 2: O_TILE and DQ_FIRST as config fields: their GPU tests, then benchmarks on the rows not yet run
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $OUT/env2.txt 2>&1; cat $OUT/env2.txt
timeout 270 python3 -m pytest -m gpu -v -n 12 tests/kernels/test_gluon_bwd_gpu.py tests/kernels/test_gluon_persistent_gpu.py tests/kernels/test_gluon_trace_gpu.py -k "first or order_switches or persistent" > $OUT/t2.log 2>&1; echo "rc $?" >> $OUT/t2.log
grep -E "FAILED|ERROR|^E " $OUT/t2.log | head -20; tail -2 $OUT/t2.log
R=grid-d128-8192,llama3-8b-train-8k,llama3-70b-tp8-train-4k,mistral-7b-train-2k,qwen-28h-train-4k,llama3-8b-prefill-2k,chunked-prefill-1k-of-16k
timeout 100 python3 benchmarks/gluon_fwd.py --grid --realistic --rows $R --configs persistent --tma-store on --o-tile both --rounds 2 --out $OUT/fwd_otile2.json > $OUT/fwd_otile2.log 2>&1; echo "rc $?" >> $OUT/fwd_otile2.log
tail -6 $OUT/fwd_otile2.log
B=grid-d128-2048,grid-d128-4096,grid-d128-8192,llama3-8b-train-8k,llama3-70b-tp8-train-4k,qwen-28h-train-4k
timeout 170 python3 benchmarks/gluon_bwd.py --grid --realistic --rows $B --gluon fused --dq-first both --rounds 2 --rep 30 --out $OUT/bwd_first2.json > $OUT/bwd_first2.log 2>&1; echo "rc $?" >> $OUT/bwd_first2.log
tail -6 $OUT/bwd_first2.log
