#!/bin/bash
# session 41, GPU call 2: the dK/dV kernel's consumer turns: correctness, time, trace; the
# persistent forward's early Q release with the register store on short rows
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $OUT/env2.txt 2>&1
python3 -c "import torch,triton;print(torch.__version__,triton.__version__,torch.version.cuda,torch.backends.cudnn.version())" >> $OUT/env2.txt 2>&1
cat $OUT/env2.txt
timeout 120 python3 -m pytest -m gpu -v -n 12 tests/kernels/test_gluon_bwd_gpu.py -k "turns" > $OUT/t2.log 2>&1; echo "rc $?" >> $OUT/t2.log
grep -E "FAILED|ERROR" $OUT/t2.log | head -20; tail -2 $OUT/t2.log
R=grid-d128-1024,grid-d128-8192,mistral-7b-train-2k
timeout 130 python3 benchmarks/gluon_bwd.py --grid --realistic --rows $R --gluon fused --turns 0,1,2 --rounds 2 --rep 30 --out $OUT/bwd_turns.json > $OUT/bwd_turns.log 2>&1; echo "rc $?" >> $OUT/bwd_turns.log
cut -c1-200 $OUT/bwd_turns.log | tail -40
for t in 0 2; do
timeout 45 python3 benchmarks/gluon_profile.py --grid --head-dim 128 --rows grid-d128-4096 --pass bwd --bwd-configs late --turns $t --rounds 1 > $OUT/prof_t$t.log 2>&1; echo "rc $?" >> $OUT/prof_t$t.log
grep -E "per block|consumers:|ms,|rc " $OUT/prof_t$t.log | cut -c1-600
done
timeout 80 python3 benchmarks/gluon_fwd.py --grid --rows grid-d128-512,grid-d128-1024 --configs persistent --tma-store both --o-tile both --rounds 2 --out $OUT/fwd_short.json > $OUT/fwd_short.log 2>&1; echo "rc $?" >> $OUT/fwd_short.log
cut -c1-900 $OUT/fwd_short.log | tail -12
timeout 90 python3 -m pytest -m gpu -v -n 12 tests/kernels/test_gluon_persistent_gpu.py > $OUT/t3.log 2>&1; echo "rc $?" >> $OUT/t3.log
grep -E "FAILED|ERROR" $OUT/t3.log | head -10; tail -2 $OUT/t3.log
