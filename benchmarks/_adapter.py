"""Helpers shared by the suites."""
import math


def cached(table: dict, key) -> float:
    """table[key], or NaN (asv records n/a) where this run has no such value (a GPU-only
    quantity on a CPU smoke run). The renderer refuses n/a cells unless --partial."""
    value = table.get(key)
    return math.nan if value is None else value


def long_setup_cache(fn):
    """setup_cache measures a whole grid in one process: give it time."""
    fn.timeout = 3600
    return fn
