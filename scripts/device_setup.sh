#!/usr/bin/env bash
# On the offline GPU machine (repo root, .whl carried): install the carried wheels (asv,
# peers) into /tmp/site and rebuild .git from the carried bundle. Source it: it exports
# PYTHONPATH for what runs next.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 1
# The peers also go into the machine python's own site-packages: asv's virtualenv environments
# reuse those directories (tools/asv_env.py), while asv drops PYTHONPATH from the benchmark
# processes (its benchmark runner removes PYTHONPATH's entries from sys.path).
PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  .whl/accelerated_scan-*.whl .whl/fla_core-*.whl || return 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
# offline: asv's virtualenv environments install their own pip's wheel, build, asv_runner, pympler
# from the carried wheels, not from an index
export PIP_NO_INDEX=1 PIP_FIND_LINKS="$PWD/.whl"
# the asv machine is the GPU in hand (tools/asv_machine.py: h200, h100); results filed under
# another machine's name would sit in that machine's history, so asv_machine.py refuses a
# MACHINE that names another GPU
if [ -z "${MACHINE:-}" ]; then
  MACHINE=$(python3 tools/asv_machine.py --name) || return 1
fi
export MACHINE
# the checkout's own .git may be absent or stale: always take history from the bundle, and
# refuse a tree whose measured code differs from the bundle's HEAD (results would be misfiled)
rm -rf .git /tmp/scankit-bundle && git clone -q --no-checkout .whl/repo.bundle /tmp/scankit-bundle \
  && mv /tmp/scankit-bundle/.git .git && git reset -q || return 1
if ! git diff --quiet HEAD -- scankit benchmarks tools; then
  echo "device setup: the tree differs from the bundle's HEAD $(git rev-parse --short HEAD): run scripts/device_prepare.sh after committing" >&2
  return 1
fi
git config --global --add safe.directory "$PWD"
echo "device setup: $(git rev-parse --short HEAD), wheels in /tmp/site"
