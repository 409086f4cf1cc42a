#!/bin/bash
# session 43, GPU call 3: the standard grid of benchmarks/attention.py with the configs the drop-in launches
# (the long entries from 512), then the GPU tests that run the defaults at short D=128 lengths
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $OUT/env3.txt 2>&1
python3 -c "import torch,triton;print(torch.__version__,triton.__version__,torch.version.cuda,torch.backends.cudnn.version())" >> $OUT/env3.txt 2>&1
cat $OUT/env3.txt; git log --oneline -1 >> $OUT/env3.txt
SECONDS=0
timeout 260 python3 benchmarks/attention.py --out $OUT/grid.json > $OUT/grid.txt 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/grid.txt
tail -9 $OUT/grid.txt
SECONDS=0
timeout 270 python3 -m pytest -m gpu -n 12 tests/kernels/test_attention_gpu.py tests/kernels/test_cuda_graphs_gpu.py tests/kernels/test_launch_plans.py tests/kernels/test_ops.py > $OUT/t3.log 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/t3.log
grep -E "FAILED|ERROR|^E " $OUT/t3.log | head -20; tail -2 $OUT/t3.log
