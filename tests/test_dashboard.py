"""The published dashboard in a real browser (headless Chromium), offline: every host but
127.0.0.1 resolves to nothing, so the page can only render from what the machine serves."""
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.xdist_group(name="browser")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    if not (ROOT / "experiments" / "asv" / "results" / "h200").exists():
        pytest.skip("no committed results to publish")
    html = tmp_path_factory.mktemp("html")
    out = subprocess.run([sys.executable, "-m", "asv", "publish", "--html-dir", str(html)],  # as a user types it
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                               "--directory", str(html)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(50):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.1)
    yield dict(html=html, url=f"http://127.0.0.1:{port}/")
    server.terminate()
    server.wait(timeout=10)


def test_published_pages_load_nothing_remote(site):
    import re

    for page in site["html"].glob("*.html"):
        remote = re.findall(r'<(?:script|link|img)\b[^>]*(?:src|href)="(?:https?:)?//[^"]*"', page.read_text())
        assert not remote, f"{page.name} loads {remote}"
    assert (site["html"] / "vendor" / "jquery-3.3.1.min.js").exists()


def test_regressions_page_lists_only_gated_series(site):
    """The Regressions page watches what the gate gates (asv.conf.json regressions_first_commits):
    the kernels' device time and memory (the call forms but the looped one too), and parity. None of the former entries (block-median
    noise of unchanged kernel code, references) is listed, and what is listed is a step beyond
    the noise floor of device time (5%): e.g. the log op's range-safety cost of 5f91419."""
    import json

    sys.path.insert(0, str(ROOT / "tools"))
    import check_regressions as gate

    listed = json.loads((site["html"] / "regressions.json").read_text())["regressions"]
    names = [r[0] for r in listed]
    gated = (gate.TIME_GATED[0], gate.CALL_FORMS) + gate.MEMORY_GATED + ("bench_parity.",)
    assert all(n.startswith(gated) and "'looped'" not in n for n in names), [n for n in names if not n.startswith(gated)]
    for name, _, _, _, last, best, _ in listed:
        assert last / best >= gate.FLOOR, (name, last, best)


def chromium(url, tmp_path, *extra):
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (.ci/run installs Debian's chromium)")
    args = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}", "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
            "--virtual-time-budget=20000", "--window-size=1400,900", *extra, url]
    return subprocess.run(args, capture_output=True, text=True, timeout=180)


def test_grid_renders_offline(site, tmp_path):
    dom = chromium(site["url"], tmp_path, "--dump-dom").stdout
    tiles = dom.count('class="btn benchmark-container"')
    assert tiles >= 7, f"benchmark grid did not render ({tiles} tiles)"
    assert "bench_scans.Scans.track_device_time" in dom and "bench_parity.Parity.track_failing_cases" in dom


def test_graph_renders_with_data_points(site, tmp_path):
    url = site["url"] + "#bench_scans.Scans.track_device_time?p-op='linear_scan'&p-shape='large'"
    dom = chromium(url, tmp_path, "--dump-dom").stdout
    assert 'class="flot-base"' in dom, "no flot plot on the graph page"
    assert "flot-tick-label" in dom, "the plot drew no axes (no data points)"
    shot = tmp_path / "graph.png"
    chromium(url, tmp_path, f"--screenshot={shot}")
    assert shot.exists() and shot.stat().st_size > 10_000
