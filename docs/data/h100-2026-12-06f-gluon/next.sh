#!/bin/bash
# written in session 50 (2026-12-06) for the next session's first GPU call, not run here (device time spent):
# the D=64 forward defaults moved this session (full: the Gluon persistent kernel with O tiles from 512 queries;
# causal: 64x64 w4 s3 below 2048 queries) without a run of their GPU tests or of SHAPES.md through the drop-in; and
# the D=256 backward's late prefetch (gluon_backward_wide.PREFETCH=2) was written without a GPU: its bit-for-bit
# GPU test, then timed beside off and early.
# Its limits add up to 550 s (one call). Run by run1.sh of this folder on a card other than an H200.
cd "$(dirname "$0")/../../.."
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/env.txt 2>&1
python3 -c "import torch,triton;print(torch.__version__,triton.__version__,torch.version.cuda,torch.backends.cudnn.version())" >> $OUT/env.txt 2>&1
cat $OUT/env.txt
SECONDS=0
timeout 180 python3 -m pytest -m gpu -v -n 12 tests/kernels/test_attention_gpu.py -k "realistic and d64" \
    > $OUT/d64_tests.log 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/d64_tests.log
grep -E "FAILED|ERROR" $OUT/d64_tests.log | head -20; tail -2 $OUT/d64_tests.log
SECONDS=0
timeout 110 python3 -m pytest -m gpu -v -n 8 tests/kernels/test_gluon_bwd_wide_gpu.py -k prefetch > $OUT/prefetch_tests.log 2>&1
echo "rc $? in ${SECONDS}s" >> $OUT/prefetch_tests.log
grep -E "FAILED|ERROR" $OUT/prefetch_tests.log | head -20; tail -2 $OUT/prefetch_tests.log
SECONDS=0
timeout 110 python3 benchmarks/gluon_bwd.py --rows gemma2-d256-train-4k,2x16x4k-d256 --prefetch all --buffers 2,3 \
    --rounds 2 --rep 30 --out $OUT/bwd_prefetch.json > $OUT/bwd_prefetch.log 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/bwd_prefetch.log
tail -12 $OUT/bwd_prefetch.log
SECONDS=0
timeout 150 python3 benchmarks/shapes.py --rep 50 --out $OUT/shapes.json > $OUT/shapes.txt 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/shapes.txt
tail -50 $OUT/shapes.txt
