#!/bin/bash
# session 53, GPU call 3 (what the session's device time still allows, about 300 s): on an H200 the issue's acceptance
# without its kernel-level backward variants (the standard grid through the drop-in with cuDNN and FlashAttention-2,
# then SHAPES.md through the drop-in: run4.sh's second and third parts); on any other card the D=64 middle band's new
# full-call entry (no ping-pong): its GPU tests and SHAPES.md's forward through the drop-in.
cd "$(dirname "$0")/../../.."
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $OUT/env3.txt 2>&1
python3 -c "import torch,triton;print(torch.__version__,triton.__version__,torch.version.cuda,torch.backends.cudnn.version())" >> $OUT/env3.txt 2>&1
cat $OUT/env3.txt
if grep -q H200 $OUT/env3.txt; then
    SECONDS=0
    timeout 130 python3 benchmarks/attention.py --out $OUT/grid4.json > $OUT/grid4.txt 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/grid4.txt
    tail -9 $OUT/grid4.txt
    SECONDS=0
    timeout 100 python3 benchmarks/shapes.py --rep 50 --out $OUT/shapes4.json > $OUT/shapes4.txt 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/shapes4.txt
    tail -6 $OUT/shapes4.txt
    exit 0
fi
SECONDS=0
timeout 100 python3 -m pytest -m gpu -v -n 12 tests/kernels/test_attention_gpu.py tests/kernels/test_gluon_persistent_gpu.py \
    -k "(realistic and d64) or (two_ctas and reference)" > $OUT/d64_tests.log 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/d64_tests.log
grep -E "FAILED|ERROR" $OUT/d64_tests.log | head -20; tail -2 $OUT/d64_tests.log
SECONDS=0
timeout 90 python3 benchmarks/shapes.py --passes fwd --rep 40 --out $OUT/shapes_fwd.json > $OUT/shapes_fwd.txt 2>&1
echo "rc $? in ${SECONDS}s" >> $OUT/shapes_fwd.txt
grep -E "gpt2|bert|vit|whisper|geomean" $OUT/shapes_fwd.txt | cut -c1-140
