#!/bin/bash
# session 46, GPU call 2: the issue's acceptance with the committed defaults: the fused backward over the 12 D=128
# grid rows (both dQ orders), the standard grid through the drop-in with cuDNN and FA2; POLY_EXP2 in the D=64
# backward
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $OUT/env2.txt 2>&1
python3 -c "import torch,triton;print(torch.__version__,triton.__version__,torch.version.cuda,torch.backends.cudnn.version())" >> $OUT/env2.txt 2>&1
grep -n "^STEP_COUNTERS\|^POLY_EXP2" flashtune/kernels/gluon_backward.py flashtune/kernels/gluon_forward.py >> $OUT/env2.txt; cat $OUT/env2.txt
G=grid-d128-512,grid-d128-1024,grid-d128-2048,grid-d128-4096,grid-d128-8192,grid-d128-16384
SECONDS=0
timeout 120 python3 benchmarks/gluon_bwd.py --grid --rows $G --gluon fused --dq-first both --rounds 2 --rep 30 --out $OUT/bwd_fused.json > $OUT/bwd_fused.log 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/bwd_fused.log
tail -6 $OUT/bwd_fused.log
SECONDS=0
timeout 190 python3 benchmarks/attention.py --out $OUT/grid2.json > $OUT/grid2.txt 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/grid2.txt
tail -14 $OUT/grid2.txt
B64=grid-d64-1024,grid-d64-2048,grid-d64-4096,grid-d64-8192,grid-d64-16384
SECONDS=0
timeout 90 python3 benchmarks/gluon_bwd.py --grid --rows $B64 --gluon default --switch POLY_EXP2=0,1 --rounds 2 --rep 20 --out $OUT/bwd_poly64.json > $OUT/bwd_poly64.log 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/bwd_poly64.log
tail -6 $OUT/bwd_poly64.log
