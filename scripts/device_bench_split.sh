#!/usr/bin/env bash
# On an offline host with two GPUs (repo root, .whl carried): the asv suite of HEAD in two
# parts at once, one per GPU (scans + copy bandwidth on GPU 0; parity, mixers, peers, scaling on GPU 1), merged
# into experiments/asv/results by tools/merge_asv_results.py, rendered, and packed into
# $OUT/results.tgz. The copy bandwidth is measured on GPU 0 with the timings it scales.
# ONLY=REGEX: one GPU, that selection alone (a partial run; the renderer needs --partial).
set -uo pipefail
source scripts/device_setup.sh || exit 1
commit=$(git rev-parse HEAD) machine=${MACHINE:-h200} root=$PWD
echo "measuring $commit in two parts"
python3 -m asv machine --yes --machine "$machine" > /dev/null
part() {  # part N BENCH_REGEX
  local dir=/tmp/asv-part$1
  mkdir -p "$dir"
  python3 - "$dir" "$root" <<'PY'
import json, sys
from asv.util import load_json
conf = load_json(sys.argv[2] + "/asv.conf.json", js_comments=True)
conf.update(repo=sys.argv[2], benchmark_dir=sys.argv[2] + "/benchmarks", results_dir=sys.argv[1] + "/results",
            env_dir=sys.argv[1] + "/env", html_dir=sys.argv[1] + "/html")
open(sys.argv[1] + "/asv.conf.json", "w").write(json.dumps(conf))
PY
  (cd "$dir" && CUDA_VISIBLE_DEVICES=$1 SCANKIT_ASV_MACHINE=$machine SCANKIT_ASV_COMMIT=$commit \
    SCANKIT_ASV_PARITY_DIR=$root/experiments/asv/parity timeout "${BENCH_TIMEOUT:-560}" \
    python3 -m asv run -E "existing:$(command -v python3)" --set-commit-hash "$commit" --machine "$machine" \
    --show-stderr --bench "$2" > "${OUT:-/tmp}/asv-part$1.log" 2>&1)
  echo "part $1 ($2) rc=$? at $(( $(date +%s) - start ))s"
}
start=$(date +%s)
if [ -n "${ONLY:-}" ]; then  # one GPU: just this selection (a partial run)
  part 0 "$ONLY"
  parts=(/tmp/asv-part0/results)
else
  part 0 "bench_scans" &
  part 1 "bench_parity|bench_mixers|bench_roofline" &
  wait
  parts=(/tmp/asv-part0/results /tmp/asv-part1/results)
fi
python3 tools/merge_asv_results.py experiments/asv/results "${parts[@]}"
python3 tools/render_artifacts.py --machine "$machine" --readme README.md
rc=$?
tar czf "${OUT:-.}/results.tgz" experiments/asv experiments/bench README.md
echo "wall $(( $(date +%s) - start ))s, render rc=$rc"
exit $rc
