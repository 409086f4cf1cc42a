#!/bin/bash
# session 53, GPU call 2: on an H200 the issue's acceptance (session 48's run4.sh) with this session's D=64 middle-band
# entry without masking (no ping-pong, from run1's fwd_pp.log), then that entry's GPU tests. On any other card: the
# entry's GPU tests (the two-CTA grid kernel without ping-pong against the reference; SHAPES.md's D=64 rows through
# the drop-in), the D=64 grid's forward and SHAPES.md's forward through the drop-in.
cd "$(dirname "$0")/../../.."
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $OUT/env2.txt 2>&1
python3 -c "import torch,triton;print(torch.__version__,triton.__version__,torch.version.cuda,torch.backends.cudnn.version())" >> $OUT/env2.txt 2>&1
cat $OUT/env2.txt
LIMIT=110
if grep -q H200 $OUT/env2.txt; then
    bash docs/data/h100-2026-12-06c-gluon/run4.sh
    LIMIT=50  # what the session's device time leaves
fi
SECONDS=0
timeout $LIMIT python3 -m pytest -m gpu -v -n 12 tests/kernels/test_attention_gpu.py tests/kernels/test_gluon_persistent_gpu.py \
    -k "(realistic and d64) or (two_ctas and reference)" > $OUT/d64_tests.log 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/d64_tests.log
grep -E "FAILED|ERROR" $OUT/d64_tests.log | head -20; tail -2 $OUT/d64_tests.log
grep -q H200 $OUT/env2.txt && exit 0
SECONDS=0
timeout 120 python3 benchmarks/attention.py --head-dims 64 --passes fwd --rounds 2 --rep 40 --out $OUT/grid_d64.json \
    > $OUT/grid_d64.txt 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/grid_d64.txt
tail -16 $OUT/grid_d64.txt | cut -c1-160
SECONDS=0
timeout 120 python3 benchmarks/shapes.py --passes fwd --rep 40 --out $OUT/shapes_fwd.json > $OUT/shapes_fwd.txt 2>&1
echo "rc $? in ${SECONDS}s" >> $OUT/shapes_fwd.txt
grep -E "gpt2|bert|vit|whisper|geomean" $OUT/shapes_fwd.txt | cut -c1-140
