#!/bin/bash
# session 43, GPU call 2: the issue's acceptance benchmarks at the heuristic defaults (the long bounds at 512):
# the standard grid of benchmarks/attention.py with cuDNN and FA2, then SHAPES.md end to end
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $OUT/env2.txt 2>&1
python3 -c "import torch,triton;print(torch.__version__,triton.__version__,torch.version.cuda,torch.backends.cudnn.version())" >> $OUT/env2.txt 2>&1
cat $OUT/env2.txt; git log --oneline -1 >> $OUT/env2.txt
timeout 320 python3 benchmarks/attention.py --out $OUT/grid.json > $OUT/grid.txt 2>&1; echo "rc $?" >> $OUT/grid.txt
tail -14 $OUT/grid.txt
timeout 250 python3 benchmarks/shapes.py --rep 50 --out $OUT/shapes.json > $OUT/shapes.txt 2>&1; echo "rc $?" >> $OUT/shapes.txt
tail -8 $OUT/shapes.txt
