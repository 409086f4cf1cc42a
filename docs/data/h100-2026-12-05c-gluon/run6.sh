#!/bin/bash
# session 42, GPU call 6: the short D=128 rows over persistent BLOCK_N x buffers x O tiles; the 512 causal profile
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/env6.txt 2>&1; cat $OUT/env6.txt
timeout 170 python3 benchmarks/gluon_fwd.py --grid --rows grid-d128-512,grid-d128-1024 --configs persistent --persistent-buffers 2,3,4 --persistent-block-n 64,128 --tma-store on --o-tile both --rounds 2 --out $OUT/fwd_short.json > $OUT/fwd_short.log 2>&1; echo "rc $?" >> $OUT/fwd_short.log
tail -4 $OUT/fwd_short.log
timeout 50 python3 benchmarks/gluon_profile.py --grid --head-dim 128 --rows grid-d128-512 --pass fwd --configs persistent,otile --rounds 1 > $OUT/prof512.log 2>&1; echo "rc $?" >> $OUT/prof512.log
tail -3 $OUT/prof512.log
