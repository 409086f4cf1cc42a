#!/bin/bash
# session 56, GPU call 4 (any card): run3.sh without the backward profile, for the last 380 s of device time.
exec bash "$(dirname "$0")/run2.sh" fwd bert
