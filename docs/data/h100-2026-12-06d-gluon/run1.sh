#!/bin/bash
# session 49, GPU call 1 (on an H200 only; on any other card it stops at once): the issue's acceptance with this
# session's defaults (TMA_STORE_DKDV on, the causal D=128 default the late share in the usual order): the fused
# backward over the 12 D=128 grid rows (both dQ orders), the standard grid through the drop-in with cuDNN and
# FlashAttention-2, SHAPES.md through the drop-in
cd "$(dirname "$0")/../../.."
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $OUT/env1.txt 2>&1
cat $OUT/env1.txt
grep -q H200 $OUT/env1.txt || { echo "not an H200: stopped"; exit 3; }
python3 -c "import torch,triton;print(torch.__version__,triton.__version__,torch.version.cuda,torch.backends.cudnn.version())" >> $OUT/env1.txt 2>&1
G=grid-d128-512,grid-d128-1024,grid-d128-2048,grid-d128-4096,grid-d128-8192,grid-d128-16384
SECONDS=0
timeout 100 python3 benchmarks/gluon_bwd.py --grid --rows $G --gluon fused --dq-first both --rounds 2 --rep 30 --out $OUT/bwd_fused1.json > $OUT/bwd_fused1.log 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/bwd_fused1.log
tail -5 $OUT/bwd_fused1.log
SECONDS=0
timeout 130 python3 benchmarks/attention.py --out $OUT/grid1.json > $OUT/grid1.txt 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/grid1.txt
tail -9 $OUT/grid1.txt
SECONDS=0
timeout 100 python3 benchmarks/shapes.py --rep 50 --out $OUT/shapes1.json > $OUT/shapes1.txt 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/shapes1.txt
tail -6 $OUT/shapes1.txt
