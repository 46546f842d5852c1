"""Helpers shared by the suites: cache lookup with asv's skip convention."""


def cached(table: dict, key, why: str = "not measured in this run"):
    """table[key]; a missing or None entry skips the benchmark (asv records n/a)."""
    value = table.get(key)
    if value is None:
        raise NotImplementedError(why)
    return value


def long_setup_cache(fn):
    """setup_cache measures a whole grid in one process: give it time."""
    fn.timeout = 3600
    return fn
