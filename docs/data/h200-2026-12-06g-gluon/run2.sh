#!/bin/bash
# session 52, GPU call 2: the D=64 forward's three bands (middle band at two CTAs per SM from 256 queries, the one-CTA
# Gluon kernel from 4096, config.py) through the drop-in: the D=64 realistic GPU tests, the D=64 grid
# (benchmarks/attention.py: flashtune's defaults beside cuDNN and FlashAttention-2, each row checked against cuDNN
# first), SHAPES.md's forward rows.
cd "$(dirname "$0")/../../.."
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $OUT/env2.txt 2>&1
python3 -c "import torch,triton;print(torch.__version__,triton.__version__,torch.version.cuda,torch.backends.cudnn.version())" >> $OUT/env2.txt 2>&1
cat $OUT/env2.txt
SECONDS=0
timeout 150 python3 -m pytest -m gpu -v -n 12 tests/kernels/test_attention_gpu.py -k "realistic and d64" \
    > $OUT/d64_tests.log 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/d64_tests.log
grep -E "FAILED|ERROR" $OUT/d64_tests.log | head -20; tail -2 $OUT/d64_tests.log
SECONDS=0
timeout 170 python3 benchmarks/attention.py --head-dims 64 --passes fwd --rounds 2 --rep 50 --out $OUT/grid_d64.json \
    > $OUT/grid_d64.txt 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/grid_d64.txt
tail -22 $OUT/grid_d64.txt
SECONDS=0
timeout 150 python3 benchmarks/shapes.py --passes fwd --rep 50 --out $OUT/shapes_fwd.json > $OUT/shapes_fwd.txt 2>&1
echo "rc $? in ${SECONDS}s" >> $OUT/shapes_fwd.txt
tail -30 $OUT/shapes_fwd.txt
