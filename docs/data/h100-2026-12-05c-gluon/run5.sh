#!/bin/bash
# session 42, GPU call 5: the Gluon GPU files after the config-field change (grid forward, backward, traces)
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/env5.txt 2>&1; cat $OUT/env5.txt
timeout 440 python3 -m pytest -m gpu -n 12 tests/kernels/test_gluon_gpu.py tests/kernels/test_gluon_bwd_gpu.py tests/kernels/test_gluon_trace_gpu.py > $OUT/t5.log 2>&1; echo "rc $?" >> $OUT/t5.log
grep -E "FAILED|ERROR|^E " $OUT/t5.log | head -30; tail -2 $OUT/t5.log
