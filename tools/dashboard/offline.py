"""An asv plugin (``asv.conf.json``: ``"plugins": [".tools.dashboard.offline"]``): plain
``asv publish``, run from the repository root, writes a dashboard that works offline.

asv's pages load jQuery, flot, bootstrap and friends from CDNs, so on a machine with no
internet (a GPU cluster) the dashboard is blank. After asv writes its pages, this copies the
pinned, vendored files (tools/dashboard/vendor, checked against SHA256SUMS) next to them and
points the pages at them; publishing fails if any page would still load something from off
the machine.
"""
import base64
import hashlib
import json
import math
import re
import shutil
from pathlib import Path

from asv.console import log
from asv.publishing import OutputPublisher

HERE = Path(__file__).resolve().parent
REMOTE = re.compile(r'<(?:script|link|img)\b[^>]*(?:src|href)="(https?:)?//[^"]*"', re.I)


def vendored() -> dict:
    """{cdn url: local file name}, after checking every vendored file's sha256."""
    sums = dict(reversed(line.split("  ")) for line in (HERE / "vendor" / "SHA256SUMS").read_text().splitlines())
    for name, digest in sums.items():
        if hashlib.sha256((HERE / "vendor" / name).read_bytes()).hexdigest() != digest:
            raise SystemExit(f"publish: vendor/{name} does not match SHA256SUMS (run fetch_vendor.py)")
    return {a["cdn"]: a["local"] for a in json.loads((HERE / "vendor.json").read_text())["assets"]}


def _with_own_integrity(text: str, local: str) -> str:
    """Give the tag that loads vendor/<local> the SRI hash of our copy (asv's pages carry
    the CDN builds' hashes; npm's flot, for one, is the unminified source)."""
    digest = base64.b64encode(hashlib.sha512((HERE / "vendor" / local).read_bytes()).digest()).decode()

    def fix(match):
        tag = match.group(0)
        if f"vendor/{local}" not in tag:
            return tag
        return re.sub(r'integrity="[^"]*"', f'integrity="sha512-{digest}"', tag)

    return re.sub(r"<(?:script|link)\b[^>]*>", fix, text)


def localize(html_dir: Path) -> list[Path]:
    """Point every page at vendor/ copies; raise if a remote load is left."""
    mapping = vendored()
    target = html_dir / "vendor"
    target.mkdir(exist_ok=True)
    for path in (HERE / "vendor").iterdir():
        shutil.copy2(path, target / path.name)
    pages = sorted(html_dir.glob("*.html"))
    for page in pages:
        text = page.read_text()
        for cdn, local in mapping.items():
            text = _with_own_integrity(text.replace(cdn, f"vendor/{local}"), local)
        left = [m.group(0) for m in REMOTE.finditer(text)]
        if left:
            raise SystemExit(f"publish: {page.name} still loads from off the machine: {left}")
        page.write_text(text)
    return pages


class OfflineAssets(OutputPublisher):
    """The last step of ``asv publish``: vendor the pages' assets (no page of its own)."""

    order = math.inf

    @classmethod
    def publish(cls, conf, repo, benchmarks, graphs, revisions):
        pages = localize(Path(conf.html_dir))
        log.info(f"{len(pages)} pages point at tools/dashboard/vendor's copies: the dashboard works offline")
