#!/bin/bash
# session 51, GPU calls 2 and 3 (typed at the call, kept here as they ran): the two-CTA forward beside the
# one-CTA configs over the D=64 grid and whisper-enc-1500 (fwd_regs2.json from call 2, fwd_regs3.* from call 3)
cd "$(dirname "$0")/../../.."
timeout 170 python3 benchmarks/gluon_fwd.py --grid --rows grid-d64-512,grid-d64-1024,grid-d64-2048,whisper-enc-1500 \
    --config BLOCK_N=64 --config OVERLAP=0 --config CONSUMER_REGS=104 --config PERSISTENT=0,1 --config O_TILE=0,1 \
    --rounds 2 --rep 25 --out $OUT/fwd_regs2.json 2>&1 | grep -v invalid | tail -30
R=grid-d64-4096,grid-d64-8192,grid-d64-16384
timeout 120 python3 benchmarks/gluon_fwd.py --grid --rows $R --config BLOCK_N=64,128 --config OVERLAP=0,1 \
    --config CONSUMER_REGS=104,240 --config PINGPONG=0,1 --config NUM_BUFFERS=2,3 --config PERSISTENT=0,1 \
    --config O_TILE=1 --rounds 2 --rep 25 --out $OUT/fwd_regs3.json > $OUT/fwd_regs3.log 2>&1
