#!/bin/bash
# session 55, GPU call 3 (about 110 s; the last of the budget after refused starts), any card: the D=64 middle band's
# full-call entry against the reference (its GPU tests: test_two_ctas_per_sm_against_the_reference, whose
# full-m64n64b2r24/104seq case is the entry, and SHAPES.md's D=64 rows through the drop-in).
cd "$(dirname "$0")/../../.."
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/env3.txt 2>&1
python3 -c "import torch,triton;print(torch.__version__,triton.__version__,torch.version.cuda,torch.backends.cudnn.version())" >> $OUT/env3.txt 2>&1
cat $OUT/env3.txt
SECONDS=0
timeout 100 python3 -m pytest -m gpu -v -n 12 tests/kernels/test_attention_gpu.py tests/kernels/test_gluon_persistent_gpu.py \
    -k "(realistic and d64) or (two_ctas and reference)" > $OUT/d64_tests.log 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/d64_tests.log
grep -E "FAILED|ERROR" $OUT/d64_tests.log | head -20; tail -2 $OUT/d64_tests.log
