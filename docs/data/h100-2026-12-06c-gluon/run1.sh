#!/bin/bash
# session 48, GPU call 1: TMA_STORE_DKDV (dK/dV through the K/V smem tiles and TMA bulk stores; written in session
# 47, never run) against the register stores, bit for bit and in the launch-plan replay; the _due_dq_share refactor
# (the fused kernel's order switches and reference tests); the fused backward over the 12 D=128 grid rows with
# TMA_STORE_DKDV 0/1 (both dQ orders); the short rows kernel by kernel
cd "$(dirname "$0")/../../.."
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $OUT/env1.txt 2>&1
python3 -c "import torch,triton;print(torch.__version__,triton.__version__,torch.version.cuda,torch.backends.cudnn.version())" >> $OUT/env1.txt 2>&1
cat $OUT/env1.txt
SECONDS=0
timeout 200 python3 -m pytest -m gpu -v -n 14 tests/kernels/test_gluon_bwd_gpu.py tests/kernels/test_launch_plans.py -k "tma_store_of_dk_dv or order_switches or (matches_the_reference and fused)" > $OUT/t1.log 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/t1.log
grep -E "FAILED|ERROR" $OUT/t1.log | head -20; grep -c PASSED $OUT/t1.log; tail -2 $OUT/t1.log
G=grid-d128-512,grid-d128-1024,grid-d128-2048,grid-d128-4096,grid-d128-8192,grid-d128-16384
SECONDS=0
timeout 150 python3 benchmarks/gluon_bwd.py --grid --rows $G --gluon fused --dq-first both --switch TMA_STORE_DKDV=0,1 --rounds 2 --rep 30 --out $OUT/bwd_tma.json > $OUT/bwd_tma.log 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/bwd_tma.log
tail -5 $OUT/bwd_tma.log
