#!/bin/bash
# session 48, GPU call 5 (on an H200 only; on any other card it stops at once): the standard grid through the
# drop-in with cuDNN and FlashAttention-2, this session's defaults (the issue's acceptance figure)
cd "$(dirname "$0")/../../.."
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $OUT/env6.txt 2>&1
cat $OUT/env6.txt
grep -q H200 $OUT/env6.txt || { echo "not an H200: stopped"; exit 3; }
python3 -c "import torch,triton;print(torch.__version__,triton.__version__,torch.version.cuda,torch.backends.cudnn.version())" >> $OUT/env6.txt 2>&1
SECONDS=0
timeout 120 python3 benchmarks/attention.py --out $OUT/grid6.json > $OUT/grid6.txt 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/grid6.txt
tail -9 $OUT/grid6.txt
