#!/usr/bin/env bash
# Fit and report both committed studies into OUT, reading their results in place (so every recorded path and
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
for study in cpu_small cpu_wsd; do
  results=studies/$study/results
  extra=(); [ "$study" = cpu_wsd ] && extra=(--no-svg)   # as the committed reports were built
  "$attnres" fit "$results" --out "$out/$study-fit.json" > "$out/$study-fit.txt" 2>&1
  "$attnres" fit "$results" --form 'E+A*C^-alpha' --out "$out/$study-fit-E.json" > "$out/$study-fit-E.txt" 2>&1
  "$attnres" report "$results" --out "$out/$study-report" "${extra[@]}" > "$out/$study-report.txt" 2>&1
done
