#!/usr/bin/env python3
"""Fill tools/dashboard/vendor/ from the npm registry (`npm pack`), with each package's
licence, and record every file's sha256 in vendor/SHA256SUMS. Run when vendor.json changes;
the result is committed, so publishing and CI need no network."""
import hashlib
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
VENDOR = HERE / "vendor"


def main() -> int:
    spec = json.loads((HERE / "vendor.json").read_text())
    VENDOR.mkdir(exist_ok=True)
    sums = []
    with tempfile.TemporaryDirectory() as tmp:
        packs = {}
        for asset in spec["assets"]:
            pkg = asset["npm"]
            if pkg not in packs:
                name = subprocess.run(["npm", "pack", pkg, "--silent"], cwd=tmp, check=True,
                                      capture_output=True, text=True).stdout.strip().splitlines()[-1]
                packs[pkg] = tarfile.open(Path(tmp) / name)
            tar = packs[pkg]
            data = tar.extractfile(f"package/{asset['file']}").read()
            (VENDOR / asset["local"]).write_bytes(data)
            sums.append(f"{hashlib.sha256(data).hexdigest()}  {asset['local']}")
            licence = next((m for m in tar.getmembers() if m.name.lower().split("/")[-1].startswith(("license", "licence"))
                            and m.name.count("/") == 1), None)
            lic_name = f"LICENSE.{pkg.split('@')[0]}"
            if licence is not None:
                (VENDOR / lic_name).write_bytes(tar.extractfile(licence).read())
            elif not (VENDOR / lic_name).exists():
                meta = json.loads(tar.extractfile("package/package.json").read())
                (VENDOR / lic_name).write_text(f"{pkg}: licence {meta.get('license', 'see package')} "
                                               "(the package ships no licence file)\n")
    (VENDOR / "SHA256SUMS").write_text("\n".join(sums) + "\n")
    print(f"vendored {len(spec['assets'])} files into {VENDOR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
