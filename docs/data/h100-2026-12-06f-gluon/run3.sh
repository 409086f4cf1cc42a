#!/bin/bash
# session 51: one call in place of run1.sh + run2.sh (the device came late or not at all): the D=64 forward
# defaults' realistic GPU tests, the two-CTAs-per-SM tests, the two-CTA timing on the short D=64 rows, SHAPES.md
# through the drop-in. Limits add up to 590 s. The D=256 late prefetch (docs/data/h100-2026-12-06e-gluon/next.sh) waits for another call.
cd "$(dirname "$0")/../../.."
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/env.txt 2>&1
python3 -c "import torch,triton;print(torch.__version__,triton.__version__,torch.version.cuda,torch.backends.cudnn.version())" >> $OUT/env.txt 2>&1
cat $OUT/env.txt
SECONDS=0
timeout 150 python3 -m pytest -m gpu -v -n 12 tests/kernels/test_attention_gpu.py -k "realistic and d64" \
    > $OUT/d64_tests.log 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/d64_tests.log
grep -E "FAILED|ERROR" $OUT/d64_tests.log | head -20; tail -2 $OUT/d64_tests.log
SECONDS=0
timeout 100 python3 -m pytest -m gpu -v -n 8 tests/kernels/test_gluon_persistent_gpu.py -k two_ctas > $OUT/two_tests.log 2>&1
echo "rc $? in ${SECONDS}s" >> $OUT/two_tests.log
grep -E "FAILED|ERROR" $OUT/two_tests.log | head -20; tail -2 $OUT/two_tests.log
SECONDS=0
timeout 200 python3 benchmarks/gluon_fwd.py --rows gpt2-train-512,bert-base-512,vit-l16-257 \
    --config BLOCK_N=64 --config OVERLAP=0 --config CONSUMER_REGS=104,240 --config PERSISTENT=0,1 \
    --config O_TILE=0,1 --config PINGPONG=0,1 --rounds 2 --rep 30 --out $OUT/fwd_regs.json > $OUT/fwd_regs.log 2>&1
echo "rc $? in ${SECONDS}s" >> $OUT/fwd_regs.log
tail -60 $OUT/fwd_regs.log
SECONDS=0
timeout 140 python3 benchmarks/shapes.py --rep 50 --out $OUT/shapes.json > $OUT/shapes.txt 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/shapes.txt
tail -40 $OUT/shapes.txt
