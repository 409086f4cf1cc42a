#!/bin/bash
# session 56, GPU call 3 (any card): run2.sh without its D=64 tests, for a budget cut by refused starts.
exec bash "$(dirname "$0")/run2.sh" fwd bwd bert
