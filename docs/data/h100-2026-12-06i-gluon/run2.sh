#!/bin/bash
# session 54, GPU call 2 (what the device time left after the refused starts allows, about 200 s): on an H200 the
# standard grid through the drop-in with cuDNN and FlashAttention-2 (run4.sh's second part: the acceptance's figures);
# on any other card session 53's run3.sh (run1.sh's first two parts: the D=64 middle band's full-call entry against
# the reference, SHAPES.md's forward through the drop-in).
cd "$(dirname "$0")/../../.."
nvidia-smi --query-gpu=name --format=csv | grep -q H200 || exec bash docs/data/h100-2026-12-06h-gluon/run3.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $OUT/env2.txt 2>&1
python3 -c "import torch,triton;print(torch.__version__,triton.__version__,torch.version.cuda,torch.backends.cudnn.version())" >> $OUT/env2.txt 2>&1
cat $OUT/env2.txt
SECONDS=0
timeout 170 python3 benchmarks/attention.py --out $OUT/grid4.json > $OUT/grid4.txt 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/grid4.txt
tail -9 $OUT/grid4.txt
