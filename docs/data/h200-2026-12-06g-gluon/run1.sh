#!/bin/bash
# session 52, GPU call 1: on an H200 the issue's acceptance (session 48's run4.sh, current defaults); on any card the
# two-CTA forward (occupancy 2) beside the one-CTA and Triton defaults on calls shorter than SHAPES.md's (the middle
# band's lower bound: 77 to 256 queries; calls of one sequence that fill few SMs); on any other card than an H200 session 50's D=256 late prefetch (its GPU
# test, then its timing).
cd "$(dirname "$0")/../../.."
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $OUT/env.txt 2>&1
python3 -c "import torch,triton;print(torch.__version__,triton.__version__,torch.version.cuda,torch.backends.cudnn.version())" >> $OUT/env.txt 2>&1
cat $OUT/env.txt
if grep -q H200 $OUT/env.txt; then
    bash docs/data/h100-2026-12-06c-gluon/run4.sh
fi
SECONDS=0
timeout 180 python3 benchmarks/gluon_fwd.py --rows vit-l16-257 --shape 32,12,12,128,128,64 --shape 32,12,12,197,197,64,full \
    --shape 32,12,12,256,256,64 --shape 64,8,8,77,77,64,full --shape 1,32,32,256,256,64 --shape 1,12,12,512,512,64 \
    --shape 1,12,12,2048,2048,64 \
    --config BLOCK_N=64 --config OVERLAP=0 --config CONSUMER_REGS=104 --config PINGPONG=0,1 --config PERSISTENT=0,1 \
    --config O_TILE=0,1 --rounds 2 --rep 25 --out $OUT/fwd_short.json > $OUT/fwd_short.log 2>&1
echo "rc $? in ${SECONDS}s" >> $OUT/fwd_short.log
grep -v invalid $OUT/fwd_short.log | tail -40
grep -q H200 $OUT/env.txt && exit 0
SECONDS=0
timeout 110 python3 -m pytest -m gpu -v -n 8 tests/kernels/test_gluon_bwd_wide_gpu.py -k prefetch > $OUT/prefetch_tests.log 2>&1
echo "rc $? in ${SECONDS}s" >> $OUT/prefetch_tests.log
grep -E "FAILED|ERROR" $OUT/prefetch_tests.log | head -20; tail -2 $OUT/prefetch_tests.log
SECONDS=0
timeout 110 python3 benchmarks/gluon_bwd.py --rows gemma2-d256-train-4k,2x16x4k-d256 --prefetch all --buffers 2,3 \
    --rounds 2 --rep 30 --out $OUT/bwd_prefetch.json > $OUT/bwd_prefetch.log 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/bwd_prefetch.log
tail -12 $OUT/bwd_prefetch.log
