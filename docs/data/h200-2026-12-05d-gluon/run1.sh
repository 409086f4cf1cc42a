#!/bin/bash
# session 43, GPU call 1: the row-limit mask test; ROW_LIMIT_MASK off/on over the 12 D=128 grid rows (the forward goal figure); the backward goal figure
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $OUT/env1.txt 2>&1
python3 -c "import torch,triton;print(torch.__version__,triton.__version__,torch.version.cuda,torch.backends.cudnn.version())" >> $OUT/env1.txt 2>&1
cat $OUT/env1.txt
timeout 80 python3 -m pytest -m gpu -v -n 12 tests/kernels/test_gluon_gpu.py -k row_limit > $OUT/t1.log 2>&1; echo "rc $?" >> $OUT/t1.log
grep -E "FAILED|ERROR|^E " $OUT/t1.log | head -20; tail -2 $OUT/t1.log
G=grid-d128-512,grid-d128-1024,grid-d128-2048,grid-d128-4096,grid-d128-8192,grid-d128-16384
timeout 220 python3 benchmarks/gluon_fwd.py --grid --rows $G --configs persistent --tma-store on --o-tile both --switch ROW_LIMIT_MASK=0,1 --rounds 2 --out $OUT/fwd_rowlimit.json > $OUT/fwd_rowlimit.log 2>&1; echo "rc $?" >> $OUT/fwd_rowlimit.log
tail -6 $OUT/fwd_rowlimit.log
timeout 240 python3 benchmarks/gluon_bwd.py --grid --rows $G --gluon fused --dq-first both --rounds 2 --rep 30 --out $OUT/bwd_grid.json > $OUT/bwd_grid.log 2>&1; echo "rc $?" >> $OUT/bwd_grid.log
tail -6 $OUT/bwd_grid.log
