#!/bin/bash
# session 47, GPU call 1: the tests the last run did not reach (launch plans after the fused-dQ assertion fix, the
# forward's POLY_EXP2 after the tuple-index refactor, every search-space config); SKIP_DEAD_STEPS (new: the causal
# walk's all-masked first step left out) against the same kernel without it; the fused backward over the 12 D=128
# grid rows with SKIP_DEAD_STEPS 0/1 (both dQ orders); the short rows' time kernel by kernel (kernel_breakdown.py)
cd "$(dirname "$0")/../../.."
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $OUT/env1.txt 2>&1
python3 -c "import torch,triton;print(torch.__version__,triton.__version__,torch.version.cuda,torch.backends.cudnn.version())" >> $OUT/env1.txt 2>&1
cat $OUT/env1.txt
SECONDS=0
timeout 180 python3 -m pytest -m gpu -v -n 14 tests/kernels/test_launch_plans.py tests/kernels/test_gluon_gpu.py tests/kernels/test_attention_gpu.py tests/kernels/test_gluon_bwd_gpu.py -k "launch_plans or replay or poly_exp2 or every_search_space_config or SKIP_DEAD" > $OUT/t1.log 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/t1.log
grep -E "FAILED|ERROR" $OUT/t1.log | head -20; grep -c PASSED $OUT/t1.log; tail -2 $OUT/t1.log
G=grid-d128-512,grid-d128-1024,grid-d128-2048,grid-d128-4096,grid-d128-8192,grid-d128-16384
SECONDS=0
timeout 130 python3 benchmarks/gluon_bwd.py --grid --rows $G --gluon fused --dq-first both --switch SKIP_DEAD_STEPS=0,1 --rounds 2 --rep 30 --out $OUT/bwd_skip.json > $OUT/bwd_skip.log 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/bwd_skip.log
tail -8 $OUT/bwd_skip.log
SECONDS=0
timeout 100 python3 benchmarks/kernel_breakdown.py --grid --rows grid-d128-512,grid-d128-1024,grid-d128-4096 --calls 10 > $OUT/breakdown.txt 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/breakdown.txt
tail -60 $OUT/breakdown.txt
