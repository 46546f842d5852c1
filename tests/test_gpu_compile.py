"""Every kernel specialization of the shape classes compiles for sm_90 (H100/H200) through
Triton's real compiler, down to a cubin, without a GPU (scripts/compile_for_gpu.py): the
compile errors the interpreter cannot see (session 8: a fold loop's variable reused by the
kernel's own loop passed every interpreter test and would have failed on the H200)."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_kernel_compiles_for_the_h200():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "scripts/compile_for_gpu.py", "--arch", "90", "--sms", "132", "--resources",
                           "--codegen"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "compiled for sm_90" in done.stdout and "givens._fwd_kernel" in done.stdout, done.stdout
    rows = [line for line in done.stdout.splitlines() if " specializations" in line and not line.startswith("all ")]
    assert len(rows) >= 12, done.stdout
    for row in rows:  # each kernel's registers per thread from its cubins (sm_90 has 255 at most)
        low, high = map(int, row.split("registers ")[1].split()[0].split("-"))
        assert 0 < low <= high <= 255, row
    # the in-thread walking tiles keep each lane's fp32 columns and the T-scan in one thread: no
    # fp32 specialization of theirs shuffles lanes or goes scalar (the codegen report lists the
    # ones that do; session 22: the gated backward's stores had gone scalar; bf16 rows span two
    # lanes by choice, common.IN_THREAD)
    from scankit.triton import common

    flagged = done.stdout.split("per specialization")[1].splitlines()
    assert any(line.strip().startswith("elementwise._bwd_lookback_kernel") for line in flagged), done.stdout
    _, width, warps = common.IN_THREAD["tile"]
    walking = [line for line in flagged if line.strip().startswith("elementwise.") and " float32 " in line
               and f"BLOCK_D={width} " in line and f"num_warps={warps} " in line]
    assert not walking, walking


def test_codegen_counts_a_ptx_listing(monkeypatch):
    """compile_for_gpu.codegen: global stores / loads scalar or vector (whatever the cache
    modifiers), cp.async by size, shuffles, barriers and shared stores (the module refuses to load under the
    interpreter's flag; importing it here sets nothing up)."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    from compile_for_gpu import codegen

    ptx = """cp.async.cg.shared.global [ %r33 + 0 ], [ %rd10 + 0 ], 0x10, %r34;
    cp.async.ca.shared.global [ %r33 + 0 ], [ %rd10 + 0 ], 0x4, %r34;
    st.global.v4.b32 [ %rd1 + 0 ], { %r1, %r2, %r3, %r4 };
    st.global.b32 [ %rd1 + 0 ], { %r1 };
    @%p1 st.global.b16 [ %rd1 + 0 ], { %rs1 };
    ld.global.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd1 + 0 ];
    ld.global.L1::evict_last.b32 { %r1 }, [ %rd1 + 0 ];
    ld.global.L1::evict_last.v2.b32 { %r1, %r2 }, [ %rd1 + 0 ];
    shfl.sync.up.b32 %r1, %r2, 1, 0, -1;
    bar.sync 0;
    st.shared.b32 [ %r4 ], %r42;
    ld.shared.b32 %r9, [ %r3 + 0 ];"""
    assert codegen(ptx) == dict(st_scalar=2, st_vector=1, ld_scalar=1, ld_vector=2, cp_async_16=1, cp_async_small=1,
                                shfl=1, bar=1, st_shared=1)


def test_host_cost_splits_each_call_into_scankit_and_triton(tmp_path):
    """scripts/host_cost.py without a GPU: every op's forward and fwd+bwd at lab, launches
    compiled for sm_90 and replayed through Triton's binder, the rest scankit's (values not
    asserted: host speed is the machine's, and CI's is shared)."""
    import json

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = tmp_path / "host.json"
    done = subprocess.run([sys.executable, "scripts/host_cost.py", "--calls", "20", "--json", str(out)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    rows = json.loads(out.read_text())["rows"]
    floors = rows[-2:]
    rows = rows[:-2]
    assert [(f["op"], f["direction"]) for f in floors] == [("torch floor", "fwd"), ("torch floor", "fwdbwd")]
    assert all(f["total_us"] > 0 for f in floors), floors
    assert [(r["op"], r["direction"]) for r in rows] == [
        (op, direction) for op in ("parallel_scan_log", "linear_scan", "linear_scan_state", "matrix_scan",
                                   "matrix_affine_scan") for direction in ("fwd", "fwdbwd")]
    for r in rows:
        assert r["launches"] == (1 if r["direction"] == "fwd" else 2), r  # lab: one pass each way
        assert 0 < r["triton_us"] < r["total_us"] and abs(r["scankit_us"] + r["triton_us"] - r["total_us"]) < 0.15, r
        assert r["wrap_fwd_us"] > 0 and (r["wrap_bwd_us"] > 0) == (r["direction"] == "fwdbwd"), r


LAYOUT_PROBE = r"""
import json, re, sys, torch
sys.path.insert(0, "scripts")
import compile_for_gpu as c
c.gpu_target(90, 132)
irs = {}
c.compile_instead_of_launching(lambda fn, compiled, args, kw: irs.setdefault(fn.fn.__name__, compiled.asm["ttgir"]))
import scankit.triton as kernels
from scankit.triton import common
common.LOOKBACK["linear"] = "always"
found = []
for tile, window in json.loads(sys.argv[1]):
    common.LOOKBACK.update(tile=tuple(tile), window=window)
    common.lookback_tiles = lambda device, tile=tuple(tile): tile  # the probe compiles refused tiles too
    irs.clear()
    a = torch.rand(1, 1024, 256, requires_grad=True)
    h = kernels.linear_scan(a, torch.rand(1, 1024, 256), return_prefix=False)
    (h[1] if isinstance(h, tuple) else h).backward(torch.zeros(1, 1024, 256))
    for name, ir in sorted(irs.items()):
        layouts = dict(re.findall(r"^(#\w+) = #ttg\.blocked<\{(.*?)\}>", ir, re.M))
        for shape, layout in re.findall(r"isVolatile = true\} : tensor<(\d+x\d+)x!tt\.ptr<i64>, (#\w+)>", ir):
            fields = {k: [int(v) for v in vs.split(",")]
                      for k, vs in re.findall(r"(\w+) = \[([\d, ]+)\]", layouts[layout])}
            found.append(dict(tile=tile, window=window, kernel=name, shape=[int(s) for s in shape.split("x")],
                              **fields))
print(json.dumps(found))
"""


def test_look_back_status_words_are_never_split_over_warps_as_replicas():
    """The look-back's status words (a (window, BLOCK_D) volatile load) as Triton lays them out
    for sm_90: where common.lookback_tiles takes a tile, every warp holds the words whole or no
    two warps hold the same word (each warp then decides on its own loads); the tile it refuses,
    (128, 64, 4) at window 1 (wrong states on the H100, session 38), splits them over two warps a
    replica. Production's tile is among those taken."""
    import json

    from scankit.triton import common

    taken = [(list(common.LOOKBACK["tile"]), common.LOOKBACK["window"]), ([256, 32, 8], 1), ([128, 32, 4], 4),
             ([128, 64, 4], 2), ([64, 128, 4], 1)]
    refused = [([128, 64, 4], 1)]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", LAYOUT_PROBE, json.dumps(taken + refused)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    loads = json.loads(done.stdout.splitlines()[-1])

    def split_replicas(load):
        warp = [s * t for s, t in zip(load["sizePerThread"], load["threadsPerWarp"])]
        block = [w * n for w, n in zip(warp, load["warpsPerCTA"])]
        whole_in_a_warp = all(n <= w for n, w in zip(load["shape"], warp))
        no_replicas = all(n >= b for n, b in zip(load["shape"], block))
        return not (whole_in_a_warp or no_replicas)

    for tile, window in taken + refused:
        mine = [x for x in loads if (x["tile"], x["window"]) == (tile, window)]
        assert {x["kernel"] for x in mine} == {"_fwd_lookback_kernel", "_bwd_lookback_kernel"}, (tile, window, loads)
        assert all(split_replicas(x) == ((tile, window) in refused) for x in mine), mine
