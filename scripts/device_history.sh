#!/usr/bin/env bash
# On the offline GPU machine (repo root, .whl carried, after scripts/device_setup.sh):
#   GPUS=0,1 scripts/device_history.sh DEADLINE_S TAG COMMIT...
# measures each commit with tools/run_history.py (its own suite, in a worktree, shared out
# over GPUS, default 0) while the deadline (seconds since START_TS, default now) leaves room
# for one more (the last commit's wall time, or FIRST_ESTIMATE_S for the first), and packs
# experiments/asv and the asv logs into $OUT/history-TAG.tgz after each, so a command cut
# off at its limit still returns what finished.
set -uo pipefail
deadline=$1 tag=$2
shift 2
start=${START_TS:-$(date +%s)}
need=${FIRST_ESTIMATE_S:-500}
logs=/tmp/history-logs-$tag
mkdir -p "$logs"
for commit in "$@"; do
  left=$(( deadline - ($(date +%s) - start) ))
  if (( left < need )); then echo "[$tag] stop: ${left}s left, a commit needs ~${need}s"; break; fi
  t0=$(date +%s)
  python3 tools/run_history.py "$commit" --machine "${MACHINE:-h200}" --python python3 --gpus "${GPUS:-0}" \
    --timeout "$(( left - 15 ))" --log-dir "$logs" > "$logs/${commit:0:8}.log" 2>&1
  echo "[$tag] $commit rc=$? wall=$(( $(date +%s) - t0 ))s: $(grep -E '^(done|skip)' "$logs/${commit:0:8}.log" | tail -1)"
  need=$(( ($(date +%s) - t0) * 11 / 10 ))
  tar czf "${OUT:-.}/history-$tag.tgz" experiments/asv -C /tmp "history-logs-$tag"
done
