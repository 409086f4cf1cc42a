#!/bin/bash
# session 42, GPU call 1: the DQ_FIRST and short-V-ring tests, then their benchmarks
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $OUT/env.txt 2>&1
python3 -c "import torch,triton;print(torch.__version__,triton.__version__,torch.version.cuda,torch.backends.cudnn.version())" >> $OUT/env.txt 2>&1
cat $OUT/env.txt
timeout 200 python3 -m pytest -m gpu -v -n 12 tests/kernels/test_gluon_bwd_gpu.py tests/kernels/test_gluon_persistent_gpu.py tests/kernels/test_gluon_trace_gpu.py -k "order_switches or o_tiles or shorter_v_ring or dq_share_first or smoke" > $OUT/t1.log 2>&1; echo "rc $?" >> $OUT/t1.log
grep -E "FAILED|ERROR|^E " $OUT/t1.log | head -20; tail -2 $OUT/t1.log
R=grid-d128-512,grid-d128-1024,grid-d128-2048,grid-d128-4096,grid-d128-16384
timeout 140 python3 benchmarks/gluon_fwd.py --grid --rows $R --configs persistent --tma-store on --o-tile both --rounds 2 --out $OUT/fwd_otile.json > $OUT/fwd_otile.log 2>&1; echo "rc $?" >> $OUT/fwd_otile.log
tail -6 $OUT/fwd_otile.log
B=grid-d128-1024,grid-d128-4096,grid-d128-16384,mistral-7b-train-2k
timeout 200 python3 benchmarks/gluon_bwd.py --grid --realistic --rows $B --gluon fused --switch DQ_FIRST=0,1 --rounds 2 --rep 30 --out $OUT/bwd_dqfirst.json > $OUT/bwd_dqfirst.log 2>&1; echo "rc $?" >> $OUT/bwd_dqfirst.log
tail -6 $OUT/bwd_dqfirst.log
