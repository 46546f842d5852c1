#!/usr/bin/env bash
# On the offline GPU machine (repo root, .whl carried; scripts/device_prepare.sh made it):
# asv's own commands over commits, each commit installed into asv's virtualenv environment.
#   bash scripts/device_asv.sh "continuous -b 'Scans\.' 380d5e9 HEAD" "run -b 'Scans\.' c6f5f6a^!"
# Each argument is one asv command line (after `python3 -m asv`, --machine added). After each,
# the machine's results (experiments/asv/results/h200) are packed into $OUT/asv-results.tar
# (with the parity sidecars, experiments/asv/parity/h200) and the log is $OUT/asv.log, so what finished comes back even if a later command is cut off.
# Each command stops after ASV_LIMIT_S seconds (default 480), and all of them together after
# ASV_TOTAL_S (default 560): inside the device's 10-minute command limit, so the packing still
# runs (asv files a commit's result once that commit is done).
# The reference cells (eager, torch.compile: torch and the host, not the commit) are measured
# once per machine and torch version: the committed experiments/asv/references/<machine>.json
# seeds the harness's cache, and what a run adds comes back in the tar. The word `cold` in
# place of a command empties the compile caches (Triton, inductor, CUDA) and asv's
# environments, so the next command starts as a fresh machine would (the reference cache stays).
# The word `backfill` runs `Scans` and `CallForms` over the kernel commits that the results here lack
# (tools/kernel_commits.py --missing), so calls one after another never measure one twice
# once each call's tar is unpacked into the tree before the next.
set -uo pipefail
out=${OUT:-/tmp/scankit-asv}
mkdir -p "$out"
source scripts/device_setup.sh || exit 1  # sets MACHINE from the GPU and the offline pip
machine=$MACHINE
export SCANKIT_ASV_MACHINE="$machine"
python3 tools/asv_machine.py --machine "$machine" | tee "$out/machine.txt"
[ "${PIPESTATUS[0]}" = 0 ] || exit 2  # refused: MACHINE names another GPU
cache=${SCANKIT_BENCH_CACHE:-$HOME/.cache/scankit-bench}
refs=experiments/asv/references/"$machine".json
mkdir -p "$cache" "$(dirname "$refs")"
[ -f "$refs" ] && [ ! -f "$cache/references.json" ] && cp "$refs" "$cache/references.json"
status=0
for cmd in "$@"; do
  if [ "$cmd" = cold ]; then
    rm -rf "${TRITON_CACHE_DIR:-$HOME/.triton/cache}" "${TORCHINDUCTOR_CACHE_DIR:-/tmp/torchinductor_$(id -un)}" \
      "$HOME/.nv/ComputeCache" .asv/env
    echo "=== cold: compile caches and asv environments emptied ($(date -u +%H:%M:%S))" | tee -a "$out/asv.log"
    continue
  fi
  if [ "$cmd" = backfill ]; then  # the kernel commits this tree's results lack, as listed now
    python3 tools/kernel_commits.py --missing "$machine" --out /tmp/scankit-missing.txt 2>&1 >/dev/null | tee -a "$out/asv.log"
    [ -s /tmp/scankit-missing.txt ] || continue
    cmd="run --record-samples -b 'Scans\.|CallForms\.' HASHFILE:/tmp/scankit-missing.txt"
  fi
  echo "=== asv $cmd ($(date -u +%H:%M:%S))" | tee -a "$out/asv.log"
  start=$SECONDS
  limit=$(( ${ASV_TOTAL_S:-560} - SECONDS < ${ASV_LIMIT_S:-480} ? ${ASV_TOTAL_S:-560} - SECONDS : ${ASV_LIMIT_S:-480} ))
  if [ "$limit" -lt 30 ]; then echo "=== skipped: ${limit} s left of ASV_TOTAL_S" | tee -a "$out/asv.log"; continue; fi
  # each line stamped with the seconds since the command began: where a run's time goes
  eval "timeout --kill-after=10 $limit python3 -m asv $cmd --machine $machine --show-stderr" 2>&1 \
    | while IFS= read -r line; do printf '%4d %s\n' $((SECONDS - start)) "$line"; done | tee -a "$out/asv.log"
  rc=${PIPESTATUS[0]}
  echo "=== exit $rc after $((SECONDS - start)) s" | tee -a "$out/asv.log"
  [ "$rc" -ne 0 ] && status=$rc
  [ -f "$cache/references.json" ] && cp "$cache/references.json" "$refs"
  tar -cf "$out/asv-results.tar" experiments/asv/results/"$machine" experiments/asv/results/benchmarks.json \
    experiments/asv/parity/"$machine" "$refs" 2>/dev/null  # the parity sidecars and the reference cache too
  # the harness's own phase log (benchmarks.harness.suite.note), even of a run cut off mid-setup
  cp "$cache/harness.log" "$out/harness.log" 2>/dev/null
done
exit $status
