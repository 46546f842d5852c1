#!/usr/bin/env bash
# On the GPU machine (repo root): the GPU tests, what CI cannot run. Kernels, fused mixers,
# torch.compile with inductor (also dynamic=True and CUDA graphs), edges (grid limits, syncs);
# first more than 2^31 elements per kernel family on their own (memory). Logs under $OUT, each
# test's result as it finishes (-v), so a run cut at its time limit still names its failures;
# the console shows only failures and the summaries.
#   [GPU_TESTS_LIMIT_S=S] bash scripts/device_gpu_tests.sh [pytest -k expression]
set -uo pipefail
out=${OUT:-/tmp/scankit-gpu-tests}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"
  # the device's copy of .git can be stale: the caller names the commit it sent (SCANKIT_COMMIT)
  echo "tree: ${SCANKIT_COMMIT:-unnamed (set SCANKIT_COMMIT)}"; } | tee "$out/gpu.txt"
sel=(${1:+-k "$1"})
shown='(FAILED|ERROR)|(passed|failed|error|no tests ran).* in [0-9.]+s'
# more than 2^31 elements first (a minute, one at a time: memory), so a run cut by its time
# limit has run them; then the rest, 12 workers, under GPU_TESTS_LIMIT_S when set (a cut run
# then names the tests that started and did not finish)
python3 -m pytest -v -p no:cacheprovider --timeout 480 --durations=10 "${sel[@]}" tests/test_big.py 2>&1 \
  | tee "$out/gpu-tests-big.log" | grep -E --line-buffered "$shown"
second=${PIPESTATUS[0]}
[ "$second" = 5 ] && [ -n "${1:-}" ] && second=0  # a -k selection with no test there: nothing failed
limit=(${GPU_TESTS_LIMIT_S:+timeout --signal=INT "$GPU_TESTS_LIMIT_S"})
"${limit[@]}" python3 -m pytest -v -p no:cacheprovider -n 12 --timeout 480 --durations=10 "${sel[@]}" \
  tests/test_kernels.py tests/test_fused.py tests/test_compile.py tests/test_edges.py tests/test_mixers.py \
  tests/test_dispatch.py tests/test_validation.py tests/test_final_state.py tests/test_launches.py \
  tests/test_reverse.py tests/test_packed.py tests/test_gpu_geometry.py tests/test_gated_scans.py tests/test_layers.py tests/test_autocast.py 2>&1 \
  | tee "$out/gpu-tests.log" | grep -E --line-buffered "$shown"
first=${PIPESTATUS[0]}
if [ "$first" = 124 ] || [ "$first" = 130 ]; then  # cut: the tests that started and did not finish
  python3 - "$out/gpu-tests.log" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
started = set(re.findall(r"^(tests/\S+::.+?) $", text, re.M))
done = set(re.findall(r"^\[gw\d+\] \[ *\d+%\] \w+ (tests/\S+::.+?) ?$", text, re.M))
print(f"cut: {len(done)} finished, {len(started - done)} started and unfinished:", *sorted(started - done), sep="\n  ")
PY
fi
echo "gpu tests: exit $first, > 2^31 tests: exit $second"
exit $(( first || second ))
