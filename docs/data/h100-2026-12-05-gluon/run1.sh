#!/bin/bash
# session 40, GPU call 1
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $OUT/env.txt 2>&1
python3 -c "import torch,triton;print(torch.__version__,triton.__version__,torch.version.cuda,torch.backends.cudnn.version())" >> $OUT/env.txt 2>&1
timeout 230 python3 -m pytest -m gpu -v -n 12 tests/kernels/test_gluon_gpu.py tests/kernels/test_gluon_persistent_gpu.py tests/kernels/test_gluon_trace_gpu.py tests/kernels/test_launch_plans.py > $OUT/t1.log 2>&1; echo "rc $?" >> $OUT/t1.log
grep -E "FAILED|ERROR" $OUT/t1.log | head -20; tail -2 $OUT/t1.log
D128=grid-d128-512,grid-d128-1024,grid-d128-2048,grid-d128-4096,grid-d128-8192,grid-d128-16384,llama3-8b-train-8k,llama3-70b-tp8-train-4k,mistral-7b-train-2k,qwen-28h-train-4k,llama3-8b-prefill-2k,whisper-enc-1500,chunked-prefill-1k-of-16k
timeout 345 python3 benchmarks/gluon_fwd.py --grid --realistic --rows $D128 --configs persistent --persistent-buffers 2,3 --persistent-order both --o-tile both --rounds 2 --out $OUT/fwd.json > $OUT/fwd.log 2>&1; echo "rc $?" >> $OUT/fwd.log
tail -9 $OUT/fwd.log
