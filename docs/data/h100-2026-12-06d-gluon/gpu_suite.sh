#!/bin/bash
# the whole `pytest -m gpu` suite in three shards of one GPU call each (about 200-300 s each at -n 14):
#   bash docs/data/h100-2026-12-06d-gluon/gpu_suite.sh 1|2|3   (run from scratch/ in the session, the same text)
cd "$(dirname "$0")/../../.."
case "$1" in
  1) FILES="tests/kernels/test_gluon_bwd_gpu.py tests/kernels/test_launch_plans.py";;
  2) FILES="tests/kernels/test_gluon_gpu.py tests/kernels/test_gluon_persistent_gpu.py tests/kernels/test_gluon_trace_gpu.py tests/kernels/test_decode_gpu.py";;
  3) FILES="tests --ignore=tests/kernels/test_gluon_bwd_gpu.py --ignore=tests/kernels/test_launch_plans.py --ignore=tests/kernels/test_gluon_gpu.py --ignore=tests/kernels/test_gluon_persistent_gpu.py --ignore=tests/kernels/test_gluon_trace_gpu.py --ignore=tests/kernels/test_decode_gpu.py";;
esac
SECONDS=0
timeout 540 python3 -m pytest -m gpu -q -n 14 $FILES > $OUT/suite$1.log 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/suite$1.log
grep -E "FAILED|ERROR" $OUT/suite$1.log | head -30; tail -3 $OUT/suite$1.log
