#!/bin/bash
# session 48, GPU call 3, first part (any card): the D=64 rows with TMA_STORE_DKDV on: the fused Gluon backward
# (both dQ orders) against the Triton default, cuDNN and FlashAttention-2 over the 12 D=64 grid rows and
# SHAPES.md's short D=64 training rows (bert, vit, gpt2), which the Triton backward serves below 1024 queries
# and under causal masking
cd "$(dirname "$0")/../../.."
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $OUT/env3.txt 2>&1
python3 -c "import torch,triton;print(torch.__version__,triton.__version__,torch.version.cuda,torch.backends.cudnn.version())" >> $OUT/env3.txt 2>&1
cat $OUT/env3.txt
G=grid-d64-512,grid-d64-1024,grid-d64-2048,grid-d64-4096,grid-d64-8192,grid-d64-16384,bert-base-512,vit-l16-257,gpt2-train-512
SECONDS=0
timeout 140 python3 benchmarks/gluon_bwd.py --grid --rows $G --gluon fused --dq-first both --rounds 2 --rep 30 --out $OUT/bwd_d64.json > $OUT/bwd_d64.log 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/bwd_d64.log
tail -5 $OUT/bwd_d64.log
