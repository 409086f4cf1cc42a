#!/bin/bash
# session 53, GPU call 1: on an H200 the issue's acceptance first (session 48's run4.sh, with session 52's D=64 bands),
# then the D=256 late prefetch's bit test. On any other card: the late prefetch (session 50's gluon_backward_wide
# PREFETCH=2, written without a GPU): its bit-for-bit test and its timing beside off and early; the middle D=64 band's
# full-call entry without ping-pong (bert-base-512 0.981 against 0.956 in session 51) on the band's full rows; the D=64
# backward's fused variants on the full rows under 1.0x (bert-base-512, vit-l16-257); mistral-7b-train-2k's backward by dK/dV split.
cd "$(dirname "$0")/../../.."
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $OUT/env.txt 2>&1
python3 -c "import torch,triton;print(torch.__version__,triton.__version__,torch.version.cuda,torch.backends.cudnn.version())" >> $OUT/env.txt 2>&1
cat $OUT/env.txt
if grep -q H200 $OUT/env.txt; then
    bash docs/data/h100-2026-12-06c-gluon/run4.sh
    SECONDS=0
    timeout 110 python3 -m pytest -m gpu -v -n 8 tests/kernels/test_gluon_bwd_wide_gpu.py -k prefetch > $OUT/prefetch_tests.log 2>&1
    echo "rc $? in ${SECONDS}s" >> $OUT/prefetch_tests.log
    grep -E "FAILED|ERROR" $OUT/prefetch_tests.log | head -20; tail -2 $OUT/prefetch_tests.log
    exit 0
fi
SECONDS=0
timeout 110 python3 -m pytest -m gpu -v -n 8 tests/kernels/test_gluon_bwd_wide_gpu.py -k prefetch > $OUT/prefetch_tests.log 2>&1
echo "rc $? in ${SECONDS}s" >> $OUT/prefetch_tests.log
grep -E "FAILED|ERROR" $OUT/prefetch_tests.log | head -20; tail -2 $OUT/prefetch_tests.log
SECONDS=0
timeout 100 python3 benchmarks/gluon_bwd.py --rows gemma2-d256-train-4k,2x16x4k-d256 --prefetch all --buffers 2,3 \
    --rounds 2 --rep 30 --out $OUT/bwd_prefetch.json > $OUT/bwd_prefetch.log 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/bwd_prefetch.log
tail -14 $OUT/bwd_prefetch.log | cut -c1-220
SECONDS=0
timeout 100 python3 benchmarks/gluon_fwd.py --grid --rows grid-d64-512,grid-d64-1024,grid-d64-2048,bert-base-512,vit-l16-257,whisper-enc-1500 \
    --config BLOCK_N=64 --config OVERLAP=0 --config CONSUMER_REGS=104 --config PERSISTENT=0 --config PINGPONG=0,1 \
    --config NUM_BUFFERS=2,3 --rounds 2 --rep 30 --out $OUT/fwd_pp.json > $OUT/fwd_pp.log 2>&1
echo "rc $? in ${SECONDS}s" >> $OUT/fwd_pp.log
grep -v invalid $OUT/fwd_pp.log | cut -c1-300 | tail -24
SECONDS=0
timeout 120 python3 benchmarks/gluon_bwd.py --rows bert-base-512,vit-l16-257 --shape 32,32,32,512,512,64,full --shape 16,32,32,1024,1024,64,full --gluon fused \
    --dq-first both --persistent both --buffers 2,3 --rounds 2 --rep 30 --out $OUT/bwd_d64.json > $OUT/bwd_d64.log 2>&1
echo "rc $? in ${SECONDS}s" >> $OUT/bwd_d64.log
tail -16 $OUT/bwd_d64.log | cut -c1-300
SECONDS=0
timeout 80 python3 benchmarks/gluon_bwd.py --rows mistral-7b-train-2k --gluon fused --dq-first both --splits 0,1,2,4 \
    --rounds 2 --rep 30 --out $OUT/bwd_mistral.json > $OUT/bwd_mistral.log 2>&1
echo "rc $? in ${SECONDS}s" >> $OUT/bwd_mistral.log
tail -8 $OUT/bwd_mistral.log | cut -c1-300
