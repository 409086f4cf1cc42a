#!/bin/bash
# written in session 49 (2026-12-06) for the next session's first GPU call, not run here (no device time left):
# the D=256 Gluon backward (flashtune/kernels/gluon_backward_wide.py) through its GPU tests, then timed on
# gemma2-d256-train-4k and a 2x16x4k D=256 shape against the Triton kernel, cuDNN and FlashAttention-2,
# PREFETCH off and on, 2 and 3 Q/dO slots. Copy it into the session's own docs/data folder to run it.
cd "$(dirname "$0")/../../.."
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $OUT/env.txt 2>&1
python3 -c "import torch,triton;print(torch.__version__,triton.__version__,torch.version.cuda,torch.backends.cudnn.version())" >> $OUT/env.txt 2>&1
cat $OUT/env.txt
SECONDS=0
timeout 300 python3 -m pytest -m gpu -v -n 8 tests/kernels/test_gluon_bwd_wide_gpu.py > $OUT/wide_tests.log 2>&1
echo "rc $? in ${SECONDS}s" >> $OUT/wide_tests.log
grep -E "FAILED|ERROR" $OUT/wide_tests.log | head -20; tail -2 $OUT/wide_tests.log
SECONDS=0
timeout 200 python3 benchmarks/gluon_bwd.py --rows gemma2-d256-train-4k,2x16x4k-d256 --prefetch both --buffers 2,3 \
    --rounds 2 --rep 30 --out $OUT/bwd_d256.json > $OUT/bwd_d256.log 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/bwd_d256.log
tail -25 $OUT/bwd_d256.log
