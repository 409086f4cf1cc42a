#!/bin/bash
# session 56, GPU call 5 (any card): bert-base-512's backward alone, for the last 290 s (ran on an H100; h100-call5/).
exec bash "$(dirname "$0")/run2.sh" bert
