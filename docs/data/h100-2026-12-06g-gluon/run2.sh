#!/bin/bash
# session 52, GPU call 2: on an H200 the issue's acceptance (session 48's run4.sh, with this session's D=64 bands);
# on any other card the final D=64 defaults (from 192 queries, causal calls by their tiles): their GPU tests and
# SHAPES.md's forward rows through the drop-in.
cd "$(dirname "$0")/../../.."
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $OUT/env2.txt 2>&1
python3 -c "import torch,triton;print(torch.__version__,triton.__version__,torch.version.cuda,torch.backends.cudnn.version())" >> $OUT/env2.txt 2>&1
cat $OUT/env2.txt
if grep -q H200 $OUT/env2.txt; then
    bash docs/data/h100-2026-12-06c-gluon/run4.sh
    exit 0
fi
SECONDS=0
timeout 140 python3 -m pytest -m gpu -v -n 12 tests/kernels/test_attention_gpu.py -k "realistic and d64" \
    > $OUT/d64_tests2.log 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/d64_tests2.log
grep -E "FAILED|ERROR" $OUT/d64_tests2.log | head -20; tail -2 $OUT/d64_tests2.log
SECONDS=0
timeout 120 python3 benchmarks/shapes.py --passes fwd --rep 40 --out $OUT/shapes_fwd2.json > $OUT/shapes_fwd2.txt 2>&1
echo "rc $? in ${SECONDS}s" >> $OUT/shapes_fwd2.txt
grep -E "gpt2|bert|vit|whisper|geomean" $OUT/shapes_fwd2.txt | cut -c1-140
