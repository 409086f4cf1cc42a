#!/bin/bash
# session 54, GPU call 1: on an H200 the issue's acceptance (session 48's run4.sh: the fused backward over the 12 D=128
# grid rows, the standard grid through the drop-in with cuDNN and FlashAttention-2, SHAPES.md through the drop-in),
# then the D=64 middle band's new full-call entry (no ping-pong, session 53) against the reference. On any other card:
# that entry's GPU tests, SHAPES.md's forward through the drop-in, and the causal middle band: its entry (two CTAs an
# SM, persistent, O tiles) with and without ping-pong beside the one-CTA Gluon default and the Triton default on causal
# D=64 calls from 0.7 to 11.6 tiles of 128 rows an SM (MID_MIN_TILES_PER_SM_CAUSAL, 4, lies between, unmeasured).
# The D=64 long entry (one CTA an SM, 64x128, 3 slots, persistent, O tiles) on the low-fill causal calls.
# Then the persistent dK/dV walk (GluonBwdConfig.PERSISTENT, slower at D=128) on the short D=64 rows, the fused
# backward a step late and its share first (the D=64 full default) and in its step, with and without the walk.
cd "$(dirname "$0")/../../.."
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $OUT/env1.txt 2>&1
python3 -c "import torch,triton;print(torch.__version__,triton.__version__,torch.version.cuda,torch.backends.cudnn.version())" >> $OUT/env1.txt 2>&1
cat $OUT/env1.txt
LIMIT=100
if grep -q H200 $OUT/env1.txt; then
    bash docs/data/h100-2026-12-06c-gluon/run4.sh
    LIMIT=80
fi
SECONDS=0
timeout $LIMIT python3 -m pytest -m gpu -v -n 12 tests/kernels/test_attention_gpu.py tests/kernels/test_gluon_persistent_gpu.py \
    -k "(realistic and d64) or (two_ctas and reference)" > $OUT/d64_tests.log 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/d64_tests.log
grep -E "FAILED|ERROR" $OUT/d64_tests.log | head -20; tail -2 $OUT/d64_tests.log
grep -q H200 $OUT/env1.txt && exit 0
SECONDS=0
timeout 90 python3 benchmarks/shapes.py --passes fwd --rep 40 --out $OUT/shapes_fwd.json > $OUT/shapes_fwd.txt 2>&1
echo "rc $? in ${SECONDS}s" >> $OUT/shapes_fwd.txt
grep -E "gpt2|bert|vit|whisper|geomean|rc " $OUT/shapes_fwd.txt | cut -c1-140
SECONDS=0
timeout 130 python3 benchmarks/gluon_fwd.py --shape 32,12,12,512,512,64,causal --shape 4,12,12,512,512,64,causal \
    --shape 8,12,12,512,512,64,causal --shape 16,12,12,512,512,64,causal --shape 1,32,32,2048,2048,64,causal \
    --shape 2,32,32,2048,2048,64,causal --shape 1,12,12,1024,1024,64,causal --shape 1,32,32,1024,1024,64,causal \
    --shape 1,12,12,2048,2048,64,causal --shape 16,32,32,1024,1024,64,causal --shape 8,32,32,2048,2048,64,causal \
    --config BLOCK_N=64 --config OVERLAP=0 --config CONSUMER_REGS=104 --config PERSISTENT=1 --config O_TILE=1 \
    --config PINGPONG=0,1 --rounds 2 --rep 25 --out $OUT/fwd_causal_mid.json > $OUT/fwd_causal_mid.log 2>&1
echo "rc $? in ${SECONDS}s" >> $OUT/fwd_causal_mid.log
grep -v invalid $OUT/fwd_causal_mid.log | cut -c1-200 | tail -30
SECONDS=0
timeout 60 python3 benchmarks/gluon_fwd.py --shape 4,12,12,512,512,64,causal --shape 8,12,12,512,512,64,causal \
    --shape 1,12,12,1024,1024,64,causal --shape 1,32,32,1024,1024,64,causal --shape 1,12,12,2048,2048,64,causal \
    --shape 1,32,32,2048,2048,64,causal --config NUM_BUFFERS=3 --config PINGPONG=0 --config OVERLAP=1 --config PERSISTENT=1 \
    --config O_TILE=1 --rounds 2 --rep 25 --out $OUT/fwd_causal_long.json > $OUT/fwd_causal_long.log 2>&1
echo "rc $? in ${SECONDS}s" >> $OUT/fwd_causal_long.log
grep -v invalid $OUT/fwd_causal_long.log | cut -c1-200 | tail -16
SECONDS=0
timeout 100 python3 benchmarks/gluon_bwd.py --grid --rows grid-d64-512,grid-d64-1024,bert-base-512,vit-l16-257,gpt2-train-512 \
    --gluon fused --dq-first on --persistent both --rounds 2 --rep 25 --out $OUT/bwd_d64_persistent.json \
    > $OUT/bwd_d64_persistent.log 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/bwd_d64_persistent.log
grep -v invalid $OUT/bwd_d64_persistent.log | cut -c1-220 | tail -22
