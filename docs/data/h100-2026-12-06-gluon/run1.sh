#!/bin/bash
# session 46, GPU call 1: the committed backward defaults together (STEP_COUNTERS on, POLY_EXP2 1 at D=128 without
# masking) against the float64 reference, and the Gluon WINDOW forward at D=256; the D=64 forward (Gluon default,
# persistent) with POLY_EXP2 0/1/2 (of 8) against the Triton default and cuDNN on the D=64 grid rows and
# SHAPES.md's D=64 rows; the forward's POLY_EXP2 against the reference; SHAPES.md end to end at the defaults
# (gemma2's forward now the Gluon D=256 kernel)
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $OUT/env1.txt 2>&1
python3 -c "import torch,triton;print(torch.__version__,triton.__version__,torch.version.cuda,torch.backends.cudnn.version())" >> $OUT/env1.txt 2>&1
grep -n "^STEP_COUNTERS\|^POLY_EXP2" flashtune/kernels/gluon_backward.py >> $OUT/env1.txt; cat $OUT/env1.txt
SECONDS=0
timeout 170 python3 -m pytest -m gpu -v -n 14 tests/kernels/test_gluon_bwd_gpu.py tests/kernels/test_gluon_gpu.py -k "(matches_the_reference and fused) or trains_through or d256_window or poly_exp2" > $OUT/t1.log 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/t1.log
grep -E "FAILED|ERROR" $OUT/t1.log | head -20; grep -c PASSED $OUT/t1.log; tail -2 $OUT/t1.log
R64=grid-d64-512,grid-d64-1024,grid-d64-2048,grid-d64-4096,grid-d64-8192,grid-d64-16384,gpt2-train-512,bert-base-512,vit-l16-257
SECONDS=0
timeout 130 python3 benchmarks/gluon_fwd.py --grid --rows $R64 --configs persistent --switch POLY_EXP2=0,1,2 --rounds 2 --rep 20 --out $OUT/fwd_d64.json > $OUT/fwd_d64.log 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/fwd_d64.log
tail -8 $OUT/fwd_d64.log
SECONDS=0
timeout 250 python3 benchmarks/shapes.py --rep 50 --out $OUT/shapes1.json > $OUT/shapes1.txt 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/shapes1.txt
tail -8 $OUT/shapes1.txt
