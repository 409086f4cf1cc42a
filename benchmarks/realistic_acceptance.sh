#!/usr/bin/env bash
# Issue 13's acceptance run on a GPU: ../shared/design/SHAPES.md's rows tuned into one store, then
# every row measured through the drop-in in one process. Stages that each fit a 10-minute call;
# a stage cut short is resumed by running it again on the same OUT (the store claims finished keys):
#   benchmarks/realistic_acceptance.sh search OUT [SECONDS]  # flashtune search --shapes over every row
#   benchmarks/realistic_acceptance.sh report OUT            # shapes.py --db: tuned, default, drop-in,
#                                                            # SDPA backends, the best single config
#                                                            # (OUT/report.json; with PASSES=fwd report-fwd.json)
#   benchmarks/realistic_acceptance.sh bound OUT fwd|bwd ROW...  # tuning_bound.py on some rows: the most
#                                                            # per-row tuning can give over the best single
#                                                            # config of OUT/report.json (REPORT=another)
# Budget knobs: TRIALS (16), TIMEOUT (s of trials per key, 10), TRIAL_TIMEOUT (30); PASSES ("fwd bwd")
# keeps only those passes of the rows (search, report and bound), ROUNDS (2) the report's rounds.
set -euo pipefail
stage=${1:?stage: search, report or bound}
out=${2:?output folder}
mkdir -p "$out"
flashtune() { python3 -m flashtune "$@"; }
rows() {  # the realistic grid as a shape file (flashtune.shapes.REALISTIC_GRID is SHAPES.md's table)
    python3 - "$out/realistic.json" "${PASSES:-fwd bwd}" "$@" <<'PY'
import json, sys
from flashtune.shapes import REALISTIC_GRID
passes, names = sys.argv[2].split(), set(sys.argv[3:])
rows = [dict(s.as_dict(), passes=[p for p in s.passes if p in passes]) for s in REALISTIC_GRID
        if (not names or s.name in names) and set(s.passes) & set(passes)]
json.dump(rows, open(sys.argv[1], "w"), indent=1)
PY
}
case "$stage" in
search)
    rows
    start=$(date +%s)
    # a call's limit cuts the search (timeout's SIGTERM: the search stops between trials and keeps them);
    # each run of the stage writes its own search-SECONDS.json
    timeout --signal=TERM "${3:-3600}" python3 -m flashtune search --shapes "$out/realistic.json" \
        --trials "${TRIALS:-16}" --timeout "${TIMEOUT:-10}" --trial-timeout "${TRIAL_TIMEOUT:-30}" \
        --db "$out/shapes.db" --storage "$out/journal.log" --no-progress --json > "$out/search-$(date +%s).json" || true
    echo "search wall time: $(( $(date +%s) - start )) s"
    flashtune list --db "$out/shapes.db"
    ;;
report)
    python3 benchmarks/shapes.py --db "$out/shapes.db" --singles --graph-singles --rounds "${ROUNDS:-2}" \
        --warmup 10 --rep 40 --passes ${PASSES:-fwd bwd} --out "$out/report${PASSES:+-${PASSES// /-}}.json"
    ;;
bound)
    pass_=${3:?fwd or bwd}
    rows "${@:4}"
    python3 benchmarks/tuning_bound.py --pass "$pass_" --shapes "$out/realistic.json" --quick \
        --report "${REPORT:-$out/report.json}" --out "$out/bound-$pass_.json"
    ;;
*)
    echo "unknown stage $stage" >&2
    exit 2
    ;;
esac
