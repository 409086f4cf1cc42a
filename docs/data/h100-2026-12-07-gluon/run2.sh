#!/bin/bash
# session 55, GPU call 2 (about 250 s; what is left after refused starts): on an H200 the standard grid through the
# drop-in with cuDNN and FlashAttention-2 (session 54's run2.sh). On any other card run1.sh's first two parts: the
# D=64 middle band's full-call entry against the reference, and the causal middle band against the one-CTA Gluon
# default and the Triton causal entry from 0.7 to 11.6 tiles of 128 rows an SM.
cd "$(dirname "$0")/../../.."
nvidia-smi --query-gpu=name --format=csv | grep -q H200 && exec bash docs/data/h100-2026-12-06i-gluon/run2.sh
exec bash docs/data/h100-2026-12-07-gluon/run1.sh tests mid
