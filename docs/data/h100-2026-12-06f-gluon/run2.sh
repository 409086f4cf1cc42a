#!/bin/bash
# session 51, GPU call 2: two CTAs per SM for the Gluon forward at D=64 (CONSUMER_REGS 104: maxnreg 80, so two
# CTAs' 3 warp groups fit an SM's registers; the persistent grid launches programs_per_sm CTAs per SM) on the
# short D=64 rows of SHAPES.md, where the Triton kernel (several CTAs per SM) still beats the one-CTA Gluon kernel
cd "$(dirname "$0")/../../.."
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/env2.txt 2>&1; cat $OUT/env2.txt
SECONDS=0
timeout 120 python3 -m pytest -m gpu -v -n 8 tests/kernels/test_gluon_persistent_gpu.py -k two_ctas > $OUT/two_tests.log 2>&1
echo "rc $? in ${SECONDS}s" >> $OUT/two_tests.log
grep -E "FAILED|ERROR" $OUT/two_tests.log | head -20; tail -2 $OUT/two_tests.log
SECONDS=0
timeout 280 python3 benchmarks/gluon_fwd.py --rows gpt2-train-512,bert-base-512,vit-l16-257,whisper-enc-1500 \
    --config BLOCK_N=64 --config OVERLAP=0 --config CONSUMER_REGS=104,240 --config PERSISTENT=0,1 \
    --config O_TILE=0,1 --config PINGPONG=0,1 --rounds 2 --rep 30 --out $OUT/fwd_regs.json > $OUT/fwd_regs.log 2>&1
echo "rc $? in ${SECONDS}s" >> $OUT/fwd_regs.log
tail -80 $OUT/fwd_regs.log
