#!/bin/bash
# session 54, GPU call 2 (what the device time left after the refused starts allows, about 200 s): on an H200 the
# standard grid through the drop-in with cuDNN and FlashAttention-2 (run4.sh's second part: the acceptance's figures);
# on any other card run1.sh's first two parts: the D=64 middle band's full-call entry against the reference and
# SHAPES.md's forward through the drop-in.
cd "$(dirname "$0")/../../.."
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $OUT/env2.txt 2>&1
python3 -c "import torch,triton;print(torch.__version__,triton.__version__,torch.version.cuda,torch.backends.cudnn.version())" >> $OUT/env2.txt 2>&1
cat $OUT/env2.txt
if grep -q H200 $OUT/env2.txt; then
    SECONDS=0
    timeout 170 python3 benchmarks/attention.py --out $OUT/grid4.json > $OUT/grid4.txt 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/grid4.txt
    tail -9 $OUT/grid4.txt
    exit 0
fi
SECONDS=0
timeout 95 python3 -m pytest -m gpu -v -n 12 tests/kernels/test_attention_gpu.py tests/kernels/test_gluon_persistent_gpu.py \
    -k "(realistic and d64) or (two_ctas and reference)" > $OUT/d64_tests.log 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/d64_tests.log
grep -E "FAILED|ERROR" $OUT/d64_tests.log | head -20; tail -2 $OUT/d64_tests.log
SECONDS=0
timeout 80 python3 benchmarks/shapes.py --passes fwd --rep 30 --out $OUT/shapes_fwd.json > $OUT/shapes_fwd.txt 2>&1
echo "rc $? in ${SECONDS}s" >> $OUT/shapes_fwd.txt
grep -E "gpt2|bert|vit|whisper|geomean|rc " $OUT/shapes_fwd.txt | cut -c1-140
