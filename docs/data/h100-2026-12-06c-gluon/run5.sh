#!/bin/bash
# session 48, GPU call 4: with the D=64 backward defaults changed (without masking the fused Gluon backward a step
# late, the share first, from 256 queries; causal a step late from 4096): the attention GPU tests (the defaults on
# SHAPES.md's rows, splits, determinism, every search-space config, the variants); the drop-in over the standard
# grid (cuDNN, FlashAttention-2) and over SHAPES.md
cd "$(dirname "$0")/../../.."
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $OUT/env5.txt 2>&1
python3 -c "import torch,triton;print(torch.__version__,triton.__version__,torch.version.cuda,torch.backends.cudnn.version())" >> $OUT/env5.txt 2>&1
cat $OUT/env5.txt
SECONDS=0
timeout 100 python3 benchmarks/attention.py --out $OUT/grid5.json > $OUT/grid5.txt 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/grid5.txt
tail -9 $OUT/grid5.txt
SECONDS=0
timeout 85 python3 benchmarks/shapes.py --rep 50 --out $OUT/shapes5.json > $OUT/shapes5.txt 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/shapes5.txt
tail -6 $OUT/shapes5.txt
SECONDS=0
timeout 210 python3 -m pytest -m gpu -q -n 14 tests/kernels/test_attention_gpu.py > $OUT/t5.log 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/t5.log
grep -E "FAILED|ERROR" $OUT/t5.log | head -20; tail -2 $OUT/t5.log
