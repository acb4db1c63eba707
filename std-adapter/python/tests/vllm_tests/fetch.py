"""Fetches vLLM 0.33.0's own offloading tests from its source distribution.

    python fetch.py DEST        # prints DEST once DEST/tests/v1/ holds them

The source distribution (47 MB) comes from the package index pip uses (``PIP_INDEX_URL``,
else PyPI), found through the index's JSON page (PEP 691) as pip finds it, checked against the
SHA-256 below and kept in a cache (``KVTIER_CACHE_DIR``, else ``~/.cache/kvtier``), so a machine
downloads it once; ``VLLM_SDIST=/path/to/vllm-0.33.0.tar.gz`` uses a local copy instead.
``pip download vllm==0.33.0 --no-deps --no-binary :all:`` cannot fetch it: pip prepares the
package's metadata before it saves a source distribution, and vLLM's build requires torch
2.14.0, which with ``--no-binary :all:`` pip tries to build from source.

Only ``tests/v1/kv_offload/`` and ``tests/v1/simple_kv_offload/`` (and the two ``__init__.py``
above them, which make them the packages their files import from) are unpacked, unchanged.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

NAME = "vllm-0.33.0.tar.gz"
SHA256 = "f4c33c2503d52bb411146afa9618a4f48bed68912f617e6803ac8d76e4c74112"
ROOT = "vllm-0.33.0/"
WANTED = (
    "tests/__init__.py",
    "tests/v1/__init__.py",
    "tests/v1/kv_offload/",
    "tests/v1/simple_kv_offload/",
)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def index_url() -> str:
    return os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")


def download(to: Path) -> None:
    """Downloads the source distribution to ``to``, checked."""
    req = urllib.request.Request(
        f"{index_url()}/vllm/",
        headers={"Accept": "application/vnd.pypi.simple.v1+json"},
    )
    with urllib.request.urlopen(req, timeout=180) as r:
        page = json.load(r)
    (entry,) = [f for f in page["files"] if f["filename"] == NAME]
    if entry["hashes"].get("sha256") != SHA256:
        raise SystemExit(f"the index lists {NAME} with another SHA-256: {entry['hashes']}")
    to.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=to.parent, delete=False) as tmp:
        try:
            with urllib.request.urlopen(entry["url"], timeout=180) as r:
                shutil.copyfileobj(r, tmp)
        except BaseException:
            os.unlink(tmp.name)
            raise
    if sha256(Path(tmp.name)) != SHA256:
        os.unlink(tmp.name)
        raise SystemExit(f"{NAME}: the download's SHA-256 is not {SHA256}")
    os.replace(tmp.name, to)


def sdist() -> Path:
    local = os.environ.get("VLLM_SDIST")
    if local:
        path = Path(local)
    else:
        cache = Path(
            os.environ.get("KVTIER_CACHE_DIR", Path.home() / ".cache" / "kvtier")
        )
        path = cache / NAME
        if not path.exists():
            print(f"fetch.py: downloading {NAME} (47 MB, once) from {index_url()}",
                  file=sys.stderr)
            download(path)
    if sha256(path) != SHA256:
        raise SystemExit(f"{path}: SHA-256 is not {SHA256}")
    return path


def stamp_text() -> str:
    """What ``DEST/SHA256`` holds: the archive's SHA-256 and the unpacked folders, so that a
    copy unpacked with another list is unpacked again."""
    return SHA256 + "\n" + "\n".join(WANTED) + "\n"


def unpack(archive: Path, dest: Path) -> None:
    """Unpacks the wanted members of ``archive`` into ``dest`` (replacing it)."""
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=dest.name + "."))
    with tarfile.open(archive) as tar:
        members = []
        for m in tar.getmembers():
            rel = m.name[len(ROOT):] if m.name.startswith(ROOT) else None
            if rel is None or not (m.isfile() or m.isdir()):
                continue
            if any(rel == w or (w.endswith("/") and rel.startswith(w)) for w in WANTED):
                m.name = rel
                members.append(m)
        if hasattr(tarfile, "data_filter"):
            tar.extractall(tmp, members=members, filter="data")
        else:  # Python before 3.11.4: the members were checked to be plain files and dirs
            tar.extractall(tmp, members=members)
    (tmp / "SHA256").write_text(stamp_text())
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(tmp, dest)


def main() -> None:
    dest = Path(sys.argv[1]).resolve()
    stamp = dest / "SHA256"
    if not (stamp.exists() and stamp.read_text() == stamp_text()):
        dest.parent.mkdir(parents=True, exist_ok=True)
        unpack(sdist(), dest)
    print(dest)


if __name__ == "__main__":
    main()
