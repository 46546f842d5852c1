"""asv suites for scankit: thin adapters over scankit.bench (see asv.conf.json).

Each class measures everything once in ``setup_cache`` (one process, CUDA events); its
``track_*`` benchmarks only read the cache, and importing them never touches torch or CUDA.
"""
import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
