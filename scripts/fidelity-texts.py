#!/usr/bin/env python3
"""Builds the fidelity suite of `hillside eval --suite`: texts of several kinds that no default
was tuned on, from Debian's packages, a crate on crates.io and the shared papers, each download
checked against its SHA-256. Writes one file per text into the folder given (default
~/.cache/hillside/fidelity) and prints the folder.

    scripts/fidelity-texts.py [folder]

A `.txt` file is read as plain text; a `.chat.json` file is a conversation (OpenAI-style
messages) that `hillside eval` renders with the model's own chat template.
"""

import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Debian 12's packages, pinned by version and by the SHA-256 of the .deb.
DEBS = {
    "fortunes": ("1:1.99.1-7.3", "41d0551dc0ff52f875a2ecef7c39da2f672ab468c37e170119f7e0245a9d63c5"),
    "manpages-de": ("4.18.1-1", "37d2e7ee51f22952aecec3af93647ff59194a3c74bb7a694560f49c7f7ab3978"),
    "debian-faq": ("11.1", "427426e0cfa6888622fc1d72631071cb4b5a1f86ccde722e7820bcef284de5d0"),
    "dict-devil": ("1.0-13.1", "6a535684def2a1f70cd42da16d12d43f0e9dc3e54e4a329178eebab3170e3154"),
}
CRATE = (
    "https://static.crates.io/crates/regex-syntax/regex-syntax-0.8.5.crate",
    "2b15c43186be67a4fd63bee50d0303afffcef381492ebe2c5d87f324e1b8815c",
)
# HILOS (ASPLOS '26), one of the papers in ../shared/seeds.
PAPER = ROOT.parent / "shared" / "seeds" / "000_adcb6b8d013ba2e4.txt"


def checked(data: bytes, sha256: str, what: str) -> bytes:
    got = hashlib.sha256(data).hexdigest()
    if got != sha256:
        sys.exit(f"fidelity-texts: {what} has SHA-256 {got}, expected {sha256}")
    return data


def deb_files(name: str, scratch: Path) -> Path:
    """Downloads and unpacks one pinned package; returns the folder it unpacked into."""
    version, sha256 = DEBS[name]
    got = subprocess.run(["apt-get", "download", "-q", f"{name}={version}"], cwd=scratch, capture_output=True, text=True)
    if got.returncode != 0:
        sys.exit(f"fidelity-texts: apt-get download {name}={version} failed:\n{got.stderr}")
    deb = next(scratch.glob(f"{name}_*.deb"))
    checked(deb.read_bytes(), sha256, deb.name)
    out = scratch / name
    subprocess.run(["dpkg-deb", "-x", str(deb), str(out)], check=True)
    return out


def paragraphs(lines):
    """Joins wrapped lines into paragraphs (blank lines separate them)."""
    text = "\n".join(line.strip() for line in lines)
    return [" ".join(p.split()) for p in re.split(r"\n\s*\n", text) if p.strip()]


def poems(fortunes: Path) -> str:
    """Verse: the fortune files' songs and poems, one after another."""
    raw = (fortunes / "usr/share/games/fortunes/songs-poems").read_text(encoding="utf-8")
    return "\n\n".join(p.strip("\n") for p in raw.split("\n%\n") if p.strip()) + "\n"


def satire(devil: Path) -> str:
    """Prose with verse in it: Ambrose Bierce's The Devil's Dictionary (1911), from its first entry."""
    raw = gzip.decompress((devil / "usr/share/dictd/devil.dict.dz").read_bytes()).decode("utf-8")
    return raw[raw.index("A, n."):]


def manual_de(manpages: Path) -> str:
    """German: find(1) translated, its roff markup reduced to text (no formatter, so the text is
    the same on every machine)."""
    roff = gzip.decompress((manpages / "usr/share/man/de/man1/find.1.gz").read_bytes()).decode("utf-8")
    escapes = {r"\-": "-", r"\(aq": "'", r"\(dq": '"', r"\(lq": "“", r"\(rq": "”", r"\(Fo": "»",
               r"\(Fc": "«", r"\(em": "—", r"\(en": "–", r"\(bu": "•", r"\e": "\\", r"\&": "", r"\ ": " ",
               r"\~": " ", r"\:": "", r"\%": "", r"\|": "", r"\^": "", r"\(co": "©", r"\(ti": "~"}
    out = []
    for line in roff.splitlines():
        if line.startswith((".\\\"", "'\\\"")):
            continue
        if line.startswith("."):
            macro, _, rest = line[1:].partition(" ")
            if macro in ("SH", "SS"):
                out.extend(["", rest.strip('"').upper() if macro == "SH" else rest.strip('"')])
            elif macro in ("B", "I", "BR", "IR", "RB", "RI", "BI", "IB") and rest:
                out.append(re.sub(r'"', "", rest) if macro in ("B", "I") else "".join(re.findall(r'"[^"]*"|\S+', rest)).replace('"', ""))
            elif macro in ("PP", "P", "LP", "TP", "IP", "sp", "br"):
                out.append("")
                if macro == "IP" and rest:
                    out.append(rest.split('"')[1] if rest.startswith('"') else rest.split(" ")[0])
            continue
        out.append(line)
    text = "\n".join(out)
    text = re.sub(r"\\f(\[[^\]]*\]|.)", "", text)
    for escape, plain in escapes.items():
        text = text.replace(escape, plain)
    text = re.sub(r"\\\*\(..|\\\*.", "", text)
    return re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"


def source_code(crate: bytes) -> str:
    """Source code: regex-syntax 0.8.5's parser (Rust, with its doc comments and tests)."""
    with tarfile.open(fileobj=io.BytesIO(crate), mode="r:gz") as tar:
        member = tar.extractfile("regex-syntax-0.8.5/src/ast/parse.rs")
        return member.read().decode("utf-8")


def chat(faq: Path) -> str:
    """A long chat: the Debian FAQ's questions as the user's turns, its answers as the
    assistant's."""
    raw = gzip.decompress((faq / "usr/share/doc/debian/FAQ/debian-faq.en.txt.gz").read_bytes()).decode("utf-8")
    raw = raw.replace("\u00a0", " ")
    body = raw[raw.index("\nChapter 1."):]
    heading = re.compile(r"^(\d+)\.(\d+)\. (.*)$")
    messages, question, answer = [], None, []

    def flush():
        if question and answer:
            messages.append({"role": "user", "content": question})
            messages.append({"role": "assistant", "content": "\n\n".join(paragraphs(answer))})

    lines = body.splitlines()
    i = 0
    while i < len(lines):
        match = heading.match(lines[i])
        if match:
            flush()
            title = [match.group(3)]
            while i + 1 < len(lines) and lines[i + 1].strip():  # a question wrapped over lines
                i += 1
                title.append(lines[i].strip())
            question, answer = " ".join(title), []
        elif lines[i].startswith("Chapter "):
            flush()
            question, answer = None, []
        elif question:
            answer.append(lines[i])
        i += 1
    flush()
    system = {"role": "system", "content": "You answer questions about Debian, briefly and accurately."}
    return json.dumps([system] + messages, ensure_ascii=False, indent=1) + "\n"


def main():
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else Path.home() / ".cache/hillside/fidelity")
    folder.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        with urllib.request.urlopen(CRATE[0], timeout=120) as response:
            crate = checked(response.read(), CRATE[1], CRATE[0])
        texts = {
            "verse.txt": poems(deb_files("fortunes", scratch)),
            "satire.txt": satire(deb_files("dict-devil", scratch)),
            "german.txt": manual_de(deb_files("manpages-de", scratch)),
            "code.txt": source_code(crate),
            "paper.txt": PAPER.read_text(encoding="utf-8"),
            "chat.chat.json": chat(deb_files("debian-faq", scratch)),
        }
    # Written beside the folder and renamed into place, so that it is whole or absent.
    staging = Path(tempfile.mkdtemp(prefix=".fidelity-", dir=folder.parent))
    for name, text in texts.items():
        path = staging / name
        path.write_text(text, encoding="utf-8")
        os.chmod(path, 0o600)
    if folder.exists():
        shutil.rmtree(folder)
    staging.rename(folder)
    print(folder)


if __name__ == "__main__":
    main()
