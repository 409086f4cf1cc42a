#!/bin/bash
# session 52's GPU call (one: the device time left after refused starts holds one). The D=64 forward's three bands
# (config.py: two CTAs per SM from 256 queries, the one-CTA Gluon kernel from 4096) through the drop-in.
# On an H200: the issue's acceptance (session 48's run4.sh: the fused backward's grid rows, the standard grid with the
# new D=64 defaults, SHAPES.md), then the D=64 realistic GPU tests (and two CTAs per SM against the reference). On any other card: those tests,
# the D=64 grid's forward through the drop-in (benchmarks/attention.py, each row checked against cuDNN first),
# SHAPES.md's forward rows, then the middle band's configs on short and small-batch calls (gluon_fwd.py --shape).
cd "$(dirname "$0")/../../.."
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $OUT/env.txt 2>&1
python3 -c "import torch,triton;print(torch.__version__,triton.__version__,torch.version.cuda,torch.backends.cudnn.version())" >> $OUT/env.txt 2>&1
cat $OUT/env.txt
tests() {
    SECONDS=0
    timeout $1 python3 -m pytest -m gpu -v -n 12 tests/kernels/test_attention_gpu.py tests/kernels/test_gluon_persistent_gpu.py \
        -k "(realistic and d64) or (two_ctas and reference)" \
        > $OUT/d64_tests.log 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/d64_tests.log
    grep -E "FAILED|ERROR" $OUT/d64_tests.log | head -20; tail -2 $OUT/d64_tests.log
}
if grep -q H200 $OUT/env.txt; then
    bash docs/data/h100-2026-12-06c-gluon/run4.sh
    tests 150
    exit 0
fi
tests 140
SECONDS=0
timeout 140 python3 benchmarks/attention.py --head-dims 64 --passes fwd --rounds 2 --rep 40 --out $OUT/grid_d64.json \
    > $OUT/grid_d64.txt 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/grid_d64.txt
tail -20 $OUT/grid_d64.txt
SECONDS=0
timeout 130 python3 benchmarks/shapes.py --passes fwd --rep 40 --out $OUT/shapes_fwd.json > $OUT/shapes_fwd.txt 2>&1
echo "rc $? in ${SECONDS}s" >> $OUT/shapes_fwd.txt
tail -28 $OUT/shapes_fwd.txt
SECONDS=0
timeout 120 python3 benchmarks/gluon_fwd.py --shape 32,12,12,128,128,64 --shape 32,12,12,197,197,64,full \
    --shape 1,32,32,256,256,64 --shape 1,12,12,512,512,64 --shape 1,12,12,2048,2048,64 \
    --config BLOCK_N=64 --config OVERLAP=0 --config CONSUMER_REGS=104 --config PERSISTENT=0,1 --config O_TILE=0,1 \
    --rounds 2 --rep 20 --out $OUT/fwd_short.json > $OUT/fwd_short.log 2>&1
echo "rc $? in ${SECONDS}s" >> $OUT/fwd_short.log
grep -v invalid $OUT/fwd_short.log | tail -24
