#!/usr/bin/env python3
"""`asv publish` the committed results, then make the pages work offline.

asv's pages load jQuery, flot, bootstrap and friends from CDNs, so on a machine with no
internet (a GPU cluster) the dashboard is blank. This copies the pinned, vendored files
(tools/dashboard/vendor, checked against SHA256SUMS) next to the pages and points the pages
at them; it fails if any page would still load something from off the machine.
"""
import argparse
import base64
import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--html-dir", default=str(ROOT / ".asv" / "html"))
    args = parser.parse_args(argv)
    html = Path(args.html_dir)
    subprocess.run([sys.executable, "-m", "asv", "publish", "--html-dir", str(html)], cwd=ROOT, check=True)
    pages = localize(html)
    print(f"dashboard: {html} ({len(pages)} pages, assets from tools/dashboard/vendor)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
