#!/usr/bin/python3
"""Each folder of src/ includes only the folders docs/ARCHITECTURE.md's table of floors
allows it (its last column), so that dependencies point down and nothing below abi/
reaches into it. Fails naming each include that breaks the table."""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
allowed = {}
for line in (root / "docs/ARCHITECTURE.md").read_text().splitlines():
    m = re.match(r"\| (\d+) \| `(\w+)/` \|", line)
    if m:
        cells = [c.strip() for c in line.split("|")]
        allowed[m.group(2)] = set(re.findall(r"`(\w+)`", cells[4])) | {m.group(2)}
folders = {p.name for p in (root / "src").iterdir() if p.is_dir()}
bad = [f"src/{f}/: no row in docs/ARCHITECTURE.md's table" for f in sorted(folders - set(allowed))]
for path in sorted((root / "src").glob("*/*")):
    if path.suffix not in (".hpp", ".cpp", ".h", ".cu"):
        continue
    for n, text in enumerate(path.read_text().splitlines(), 1):
        m = re.match(r'#include "(\w+)/', text)
        folder = path.parent.name
        if m and m.group(1) in folders and m.group(1) not in allowed.get(folder, set()):
            bad.append(f"{path.relative_to(root)}:{n}: {folder}/ may not include {m.group(1)}/")
if bad:
    print("\n".join(bad))
    sys.exit(1)
print(f"check_floors: {len(allowed)} folders of src/ include only what their floor allows")
