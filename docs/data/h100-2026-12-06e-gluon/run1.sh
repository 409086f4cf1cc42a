#!/bin/bash
# session 50, GPU call 1: on an H200, the issue's acceptance first (session 48's run4.sh); on any other card,
# session 49's next_d256.sh: the D=256 Gluon backward through its GPU tests, then timed against the Triton
# kernel, cuDNN and FlashAttention-2 on gemma2-d256-train-4k and 2x16x4k-d256
cd "$(dirname "$0")/../../.."
if nvidia-smi --query-gpu=name --format=csv | grep -q H200; then
    bash docs/data/h100-2026-12-06c-gluon/run4.sh
else
    bash docs/data/h100-2026-12-06d-gluon/next_d256.sh
fi
