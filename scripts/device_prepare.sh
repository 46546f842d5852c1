#!/usr/bin/env bash
# Here (a machine with PyPI): put asv's and the peers' wheels (Python 3.12, x86-64) and a git bundle of this
# repository into the ignored .whl/ folder, for an offline GPU machine whose checkout arrives
# without git history. Then run scripts/device_bench.sh there with `.whl` carried along.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
  asv==0.6.6 asv-runner==0.3.2 json5 pympler importlib-metadata==8.7.0 zipp virtualenv distlib platformdirs \
  filelock python-discovery tabulate wheel build packaging pyproject_hooks  `# asv's virtualenv environment, offline` \
  accelerated-scan==0.3.1 fla-core==0.6.0  # the roofline's peers (benchmarks.harness.peers)
git bundle create -q .whl/repo.bundle --all
echo "ready: $(ls .whl | wc -l) files in .whl (bundle of $(git rev-parse --short HEAD))"
