#!/bin/bash
# session 48, GPU call 2: with TMA_STORE_DKDV on and the causal D=128 default the late share in the usual order:
# the whole Gluon backward GPU file, the launch plans, the realistic/split/deterministic/search-space cases of the
# attention tests; the drop-in over the standard grid (cuDNN, FlashAttention-2) and over SHAPES.md; the four
# grouped-query training rows with TMA_STORE_DKDV 0/1
cd "$(dirname "$0")/../../.."
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $OUT/env2.txt 2>&1
python3 -c "import torch,triton;print(torch.__version__,triton.__version__,torch.version.cuda,torch.backends.cudnn.version())" >> $OUT/env2.txt 2>&1
grep -n "^TMA_STORE_DKDV\|^SKIP_DEAD_STEPS" flashtune/kernels/gluon_backward.py >> $OUT/env2.txt; grep -n '^_SM90_BWD\[(_bf, 128, "long"' flashtune/kernels/config.py >> $OUT/env2.txt; cat $OUT/env2.txt
SECONDS=0
timeout 230 python3 -m pytest -m gpu -q -n 14 tests/kernels/test_gluon_bwd_gpu.py tests/kernels/test_launch_plans.py tests/kernels/test_attention_gpu.py -k "gluon_bwd or launch_plans or replay or dkdv_split or realistic or deterministic or every_search_space_config" > $OUT/t2.log 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/t2.log
grep -E "FAILED|ERROR" $OUT/t2.log | head -20; tail -2 $OUT/t2.log
SECONDS=0
timeout 110 python3 benchmarks/attention.py --out $OUT/grid2.json > $OUT/grid2.txt 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/grid2.txt
tail -14 $OUT/grid2.txt
SECONDS=0
timeout 90 python3 benchmarks/shapes.py --rep 50 --out $OUT/shapes2.json > $OUT/shapes2.txt 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/shapes2.txt
tail -8 $OUT/shapes2.txt
R=llama3-8b-train-8k,llama3-70b-tp8-train-4k,mistral-7b-train-2k,qwen-28h-train-4k
SECONDS=0
timeout 100 python3 benchmarks/gluon_bwd.py --realistic --rows $R --gluon fused --dq-first both --switch TMA_STORE_DKDV=0,1 --rounds 2 --rep 30 --out $OUT/bwd_gqa.json > $OUT/bwd_gqa.log 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/bwd_gqa.log
tail -4 $OUT/bwd_gqa.log
