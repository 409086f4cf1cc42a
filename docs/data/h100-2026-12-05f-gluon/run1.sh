#!/bin/bash
# session 45, GPU call 1: the seventh session's backward GPU tests (numeric switches, step counters, persistent walk,
# bhdn, determinism, fused) and the new D=256 forward's; STEP_COUNTERS x SCALE_IN_P timed over the 6 D=128 grid
# lengths (both causal modes, the drop-in's backward config per row); the D=256 forward on gemma2's row
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $OUT/env1.txt 2>&1
python3 -c "import torch,triton;print(torch.__version__,triton.__version__,torch.version.cuda,torch.backends.cudnn.version())" >> $OUT/env1.txt 2>&1
cat $OUT/env1.txt
SECONDS=0
timeout 210 python3 -m pytest -m gpu -v -n 14 tests/kernels/test_gluon_bwd_gpu.py tests/kernels/test_attention_gpu.py tests/kernels/test_gluon_gpu.py -k "numeric_switches or order_switches or persistent_walk or bhdn or deterministic or d256" > $OUT/t1.log 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/t1.log
grep -E "FAILED|ERROR|^E " $OUT/t1.log | head -30; grep -c PASSED $OUT/t1.log; tail -2 $OUT/t1.log
G=grid-d128-512,grid-d128-1024,grid-d128-2048,grid-d128-4096,grid-d128-8192,grid-d128-16384
SECONDS=0
timeout 270 python3 benchmarks/gluon_bwd.py --grid --rows $G --gluon default --switch STEP_COUNTERS=0,1 --switch SCALE_IN_P=0,1 --rounds 2 --rep 20 --out $OUT/bwd_switches.json > $OUT/bwd_switches.log 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/bwd_switches.log
tail -34 $OUT/bwd_switches.log
SECONDS=0
timeout 90 python3 benchmarks/gluon_fwd.py --realistic --rows gemma2-d256-train-4k --configs persistent --persistent-buffers 2,3 --overlap both --rounds 2 --rep 50 --out $OUT/fwd_d256_gemma2.json > $OUT/fwd_d256_gemma2.log 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/fwd_d256_gemma2.log
tail -8 $OUT/fwd_d256_gemma2.log
