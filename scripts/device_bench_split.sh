#!/usr/bin/env bash
# On an offline host with one or more GPUs (repo root, .whl carried): the asv suite of HEAD,
# its modules shared out over GPUS (default 0,1: one asv process per GPU, at once) by
# tools/run_history.py, merged into experiments/asv/results, rendered, and packed into
# $OUT/results.tgz with the asv logs. ONLY=REGEX: that selection alone, on the first GPU
# (a partial run; the renderer needs --partial).
set -uo pipefail
source scripts/device_setup.sh || exit 1
machine=$MACHINE
start=$(date +%s)
python3 tools/run_history.py HEAD --machine "$machine" --python python3 --gpus "${GPUS:-0,1}" \
  --timeout "${BENCH_TIMEOUT:-560}" --log-dir "${OUT:-/tmp}" ${ONLY:+--bench "$ONLY"}
python3 tools/render_artifacts.py --machine "$machine" --readme README.md
rc=$?
tar czf "${OUT:-.}/results.tgz" experiments/asv experiments/bench README.md
echo "wall $(( $(date +%s) - start ))s, render rc=$rc"
exit $rc
