#!/bin/bash
# session 55, GPU call 1 (about 340 s; what the budget allows after refused starts): on an H200 the issue's
# acceptance (session 48's run4.sh). On any other card session 54's run1.sh without its SHAPES.md forward and its
# D=64 backward walk: the D=64 middle band's full-call entry against the reference (its GPU tests), then the causal
# middle band's entry with and without ping-pong beside the one-CTA Gluon default and the Triton causal entry on
# causal D=64 calls from 0.7 to 11.6 tiles of 128 rows an SM, and the D=64 long entry on the low-fill ones.
# Arguments: the parts to run on any card (tests, mid, long; run2.sh and run3.sh pass theirs); none: all three, and
# on an H200 the acceptance in their place.
cd "$(dirname "$0")/../../.."
if [ $# -eq 0 ]; then
    nvidia-smi --query-gpu=name --format=csv | grep -q H200 && exec bash docs/data/h100-2026-12-06c-gluon/run4.sh
    set -- tests mid long
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $OUT/env1.txt 2>&1
python3 -c "import torch,triton;print(torch.__version__,triton.__version__,torch.version.cuda,torch.backends.cudnn.version())" >> $OUT/env1.txt 2>&1
cat $OUT/env1.txt
for PART in "$@"; do case $PART in
tests)
SECONDS=0
timeout 100 python3 -m pytest -m gpu -v -n 12 tests/kernels/test_attention_gpu.py tests/kernels/test_gluon_persistent_gpu.py \
    -k "(realistic and d64) or (two_ctas and reference)" > $OUT/d64_tests.log 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/d64_tests.log
grep -E "FAILED|ERROR" $OUT/d64_tests.log | head -20; tail -2 $OUT/d64_tests.log
;;
mid)
SECONDS=0
timeout 130 python3 benchmarks/gluon_fwd.py --shape 32,12,12,512,512,64,causal --shape 4,12,12,512,512,64,causal \
    --shape 8,12,12,512,512,64,causal --shape 16,12,12,512,512,64,causal --shape 1,32,32,2048,2048,64,causal \
    --shape 2,32,32,2048,2048,64,causal --shape 1,12,12,1024,1024,64,causal --shape 1,32,32,1024,1024,64,causal \
    --shape 1,12,12,2048,2048,64,causal --shape 16,32,32,1024,1024,64,causal --shape 8,32,32,2048,2048,64,causal \
    --config BLOCK_N=64 --config OVERLAP=0 --config CONSUMER_REGS=104 --config PERSISTENT=1 --config O_TILE=1 \
    --config PINGPONG=0,1 --rounds 2 --rep 25 --out $OUT/fwd_causal_mid.json > $OUT/fwd_causal_mid.log 2>&1
echo "rc $? in ${SECONDS}s" >> $OUT/fwd_causal_mid.log
grep -v invalid $OUT/fwd_causal_mid.log | cut -c1-200 | tail -30
;;
long)
SECONDS=0
timeout 60 python3 benchmarks/gluon_fwd.py --shape 4,12,12,512,512,64,causal --shape 8,12,12,512,512,64,causal \
    --shape 1,12,12,1024,1024,64,causal --shape 1,32,32,1024,1024,64,causal --shape 1,12,12,2048,2048,64,causal \
    --shape 1,32,32,2048,2048,64,causal --config NUM_BUFFERS=3 --config PINGPONG=0 --config OVERLAP=1 --config PERSISTENT=1 \
    --config O_TILE=1 --rounds 2 --rep 25 --out $OUT/fwd_causal_long.json > $OUT/fwd_causal_long.log 2>&1
echo "rc $? in ${SECONDS}s" >> $OUT/fwd_causal_long.log
grep -v invalid $OUT/fwd_causal_long.log | cut -c1-200 | tail -16
;;
*) echo "unknown part: $PART (expected tests, mid or long)"; exit 2;;
esac; done
