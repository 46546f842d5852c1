"""tools/kernel_commits.py --missing: the backfill's list is the kernel commits without this
harness's device time, whatever older suites left for them."""
import json

from tools import kernel_commits as kc


def _result(path, commit, entry):
    path.write_text(json.dumps({"commit_hash": commit, "result_columns": ["result", "params", "version"],
                                "results": {kc.DEVICE_TIME: entry} if entry else {}}))


def test_only_current_version_results_with_a_value_count_as_measured(tmp_path, monkeypatch):
    (tmp_path / "benchmarks.json").write_text(json.dumps({kc.DEVICE_TIME: {"version": "v2"}}))
    machine = tmp_path / "gpu"
    machine.mkdir()
    (machine / "machine.json").write_text("{}")
    _result(machine / "aaaaaaaa-virtualenv.json", "a" * 40, [[1e-5, None], [["'x'"]], "v2"])
    _result(machine / "bbbbbbbb-existing.json", "b" * 40, [[1e-5], [["'x'"]], "v1"])   # an older suite's
    _result(machine / "cccccccc-virtualenv.json", "c" * 40, [[None, None], [["'x'"]], "v2"])  # every cell failed
    _result(machine / "dddddddd-virtualenv.json", "d" * 40, None)  # another benchmark only
    monkeypatch.setattr(kc, "RESULTS", tmp_path)
    assert kc.measured("gpu") == {"aaaaaaaa"}


def test_missing_lists_the_unmeasured_kernel_commits(monkeypatch, capsys):
    hashes = kc.kernel_commits()
    assert hashes and all(len(h) == 40 for h in hashes)
    monkeypatch.setattr(kc, "measured", lambda machine: {hashes[0][:8]})
    assert kc.main(["--missing", "gpu"]) == 0
    out, err = capsys.readouterr()
    assert out.split() == hashes[1:]
    assert f"1 of {len(hashes)} kernel commits measured on gpu" in err
