#!/usr/bin/env bash
# On the offline GPU machine (from the repo root, .whl carried): install asv from the wheels,
# rebuild .git from the bundle (same hashes), run `make bench`, and pack the results + the
# rendered artifacts into $OUT/results.tgz (extract it at the repo root and commit).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site ASV_PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
if ! git rev-parse --verify --quiet HEAD >/dev/null; then
  rm -rf .git /tmp/scankit-bundle && git clone -q --no-checkout .whl/repo.bundle /tmp/scankit-bundle \
    && mv /tmp/scankit-bundle/.git .git && git reset -q || exit 1
fi
echo "measuring $(git rev-parse HEAD)"
start=$(date +%s)
timeout "${BENCH_TIMEOUT:-560}" make bench BENCH_PYTHON=python3 MACHINE="${MACHINE:-h200}" > "${OUT:-.}/asv.log" 2>&1
rc=$?
echo "make bench rc=$rc wall=$(( $(date +%s) - start ))s"
tail -5 "${OUT:-.}/asv.log"
tar czf "${OUT:-.}/results.tgz" experiments/asv experiments/bench README.md
exit $rc
