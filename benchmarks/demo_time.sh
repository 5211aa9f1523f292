#!/usr/bin/env bash
# The demo's whole run (`make run` with the venv made), this checkout against a reference
# checkout, interleaved (reference, current, reference, ...) so that drifts in the machine's
# load hit both alike (issue 42, goal 2). Each run starts from no results/ and logs/; the
# first current run starts with JAX's compilation cache empty, as on a fresh machine.
#
#   git worktree add /tmp/ref <reference commit>
#   bash benchmarks/demo_time.sh /tmp/ref 3 > demo_time.tsv
#
# Prints one row per run: code, repeat, wall seconds, exit status, commit, LocusFormer's
# total. Both checkouts run with this checkout's .venv.
set -u
REF=$(cd "$1" && pwd)
REPEATS=${2:-3}
HERE=$(cd "$(dirname "$0")/.." && pwd)
VENV=$HERE/.venv

run() {  # label checkout repeat
    cd "$2" && rm -rf results logs .snakemake
    local start end status
    start=$(date +%s.%N)
    make -o "$VENV/.installed" run VENV="$VENV" > "/tmp/demo_time_$1_$3.log" 2>&1
    status=$?
    end=$(date +%s.%N)
    local total
    total=$(awk -F'\t' 'NR > 1 && $2 == "locusformer" {print $5}' results/summary.tsv 2>/dev/null)
    printf '%s\t%s\t%.1f\t%s\t%s\t%s\n' "$1" "$3" "$(echo "$end - $start" | bc)" "$status" \
        "$(git -C "$2" rev-parse --short HEAD)" "$total"
}

rm -rf "${XDG_CACHE_HOME:-$HOME/.cache}/locusformer/jax"
printf 'code\trepeat\tseconds\tstatus\tcommit\tlocusformer_total\n'
for r in $(seq 1 "$REPEATS"); do
    run reference "$REF" "$r"
    run current "$HERE" "$r"
done
