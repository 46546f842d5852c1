"""asv suites for scankit over one fixed harness, ``benchmarks.harness`` (see asv.conf.json).

asv installs each measured commit of scankit into its environment and imports this
package from the checkout: every commit is measured by the same harness, which reaches
scankit only through its public API (an op a commit lacks is n/a). Each class measures
its cells once in ``setup_cache`` (one process); its ``track_*`` benchmarks only read that
cache, and importing them never touches CUDA.
"""
