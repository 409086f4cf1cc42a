#!/bin/bash
# session 56, GPU call 2 (H200): the D=64 entries' GPU tests (call 1's stopped at 80 s, 80 % through, none failed),
# then the kernels' own instrumentation on the rows of call 1 under the goals: the forward's grid-d128-512/1024 at the
# default, with the persistent grid and O tiles (the drop-in's default there), and that with 64-key blocks in 3 slots
# (the short causal entry family_defaults times); the backward's grid-d128-4096/8192 with the share first and late.
# Then bert-base-512's backward (0.708x cuDNN through the drop-in in call 1, its rounds 0.33-0.38 ms against 0.24):
# the fused variants beside the Triton default (gluon_bwd.py), and the drop-in again, 5 rounds.
# Arguments: the parts to run, of tests, fwd, bwd, bert (none: all four); run3.sh to run5.sh call it with fewer.
cd "$(dirname "$0")/../../.."
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $OUT/env2.txt 2>&1
python3 -c "import torch,triton;print(torch.__version__,triton.__version__,torch.version.cuda,torch.backends.cudnn.version())" >> $OUT/env2.txt 2>&1
cat $OUT/env2.txt
PARTS=" ${*:-tests fwd bwd bert} "
if [[ $PARTS == *" tests "* ]]; then
    SECONDS=0
    timeout 100 python3 -m pytest -m gpu -v -n 12 tests/kernels/test_attention_gpu.py tests/kernels/test_gluon_persistent_gpu.py \
        -k "(realistic and d64) or (two_ctas and reference)" > $OUT/d64_tests2.log 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/d64_tests2.log
    grep -E "FAILED|ERROR" $OUT/d64_tests2.log | head -20; tail -2 $OUT/d64_tests2.log
fi
if [[ $PARTS == *" fwd "* ]]; then
    SECONDS=0
    timeout 100 python3 benchmarks/gluon_profile.py --grid --rows grid-d128-512,grid-d128-1024 --pass fwd \
        --configs default,otile,n64 --rounds 2 --rep 30 --out $OUT/prof_fwd.json > $OUT/prof_fwd.log 2>&1
    echo "rc $? in ${SECONDS}s" >> $OUT/prof_fwd.log
    grep -E "x cuDNN|rc |Error" $OUT/prof_fwd.log | cut -c1-200
fi
if [[ $PARTS == *" bwd "* ]]; then
    SECONDS=0
    timeout 105 python3 benchmarks/gluon_profile.py --grid --rows grid-d128-4096,grid-d128-8192 --pass bwd \
        --bwd-configs fused-first,late --rounds 2 --rep 30 --out $OUT/prof_bwd.json > $OUT/prof_bwd.log 2>&1
    echo "rc $? in ${SECONDS}s" >> $OUT/prof_bwd.log
    grep -E "x cuDNN|rc |Error" $OUT/prof_bwd.log | cut -c1-220
fi
if [[ $PARTS == *" bert "* ]]; then
    SECONDS=0
    timeout 65 python3 benchmarks/gluon_bwd.py --rows bert-base-512,vit-l16-257 --gluon fused --dq-first both --rounds 3 --host-time \
        --rep 30 --out $OUT/bwd_bert.json > $OUT/bwd_bert.log 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/bwd_bert.log
    grep -v invalid $OUT/bwd_bert.log | cut -c1-220 | tail -12
    SECONDS=0
    timeout 40 python3 benchmarks/shapes.py --rows bert-base-512 gpt2-train-512 --passes bwd --rounds 5 --rep 40 \
        --out $OUT/shapes_bert.json > $OUT/shapes_bert.txt 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/shapes_bert.txt
    grep -E "bert|gpt2|rc " $OUT/shapes_bert.txt | cut -c1-160
fi
