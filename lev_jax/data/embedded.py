"""The embedded corpus: the default data of every lev_jax job, frozen in the package.

`EMBEDDED_FILE` (lev_jax/data/embedded_corpus.jsonl.zst, 0.5 MB) holds 607
Pile-format documents (2.3 MB of UTF-8 text): the ``pydoc_data.topics`` help texts and
standard-library docstrings of CPython 3.11.7, built once by `embedded_build` (which
says how to regenerate it on purpose). Shipping the file, not rebuilding it from the
running Python, makes the default job's tokenizer, splits and token counts depend on
the repository alone: another CPython patch release has other docstrings (604
documents on 3.11.2).

`embedded_documents()` reads it after checking its sha256 against `EMBEDDED_SHA256`
(a damaged or replaced file is a one-line `DataError`); `write_embedded_corpus` writes
the train / validation (/ test) split as plain JSONL under the data cache, and at every
later call checks the cached files against the corpus (sha256 of the bytes the split
gives): a truncated, damaged or edited one is named in a warning and written again.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from absl import logging
from etils import epath
import zstandard

from lev_jax.data.errors import DataError
from lev_jax.data.files import write_bytes_atomic
from lev_jax.data.splits import check_fractions, is_validation, split_of

EMBEDDED_FILE = Path(__file__).with_name("embedded_corpus.jsonl.zst")
EMBEDDED_VERSION = 1  # bump with every regeneration (it names the cache folders)
EMBEDDED_SHA256 = "7f7874306d2542d053cd86690d9b3157f8178c78dcc3c4431bea943e8d2329ce"
EMBEDDED_DOCUMENTS = 607


def cache_name() -> str:
  """The cache folder stem of this corpus: embedded-v{version}-{sha256[:12]}."""
  return f"embedded-v{EMBEDDED_VERSION}-{EMBEDDED_SHA256[:12]}"


def embedded_documents(path=EMBEDDED_FILE) -> list[dict]:
  """The frozen embedded corpus, checked.

  Args:
    path: the .jsonl.zst file (default: the one shipped in the package).
  Returns:
    EMBEDDED_DOCUMENTS Pile-format records ``{"text": str, "meta": {"pile_set_name":
    "pydoc_topics" | "stdlib_docstrings"}}``, in the file's order (pydoc topics sorted
    by topic, then standard-library modules sorted by name).
  Raises:
    DataError: the file is missing, or its sha256 is not EMBEDDED_SHA256 (damaged,
      truncated or replaced: reinstall lev_jax, or rebuild it with embedded_build).
  """
  path = Path(path)
  try:
    data = path.read_bytes()
  except OSError as e:
    raise DataError(f"{path}: cannot read the embedded corpus ({e.strerror}); reinstall "
                    "lev_jax (pip install -e .) to restore it") from None
  digest = hashlib.sha256(data).hexdigest()
  if digest != EMBEDDED_SHA256:
    raise DataError(f"{path}: sha256 {digest[:12]}... is not the embedded corpus's "
                    f"{EMBEDDED_SHA256[:12]}... (the file is damaged or was replaced); "
                    "restore it from the repository (git checkout) or reinstall lev_jax")
  text = zstandard.ZstdDecompressor().decompress(data).decode("utf-8")
  return [json.loads(line) for line in text.splitlines()]


def write_embedded_corpus(cache_dir, validation_fraction: float, test_fraction: float = 0.0
                          ) -> dict[str, epath.Path]:
  """Writes the embedded corpus as Pile-format JSONL once; returns the shard paths.

  Args:
    cache_dir: folder (str or path-like; ``~`` expanded) holding the cache subfolder
      ``embedded-v{EMBEDDED_VERSION}-{sha256[:12]}-val{fraction}``; with
      test_fraction > 0 also
      ``...-val{fraction}-test{test_fraction}`` (train and test, carved from the first
      folder's train file; validation stays the first folder's file).
    validation_fraction: share in (0, 1) of documents held out, chosen per document by
      a hash of its text (`is_validation`), so the split never depends on the order.
    test_fraction: share in [0, 1 - validation_fraction) of documents held out as a
      test split (`split_of`): taken from the training documents only, so the
      validation split is the same for every test_fraction, and 0 (the default)
      writes exactly the two-way split.

  Returns:
    ``{"train": path, "validation": path}`` to ``train.jsonl`` / ``validation.jsonl``,
    and ``"test"``: ``test.jsonl`` when test_fraction > 0. Existing files whose bytes
    are the split's are reused; missing or differing ones (a warning names them) are
    written to a temporary name, then `os.replace`-d into place.

  Raises:
    DataError: a fraction out of range (named), or a damaged embedded file.
    OSError: a cache file cannot be written.
  """
  check_fractions(validation_fraction, test_fraction)
  root = epath.Path(os.path.expanduser(os.fspath(cache_dir)))
  folder = root / f"{cache_name()}-val{validation_fraction:g}"
  if test_fraction > 0:
    return _write_test_split(folder, validation_fraction, test_fraction)
  paths = {"train": folder / "train.jsonl", "validation": folder / "validation.jsonl"}
  records = {"train": [], "validation": []}
  for doc in embedded_documents():
    split = "validation" if is_validation(doc["text"], validation_fraction) else "train"
    records[split].append(json.dumps(doc, ensure_ascii=False) + "\n")
  if _write_changed(paths, records):
    logging.info("Wrote the embedded corpus to %s (%d train, %d validation documents).",
                 folder, len(records["train"]), len(records["validation"]))
  return paths


def _write_changed(paths: dict[str, epath.Path], records: dict[str, list[str]]) -> bool:
  """Writes each split's lines to its path unless the file holds exactly those bytes
  (compared by sha256); a file that differs is named in a warning. Returns whether
  anything was written."""
  written = False
  for split, lines in records.items():
    data = "".join(lines).encode("utf-8")
    path = paths[split]
    if path.exists():
      have = hashlib.sha256(path.read_bytes()).hexdigest()
      want = hashlib.sha256(data).hexdigest()
      if have == want:
        continue
      logging.warning("%s: sha256 %s... is not the embedded corpus's %s split (%s...: "
                      "the cached file was truncated, damaged or edited); writing it again",
                      path, have[:12], split, want[:12])
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(path, data)
    written = True
  return written


def _write_test_split(two_way: epath.Path, validation_fraction: float,
                      test_fraction: float) -> dict[str, epath.Path]:
  """The three-way split, carved from the two-way cache at `two_way` (written first if
  absent): its validation file is reused as is, its training lines are divided into
  train and test by `split_of`, line for line (order kept); each checked as
  `_write_changed` does."""
  base = write_embedded_corpus(two_way.parent, validation_fraction)  # checked
  folder = two_way.parent / f"{two_way.name}-test{test_fraction:g}"
  paths = {"train": folder / "train.jsonl", "validation": base["validation"],
           "test": folder / "test.jsonl"}
  records = {"test": [], "train": []}
  for line in base["train"].read_text().splitlines(keepends=True):
    text = json.loads(line)["text"]
    records[split_of(text, validation_fraction, test_fraction)].append(line)
  if not _write_changed(paths, records):
    return paths
  logging.info("Held out %d of the embedded corpus's %d training documents as a test "
               "split in %s.", len(records["test"]),
               len(records["test"]) + len(records["train"]), folder)
  return paths
