#!/bin/bash
# session 56, GPU call 5 (any card): bert-base-512's backward alone (run4.sh's last two parts), for the last 290 s.
cd "$(dirname "$0")/../../.."
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $OUT/env2.txt 2>&1
python3 -c "import torch,triton;print(torch.__version__,triton.__version__,torch.version.cuda,torch.backends.cudnn.version())" >> $OUT/env2.txt 2>&1
cat $OUT/env2.txt
SECONDS=0
timeout 65 python3 benchmarks/gluon_bwd.py --rows bert-base-512,vit-l16-257 --gluon fused --dq-first both --rounds 3 --host-time \
    --rep 30 --out $OUT/bwd_bert.json > $OUT/bwd_bert.log 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/bwd_bert.log
grep -v invalid $OUT/bwd_bert.log | cut -c1-220 | tail -12
SECONDS=0
timeout 40 python3 benchmarks/shapes.py --rows bert-base-512 gpt2-train-512 --passes bwd --rounds 5 --rep 40 \
    --out $OUT/shapes_bert.json > $OUT/shapes_bert.txt 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/shapes_bert.txt
grep -E "bert|gpt2|rc " $OUT/shapes_bert.txt | cut -c1-160
