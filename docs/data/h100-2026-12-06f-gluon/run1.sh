#!/bin/bash
# session 51, GPU call 1: on an H200, the issue's acceptance first (session 48's run4.sh), then the D=64 realistic
# GPU tests; on any other card, session 50's next.sh (D=64 defaults' GPU tests, the D=256 late prefetch's test and
# timing, SHAPES.md through the drop-in)
cd "$(dirname "$0")/../../.."
if nvidia-smi --query-gpu=name --format=csv | grep -q H200; then
    bash docs/data/h100-2026-12-06c-gluon/run4.sh
    SECONDS=0
    timeout 200 python3 -m pytest -m gpu -v -n 12 tests/kernels/test_attention_gpu.py -k "realistic and d64" \
        > $OUT/d64_tests.log 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/d64_tests.log
    grep -E "FAILED|ERROR" $OUT/d64_tests.log | head -20; tail -2 $OUT/d64_tests.log
else
    bash docs/data/h100-2026-12-06e-gluon/next.sh
fi
