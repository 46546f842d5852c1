#!/usr/bin/env bash
# On the offline GPU machine (from the repo root, .whl carried): device_setup.sh (wheels,
# .git from the bundle), run `make bench`, and pack the results + the
# rendered artifacts into $OUT/results.tgz (extract it at the repo root and commit).
set -uo pipefail
source scripts/device_setup.sh || exit 1
echo "measuring $(git rev-parse HEAD)"
start=$(date +%s)
timeout "${BENCH_TIMEOUT:-560}" make bench BENCH_PYTHON=python3 MACHINE="$MACHINE" > "${OUT:-.}/asv.log" 2>&1
rc=$?
echo "make bench rc=$rc wall=$(( $(date +%s) - start ))s"
tail -5 "${OUT:-.}/asv.log"
tar czf "${OUT:-.}/results.tgz" experiments/asv experiments/bench README.md
exit $rc
