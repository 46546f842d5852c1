"""Correctness as history: failing parity cases and worst error / gate, per op (or mixer)
and direction. The per-case rows are kept beside the results (suite.write_parity_sidecar)."""
from benchmarks._adapter import long_setup_cache
from benchmarks.harness import grid


class Parity:
    params = [list(grid.OP_NAMES + grid.MIXER_LABELS), list(grid.PARITY_DIRECTIONS)]
    param_names = ["case", "direction"]
    timeout = 3600

    @long_setup_cache
    def setup_cache(self):
        from benchmarks.harness import report, suite

        rows = suite.parity_rows()
        suite.write_parity_sidecar(rows, report.environment())
        return suite.parity_summary(rows)

    def track_failing_cases(self, summary, case, direction):
        return summary[case, direction]["failing"]

    track_failing_cases.unit = "cases"

    def track_worst_error_over_gate(self, summary, case, direction):
        return summary[case, direction]["margin"]

    track_worst_error_over_gate.unit = "error/gate"
