#!/usr/bin/env bash
# Fit and report the committed studies into OUT, reading their results in place (so every recorded path and
# the order runs are read in are the committed ones): the before/after check of a change that must not move a
# number. Compare two snapshots with `diff -r BEFORE AFTER`.
#
#   tools/snapshot_committed.sh /tmp/before   # ... change the code ...
#   tools/snapshot_committed.sh /tmp/after && diff -r /tmp/before /tmp/after && echo identical
set -euo pipefail
out=${1:?usage: tools/snapshot_committed.sh OUT_DIR}
cd "$(dirname "$0")/.."
attnres=${ATTNRES:-.venv/bin/attnres}
mkdir -p "$out"
for study in cpu_small cpu_wsd cpu_envelope; do
  results=studies/$study/results
  extra=()   # as the committed reports were built
  [ "$study" = cpu_wsd ] && extra=(--no-svg)
  [ "$study" = cpu_envelope ] && extra=(--no-svg --lr envelope)
  lr=(); [ "$study" = cpu_envelope ] && lr=(--lr envelope)
  "$attnres" fit "$results" "${lr[@]}" --out "$out/$study-fit.json" > "$out/$study-fit.txt" 2>&1
  "$attnres" fit "$results" "${lr[@]}" --form 'E+A*C^-alpha' --out "$out/$study-fit-E.json" \
    > "$out/$study-fit-E.txt" 2>&1
  "$attnres" report "$results" --out "$out/$study-report" "${extra[@]}" > "$out/$study-report.txt" 2>&1
done
