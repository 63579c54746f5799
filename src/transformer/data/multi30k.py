"""The Multi30k dataset (Elliott et al., 2016): file names, download and checksums.

The files are those of the public repository `multi30k/dataset` (data/task1/): `raw/` holds
the cased, untokenized sentences we train and score on by default; `tok/` the dataset's
lowercased, punctuation-normalized, Moses-tokenized ones (`*.lc.norm.tok.LANG`), which
published results train on (`data.tokenized`) and are scored against (`--paper-protocol`).
Every download is checked against the SHA-256 below before it becomes visible under its name,
so a file that exists is trusted.
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

from ..errors import DataError
from ..files import atomic_write

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
    "tok/train.lc.norm.tok.cs":
        "7645fb91efa18f94c83d493f740a5d5a941e4b01efa6a124bf2d4af040e133e0",
    "tok/train.lc.norm.tok.de":
        "cb5a23529b65ec2061f1dc446192a9c37382b63cc75f81a0be59d34894b3a505",
    "tok/train.lc.norm.tok.en":
        "08925f8e0572bcd5a006702fc5fe20e2d77c6917d4eebd576fc20de6693c2119",
    "tok/train.lc.norm.tok.fr":
        "8fa41bb718412bcb7c5dfa58603842810a01543eae86a51279f9886b901266e1",
}


def split_file(root: PathLike, split: str, lang: str, tokenized: bool = False) -> Path:
    """The file of `split` ("train", "valid", "test") in `lang`: the raw one, e.g.
    ROOT/val.en.gz, or with `tokenized` the dataset's lowercased, Moses-tokenized one, e.g.
    ROOT/tok/val.lc.norm.tok.en."""
    return Path(root).expanduser() / _name(STEMS[split], lang, tokenized)


def _name(stem: str, lang: str, tokenized: bool) -> str:
    """A file's name under the root, as `SHA256` keys it."""
    return f"tok/{stem}.lc.norm.tok.{lang}" if tokenized else f"{stem}.{lang}.gz"


def download_multi30k(root: PathLike, langs: Sequence[str] = ("en", "de"), *,
                      base_url: str = URL, tokenized: bool = False,
                      tok_url: str = TOK_URL) -> None:
    """Download the train/val/test_2016_flickr files of `langs` missing from `root`: the raw
    ones from `base_url`, or with `tokenized` the dataset's lowercased, Moses-tokenized ones
    (what a run with `data.tokenized` trains and validates on, and the references of
    `--paper-protocol`) from `tok_url` into `root/tok/`."""
    root = Path(root).expanduser()
    url = (tok_url if tokenized else base_url).rstrip("/") + "/"
    for stem in STEMS.values():
        for lang in langs:
            name = _name(stem, lang, tokenized)
            if not (root / name).is_file():
                download_file(url + name.removeprefix("tok/"), root / name, SHA256[name])


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
