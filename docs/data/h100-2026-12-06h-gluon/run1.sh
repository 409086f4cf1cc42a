#!/bin/bash
# session 53, GPU call 1: on an H200 the issue's acceptance first (session 48's run4.sh, with session 52's D=64 bands),
# then DQ_SCALE_AT_CAST (gluon_backward: the fused dQ shares unscaled, the cast scales their sum; written this
# session without a GPU): its GPU test against the reference and its timing on the 12 D=128 grid rows. On any other
# card: the same test and timing; the D=256 late prefetch (session 50's gluon_backward_wide PREFETCH=2, written
# without a GPU): its bit-for-bit test and its timing beside off and early; the middle D=64 band's full-call entry
# without ping-pong (bert-base-512 0.981 against 0.956 in session 51) on the band's full rows;
# mistral-7b-train-2k's backward by dK/dV split.
cd "$(dirname "$0")/../../.."
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $OUT/env.txt 2>&1
python3 -c "import torch,triton;print(torch.__version__,triton.__version__,torch.version.cuda,torch.backends.cudnn.version())" >> $OUT/env.txt 2>&1
cat $OUT/env.txt
if grep -q H200 $OUT/env.txt; then
    bash docs/data/h100-2026-12-06c-gluon/run4.sh
    SECONDS=0
    timeout 100 python3 -m pytest -m gpu -v -n 8 tests/kernels/test_gluon_bwd_gpu.py -k "numeric_switches and DQ_SCALE" \
        > $OUT/cast_tests.log 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/cast_tests.log
    grep -E "FAILED|ERROR" $OUT/cast_tests.log | head -20; tail -2 $OUT/cast_tests.log
    SECONDS=0
    G=grid-d128-512,grid-d128-1024,grid-d128-2048,grid-d128-4096,grid-d128-8192,grid-d128-16384
    timeout 110 python3 benchmarks/gluon_bwd.py --grid --rows $G --gluon default --switch DQ_SCALE_AT_CAST=0,1 --rounds 3 \
        --rep 30 --out $OUT/bwd_cast.json > $OUT/bwd_cast.log 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/bwd_cast.log
    tail -16 $OUT/bwd_cast.log | cut -c1-250
    exit 0
fi
SECONDS=0
timeout 100 python3 -m pytest -m gpu -v -n 8 tests/kernels/test_gluon_bwd_gpu.py -k "numeric_switches and DQ_SCALE" \
    > $OUT/cast_tests.log 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/cast_tests.log
grep -E "FAILED|ERROR" $OUT/cast_tests.log | head -20; tail -2 $OUT/cast_tests.log
SECONDS=0
G=grid-d128-512,grid-d128-1024,grid-d128-2048,grid-d128-4096,grid-d128-8192,grid-d128-16384
timeout 110 python3 benchmarks/gluon_bwd.py --grid --rows $G --gluon default --switch DQ_SCALE_AT_CAST=0,1 --rounds 3 \
    --rep 30 --out $OUT/bwd_cast.json > $OUT/bwd_cast.log 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/bwd_cast.log
tail -16 $OUT/bwd_cast.log | cut -c1-250
SECONDS=0
timeout 90 python3 -m pytest -m gpu -v -n 8 tests/kernels/test_gluon_bwd_wide_gpu.py -k prefetch > $OUT/prefetch_tests.log 2>&1
echo "rc $? in ${SECONDS}s" >> $OUT/prefetch_tests.log
grep -E "FAILED|ERROR" $OUT/prefetch_tests.log | head -20; tail -2 $OUT/prefetch_tests.log
SECONDS=0
timeout 90 python3 benchmarks/gluon_bwd.py --rows gemma2-d256-train-4k,2x16x4k-d256 --prefetch all --buffers 2,3 \
    --rounds 2 --rep 30 --out $OUT/bwd_prefetch.json > $OUT/bwd_prefetch.log 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/bwd_prefetch.log
tail -14 $OUT/bwd_prefetch.log | cut -c1-220
SECONDS=0
timeout 80 python3 benchmarks/gluon_fwd.py --rows bert-base-512,vit-l16-257,whisper-enc-1500 --shape 32,32,32,512,512,64,full \
    --shape 16,32,32,1024,1024,64,full --shape 8,32,32,2048,2048,64,full \
    --config BLOCK_N=64 --config OVERLAP=0 --config CONSUMER_REGS=104 --config PERSISTENT=0 --config PINGPONG=0,1 \
    --config NUM_BUFFERS=2,3 --rounds 2 --rep 30 --out $OUT/fwd_pp.json > $OUT/fwd_pp.log 2>&1
echo "rc $? in ${SECONDS}s" >> $OUT/fwd_pp.log
grep -v invalid $OUT/fwd_pp.log | cut -c1-300 | tail -24
SECONDS=0
timeout 70 python3 benchmarks/gluon_bwd.py --rows mistral-7b-train-2k --gluon fused --dq-first both --splits 0,1,2,4 \
    --rounds 2 --rep 30 --out $OUT/bwd_mistral.json > $OUT/bwd_mistral.log 2>&1
echo "rc $? in ${SECONDS}s" >> $OUT/bwd_mistral.log
tail -8 $OUT/bwd_mistral.log | cut -c1-300
