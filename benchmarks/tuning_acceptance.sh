#!/usr/bin/env bash
# The autotuner's acceptance run on a GPU (issue 4), in stages that each fit a 10-minute call:
#   benchmarks/tuning_acceptance.sh search OUT   # 24 keys: D 64,128 x bf16 x N 1k,4k,16k x causal both x fwd,bwd
#   benchmarks/tuning_acceptance.sh sweep OUT    # exhaustive forward sweeps of two keys, in their own store
#   benchmarks/tuning_acceptance.sh report OUT   # every ratio of the report, side by side in one process
#   benchmarks/tuning_acceptance.sh share OUT    # bench --plot of the tuned store, export it, import it elsewhere
#   benchmarks/tuning_acceptance.sh bound OUT [fwd|bwd] [N...]   # after report: the most per-key tuning can
#                                                # give over the report's best single config (tuning_bound.py)
# OUT is a folder; the stores, journals and reports go there.
set -euo pipefail
stage=${1:?stage: search, sweep, report, share or bound}
out=${2:?output folder}
mkdir -p "$out"
flashtune() { python3 -m flashtune "$@"; }
case "$stage" in
search)
    # budget: 32 measured configs per key (the CLI's default; TRIALS=16 was the earlier runs'), trials
    # killed after 60 s
    flashtune search --head-dim 64,128 --dtype bfloat16 --seq-len 1024,4096,16384 --trial-timeout 60 \
        --trials "${TRIALS:-32}" --db "$out/tuned.db" --storage "$out/journal.log" --no-progress --json \
        > "$out/search.json"
    flashtune list --db "$out/tuned.db"
    ;;
sweep)
    # a budget above the forward space's 320 configs: every valid config is measured once
    flashtune search --head-dim 64,128 --dtype bfloat16 --seq-len 4096 --causal --pass fwd --trials 1000 \
        --trial-timeout 60 --db "$out/sweep.db" --storage "$out/sweep-journal.log" --no-progress --json \
        > "$out/sweep.json"
    flashtune list --db "$out/sweep.db"
    ;;
report)
    python3 benchmarks/tuning_report.py --db "$out/tuned.db" --sweep-db "$out/sweep.db" \
        --out "$out/report.json" --markdown "$out/report.md"
    ;;
share)
    flashtune bench --db "$out/tuned.db" --head-dim 64,128 --seq-len 1024,2048,4096,8192,16384 \
        --plot "$out/bench.png" --json > "$out/bench.json"
    flashtune export --db "$out/tuned.db" -o "$out/export.json"
    flashtune import "$out/export.json" --db "$out/imported.db"
    flashtune list --db "$out/imported.db" --json > "$out/imported.json"
    flashtune list --db "$out/tuned.db" --json > "$out/tuned.json"
    python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
a, b = ([{k: v for k, v in row.items() if k not in ("created_at", "updated_at")} for row in json.load(open(f"{out}/{n}.json"))]
        for n in ("tuned", "imported"))
print("imported table identical to the exported one (timestamps aside):", a == b, f"({len(a)} rows)")
PY
    ;;
bound)
    # every config of the space per key (the backward by its two kernels' halves), screened with a short
    # do_bench, the leaders re-timed interleaved with the report's best single config and the default;
    # about 1.5 min per forward key and 2 min per backward key on an H200
    pass_=${3:-fwd}
    if [ $# -gt 3 ]; then seqs=("${@:4}"); else seqs=(1024 4096 16384); fi
    python3 benchmarks/tuning_bound.py --pass "$pass_" --seq-len "${seqs[@]}" --quick \
        --report "$out/report.json" --out "$out/bound-$pass_.json"
    ;;
*)
    echo "unknown stage $stage" >&2
    exit 2
    ;;
esac
