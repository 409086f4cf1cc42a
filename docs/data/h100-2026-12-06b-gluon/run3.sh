#!/bin/bash
# session 47, GPU call 3: the grouped-query causal training rows of SHAPES.md under the four fused variants with
# SKIP_DEAD_STEPS on (the causal default became family 4 first on the grid's rows); SHAPES.md end to end
cd "$(dirname "$0")/../../.."
R=llama3-8b-train-8k,llama3-70b-tp8-train-4k,mistral-7b-train-2k,qwen-28h-train-4k
SECONDS=0
timeout 120 python3 benchmarks/gluon_bwd.py --realistic --rows $R --gluon fused --dq-first both --rounds 2 --rep 30 --out $OUT/bwd_gqa.json > $OUT/bwd_gqa.log 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/bwd_gqa.log
grep -A1 "causal m64" $OUT/bwd_gqa.log | sed 's/m64n2x64b2r24\/240\///g' | cut -c1-240; tail -4 $OUT/bwd_gqa.log
SECONDS=0
timeout 280 python3 benchmarks/shapes.py --rep 50 --out $OUT/shapes3.json > $OUT/shapes3.txt 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/shapes3.txt
tail -40 $OUT/shapes3.txt
