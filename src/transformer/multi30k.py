"""The Multi30k dataset (Elliott et al., 2016): file names, download and checksums.

The files are those of the public repository `multi30k/dataset` (data/task1/): `raw/` holds
the cased, untokenized sentences we train and score on; `tok/` the dataset's lowercased,
Moses-tokenized validation and test references that published results are scored against
(`translator.paper_protocol`). Every download is checked against the SHA-256 below before it
becomes visible under its name, so a file that exists is trusted.
"""

from __future__ import annotations

import hashlib
import logging
import os
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Union

from .errors import DataError
from .files import atomic_write

__all__ = ["URL", "TOK_URL", "LANGS", "STEMS", "SHA256", "DEFAULT_ROOT", "split_file",
           "download_multi30k", "download_file"]

log = logging.getLogger(__name__)

PathLike = Union[str, "os.PathLike[str]"]

URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/"
TOK_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/tok/"
DEFAULT_ROOT = "~/.cache/transformer/multi30k"  # where downloads go unless data.root says
LANGS = ("en", "de", "fr", "cs")
STEMS = {"train": "train", "valid": "val", "test": "test_2016_flickr"}  # split -> file stem
# SHA-256 of the files in multi30k/dataset, data/task1/raw/ and data/task1/tok/ (unchanged).
SHA256 = {
    "test_2016_flickr.cs.gz": "200a4a74cc9560f051924abb9803be008d1908d77f747e9141aeb86dfd2797f1",
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
    "test_2016_flickr.fr.gz": "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90",
    "train.cs.gz": "a65adb8b32e3bc664f21ecba7a6e7f6950fd1f405e135f7c312faabdb6255077",
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "train.fr.gz": "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c",
    "val.cs.gz": "b63226e05c4bd5dd6a42897d74b86a1b9d2c31498252c572b1ea7f7996927fcc",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "val.fr.gz": "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9",
    "tok/test_2016_flickr.lc.norm.tok.cs":
        "748c8816de928732365176e5c5d2f9bbabcec9b8d4448fba2d230feb057898a7",
    "tok/test_2016_flickr.lc.norm.tok.de":
        "c6a33d39d48f9f510de147651316cd9d918e09ad0219df734a2f16b6baccacc4",
    "tok/test_2016_flickr.lc.norm.tok.en":
        "5b7f32627cf99eced828311b955dae9800bb52bc8b91cf8b6526829e605b29d2",
    "tok/test_2016_flickr.lc.norm.tok.fr":
        "1463bd5960f9bfe098ec3cd752d3df0c49c84dc646fb518964a29232658cd836",
    "tok/val.lc.norm.tok.cs": "b87ee4917f4a0f9ca6cca03e402026c9f4437dc1bd6a7dadfd2544ecfb6c5501",
    "tok/val.lc.norm.tok.de": "97232bd273eceb7207f689527386a97e4be2616b18ada47576bdaf96c8ae1f00",
    "tok/val.lc.norm.tok.en": "46573ce391ae227f1c72f873392436a20ef18e0a6d518098cfbd70b77c8572ec",
    "tok/val.lc.norm.tok.fr": "b303e301aa21fe7822a846b2b3fb2d5a1121ec807cd5b1d006fb7b2b5507168a",
}


def split_file(root: PathLike, split: str, lang: str) -> Path:
    """The raw file of `split` ("train", "valid", "test") in `lang`, e.g. ROOT/val.en.gz."""
    return Path(root).expanduser() / f"{STEMS[split]}.{lang}.gz"


def download_multi30k(root: PathLike, langs: Sequence[str] = ("en", "de"), *,
                      base_url: str = URL, tokenized: bool = False) -> None:
    """Download the train/val/test_2016_flickr files of `langs` missing from `root`; with
    `tokenized`, also the dataset's tokenized val/test references into `root/tok/`."""
    root = Path(root).expanduser()
    names = [f"{stem}.{lang}.gz" for stem in STEMS.values() for lang in langs]
    urls = [base_url.rstrip("/") + "/" + name for name in names]
    if tokenized:
        tok = [f"tok/{stem}.lc.norm.tok.{lang}" for stem in ("val", "test_2016_flickr")
               for lang in langs]
        names += tok
        urls += [TOK_URL + name.removeprefix("tok/") for name in tok]
    for name, url in zip(names, urls, strict=True):
        if not (root / name).is_file():
            download_file(url, root / name, SHA256[name])


def download_file(url: str, dest: PathLike, sha256: str, *, timeout: float = 60.0) -> None:
    """Download `url` to `dest`, verifying its SHA-256 before `dest` appears (atomically:
    `dest` never exists half-written or corrupted)."""
    dest = Path(dest)
    log.info("downloading %s -> %s", url, dest)
    digest = hashlib.sha256()
    with atomic_write(dest) as out:
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                while chunk := response.read(1 << 20):
                    out.write(chunk)
                    digest.update(chunk)
        except (urllib.error.URLError, OSError) as e:
            raise DataError(f"could not download {dest.name} from {url}: {e}") from e
        if digest.hexdigest() != sha256:
            raise DataError(
                f"checksum mismatch for {dest.name} downloaded from {url}: expected sha256 "
                f"{sha256}, got {digest.hexdigest()}; the file was not saved")
