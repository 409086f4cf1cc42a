#!/bin/bash
# session 47, GPU call 4: the causal D=128 cases of every search-space config and the forward's POLY_EXP2 tests
cd "$(dirname "$0")/../../.."
SECONDS=0; timeout 280 python3 -m pytest -m gpu -v -n 14 tests/kernels/test_attention_gpu.py tests/kernels/test_gluon_gpu.py -k "(every_search_space_config and d128-causal) or poly_exp2" > $OUT/t4.log 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/t4.log
