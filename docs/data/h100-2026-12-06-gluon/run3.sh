#!/bin/bash
# session 46, GPU call 3 (the session's last device time): the whole GPU suite, as the run's command line had it
# (stopped by its timeout at 98 %: 1422 passed, 1 failed, 172 skipped when it stopped)
cd "$(dirname "$0")/../../.."
SECONDS=0; timeout 530 python3 -m pytest -m gpu -v -n 14 tests > $OUT/t3.log 2>&1; echo "rc $? in ${SECONDS}s" >> $OUT/t3.log
