"""Helpers shared by the suites."""
import math


def cached(table: dict, key) -> float:
    """table[key], or NaN (asv records n/a) where this run has no such value (a GPU-only
    quantity on a CPU smoke run). The renderer refuses n/a cells unless --partial."""
    value = table.get(key)
    return math.nan if value is None else value


def require_cell(cells: dict, table: str, key) -> None:
    """A benchmark's ``setup`` for one cell of a suite's cells: RuntimeError with the error where
    the measured commit's kernel raised (asv: failed, no value), NotImplementedError where the
    cell is a registered skip or was not measured (asv: n/a)."""
    if key in cells.get("failed", ()):
        raise RuntimeError(cells["failed"][key])
    if key not in cells[table]:
        raise NotImplementedError(cells["skipped"].get(key, "not measured in this run"))


def long_setup_cache(fn):
    """setup_cache measures a whole grid in one process: give it time."""
    fn.timeout = 3600
    return fn
