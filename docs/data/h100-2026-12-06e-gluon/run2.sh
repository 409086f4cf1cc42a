#!/bin/bash
# session 50, GPU call 2: with the D=256 Gluon backward opened to BwdConfig (gluon_backward.WIDE_HEAD_DIM on,
# PREFETCH off, the (bf16, 256, "long") table entry family 3): its GPU tests; the kernel against the Triton
# default, cuDNN and FlashAttention-2 at 512-4k queries (where it starts to win: the long bound at D=256);
# SHAPES.md's gemma2 row (and its D=128 neighbours) through the drop-in beside SDPA's backends
cd "$(dirname "$0")/../../.."
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $OUT/env2.txt 2>&1
python3 -c "import torch,triton;print(torch.__version__,triton.__version__,torch.version.cuda,torch.backends.cudnn.version())" >> $OUT/env2.txt 2>&1
cat $OUT/env2.txt
SECONDS=0
timeout 150 python3 benchmarks/gluon_bwd.py --rows 16x16x512-d256,8x16x1k-d256,4x16x2k-d256,2x16x4k-d256 \
    --buffers 2,3 --rounds 2 --rep 30 --out $OUT/bwd_len.json > $OUT/bwd_len.log 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/bwd_len.log
tail -16 $OUT/bwd_len.log
SECONDS=0
timeout 150 python3 benchmarks/shapes.py --rows gemma2-d256-train-4k --rep 50 --out $OUT/shapes_gemma2.json > $OUT/shapes_gemma2.txt 2>&1
echo "rc $? in ${SECONDS}s" >> $OUT/shapes_gemma2.txt
tail -12 $OUT/shapes_gemma2.txt
SECONDS=0
timeout 200 python3 -m pytest -m gpu -v -n 12 tests/kernels/test_gluon_bwd_wide_gpu.py tests/kernels/test_attention_gpu.py > $OUT/tests2.log 2>&1
echo "rc $? in ${SECONDS}s" >> $OUT/tests2.log
grep -E "FAILED|ERROR" $OUT/tests2.log | head -20; tail -2 $OUT/tests2.log
