#!/bin/bash
# session 45, GPU call 2: STEP_COUNTERS with the late dQ share after the fix (the order-switch tests); if they
# pass, STEP_COUNTERS is set on in this copy (sed below) for everything after; POLY_EXP2 and the persistent dK/dV
# kernel timed over the 12 D=128 grid rows; the D=256 forward from 512 to 8192 queries; then the standard grid
# through the drop-in (SHAPES.md end to end was cut from this call for device time)
# (outputs renamed here: fwd_d256.* -> fwd_d256_sweep.*; t2.log and grid.txt did not come back from the device, their
# tails are quoted in docs/gluon.md: the STEP_COUNTERS order-switch tests 10 passed, rc 0)
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $OUT/env2.txt 2>&1
python3 -c "import torch,triton;print(torch.__version__,triton.__version__,torch.version.cuda,torch.backends.cudnn.version())" >> $OUT/env2.txt 2>&1
git log --oneline -1 >> $OUT/env2.txt; cat $OUT/env2.txt
SECONDS=0
timeout 100 python3 -m pytest -m gpu -v -n 14 tests/kernels/test_gluon_bwd_gpu.py -k "order_switches and STEP_COUNTERS" > $OUT/t2.log 2>&1; rc=$?; echo "rc $rc in ${SECONDS}s" >> $OUT/t2.log
grep -E "FAILED|ERROR" $OUT/t2.log | head; grep -c PASSED $OUT/t2.log; tail -1 $OUT/t2.log
if [ $rc -eq 0 ]; then sed -i 's/^STEP_COUNTERS = False$/STEP_COUNTERS = True/' flashtune/kernels/gluon_backward.py; fi
grep -n "^STEP_COUNTERS" flashtune/kernels/gluon_backward.py | tee -a $OUT/env2.txt
G=grid-d128-512,grid-d128-1024,grid-d128-2048,grid-d128-4096,grid-d128-8192,grid-d128-16384
SECONDS=0
timeout 80 python3 benchmarks/gluon_bwd.py --grid --rows $G --gluon default --switch POLY_EXP2=0,1,2 --rounds 2 --rep 20 --out $OUT/bwd_poly.json > $OUT/bwd_poly.log 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/bwd_poly.log
tail -4 $OUT/bwd_poly.log
SECONDS=0
timeout 80 python3 benchmarks/gluon_bwd.py --grid --rows $G --gluon default --persistent both --rounds 2 --rep 20 --out $OUT/bwd_persistent.json > $OUT/bwd_persistent.log 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/bwd_persistent.log
tail -4 $OUT/bwd_persistent.log
SECONDS=0
timeout 80 python3 benchmarks/gluon_fwd.py --d256 --configs persistent --persistent-buffers 2,3 --rounds 2 --rep 30 --out $OUT/fwd_d256_sweep.json > $OUT/fwd_d256_sweep.log 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/fwd_d256_sweep.log
tail -16 $OUT/fwd_d256_sweep.log
SECONDS=0
timeout 110 python3 benchmarks/attention.py --out $OUT/grid.json > $OUT/grid.txt 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/grid.txt
tail -9 $OUT/grid.txt
