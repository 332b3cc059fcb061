"""The embedded corpora: the default data of every lev_jax job and two prose presets,
frozen in the package (``data.source = 'embedded'``, chosen by ``data.corpus``).

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

`CORPORA` names every frozen corpus (``data.corpus``): ``python_docs`` is the one above
(the default); ``debian_books`` (four Debian manuals, 1,050 documents, 2.0 MB of text,
GPL-2.0+) and ``foldoc`` (the Free On-line Dictionary of Computing, 6,366 entries,
3.9 MB, GFDL-1.1+) are English prose built from pinned Debian packages by
`corpora_build` (``corpora/manifest.json`` gives their sources, licences and counts),
read, checked and split the same way, each under its own cache folder.
"""

from __future__ import annotations

import dataclasses
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


CORPORA_DIR = Path(__file__).with_name("corpora")
DEFAULT_CORPUS = "python_docs"
_REBUILD = "python -m lev_jax.data.corpora_build --output-dir lev_jax/data/corpora"


@dataclasses.dataclass(frozen=True)
class FrozenCorpus:
  """One frozen corpus shipped in the package: its file, sha256, documents, version
  (bumped with every regeneration; it names the cache folders) and cache-folder stem."""
  name: str
  path: Path
  sha256: str
  documents: int
  version: int
  stem: str
  label: str    # how messages name it
  rebuild: str  # how to make the file again


CORPORA = {
    DEFAULT_CORPUS: FrozenCorpus(
        DEFAULT_CORPUS, EMBEDDED_FILE, EMBEDDED_SHA256, EMBEDDED_DOCUMENTS,
        EMBEDDED_VERSION, "embedded", "the embedded corpus",
        "python -m lev_jax.data.embedded_build"),
    "debian_books": FrozenCorpus(
        "debian_books", CORPORA_DIR / "debian_books.jsonl.zst",
        "4e09ab795054395fc664bd870c44c68af2a1494b36d01f1a97d10177cae3c237", 1050, 1,
        "debian_books", "the debian_books corpus", _REBUILD),
    "foldoc": FrozenCorpus(
        "foldoc", CORPORA_DIR / "foldoc.jsonl.zst",
        "a541166f2cbd167bdac4416487bb527a71d4563dcf1bd12821e652a4540a55c9", 6366, 1,
        "foldoc", "the foldoc corpus", _REBUILD),
}


def frozen_corpus(name: str) -> FrozenCorpus:
  """The `CORPORA` entry called `name`.

  Raises:
    DataError: an unknown name: one line naming config.data.corpus and the names.
  """
  if name not in CORPORA:
    raise DataError(f"config.data.corpus = {name!r}: expected one of "
                    + ", ".join(repr(n) for n in CORPORA))
  return CORPORA[name]


def cache_name(corpus: str = DEFAULT_CORPUS) -> str:
  """The cache folder stem of a corpus: {stem}-v{version}-{sha256[:12]}
  (embedded-v1-... for the default)."""
  spec = frozen_corpus(corpus)
  return f"{spec.stem}-v{spec.version}-{spec.sha256[:12]}"


def embedded_documents(path=None, corpus: str = DEFAULT_CORPUS) -> list[dict]:
  """A frozen corpus, checked.

  Args:
    path: the .jsonl.zst file (default: the corpus's file shipped in the package).
    corpus: a `CORPORA` name (``data.corpus``); its sha256 is the one checked.
  Returns:
    The corpus's Pile-format records ``{"text": str, "meta": {"pile_set_name": str,
    ...}}`` in the file's order: for the default, EMBEDDED_DOCUMENTS records of subsets
    "pydoc_topics" | "stdlib_docstrings" (pydoc topics sorted by topic, then
    standard-library modules sorted by name); for the presets see `corpora_build`.
  Raises:
    DataError: an unknown corpus name; the file is missing, or its sha256 is not the
      corpus's (damaged, truncated or replaced: restore it, or rebuild it with
      embedded_build / corpora_build); one line naming the file and the corpus.
  """
  spec = frozen_corpus(corpus)
  path = Path(spec.path if path is None else path)
  field = "" if corpus == DEFAULT_CORPUS else f"config.data.corpus = {corpus!r}: "
  try:
    data = path.read_bytes()
  except OSError as e:
    raise DataError(f"{field}{path}: cannot read {spec.label} ({e.strerror}); expected "
                    "the file shipped with lev_jax: restore it (git checkout), reinstall "
                    f"lev_jax (pip install -e .) or rebuild it ({spec.rebuild})") from None
  digest = hashlib.sha256(data).hexdigest()
  if digest != spec.sha256:
    raise DataError(f"{field}{path}: sha256 {digest[:12]}... is not {spec.label}'s "
                    f"{spec.sha256[:12]}... (the file is damaged or was replaced); "
                    "restore it from the repository (git checkout) or reinstall lev_jax")
  text = zstandard.ZstdDecompressor().decompress(data).decode("utf-8")
  return [json.loads(line) for line in text.splitlines()]


def write_embedded_corpus(cache_dir, validation_fraction: float, test_fraction: float = 0.0,
                          corpus: str = DEFAULT_CORPUS) -> dict[str, epath.Path]:
  """Writes a frozen corpus as Pile-format JSONL once; returns the shard paths.

  Args:
    cache_dir: folder (str or path-like; ``~`` expanded) holding the cache subfolder
      ``{cache_name(corpus)}-val{fraction}`` (``embedded-v{EMBEDDED_VERSION}-
      {sha256[:12]}-val{fraction}`` for the default corpus); with
      test_fraction > 0 also
      ``...-val{fraction}-test{test_fraction}`` (train and test, carved from the first
      folder's train file; validation stays the first folder's file).
    validation_fraction: share in (0, 1) of documents held out, chosen per document by
      a hash of its text (`is_validation`), so the split never depends on the order.
    test_fraction: share in [0, 1 - validation_fraction) of documents held out as a
      test split (`split_of`): taken from the training documents only, so the
      validation split is the same for every test_fraction, and 0 (the default)
      writes exactly the two-way split.
    corpus: a `CORPORA` name (``data.corpus``; default: the CPython texts).

  Returns:
    ``{"train": path, "validation": path}`` to ``train.jsonl`` / ``validation.jsonl``,
    and ``"test"``: ``test.jsonl`` when test_fraction > 0. Existing files whose bytes
    are the split's are reused; missing or differing ones (a warning names them) are
    written to a temporary name, then `os.replace`-d into place.

  Raises:
    DataError: a fraction out of range (named), an unknown corpus, or a missing or
      damaged corpus file (`embedded_documents`).
    OSError: a cache file cannot be written.
  """
  check_fractions(validation_fraction, test_fraction)
  spec = frozen_corpus(corpus)
  root = epath.Path(os.path.expanduser(os.fspath(cache_dir)))
  folder = root / f"{cache_name(corpus)}-val{validation_fraction:g}"
  if test_fraction > 0:
    return _write_test_split(folder, validation_fraction, test_fraction, corpus)
  paths = {"train": folder / "train.jsonl", "validation": folder / "validation.jsonl"}
  records = {"train": [], "validation": []}
  for doc in embedded_documents(corpus=corpus):
    split = "validation" if is_validation(doc["text"], validation_fraction) else "train"
    records[split].append(json.dumps(doc, ensure_ascii=False) + "\n")
  _check_not_empty(records, "validation", "validation_fraction", validation_fraction,
                   spec.label)
  _check_not_empty(records, "train", "validation_fraction", validation_fraction,
                   spec.label)
  if _write_changed(paths, records, spec.label):
    logging.info("Wrote %s to %s (%d train, %d validation documents).", spec.label,
                 folder, len(records["train"]), len(records["validation"]))
  return paths


def _check_not_empty(records: dict[str, list[str]], split: str, field: str,
                     fraction: float, label: str) -> None:
  """DataError naming the fraction when it leaves `split` without documents (checked
  before any file is written, so a refused split leaves no cache folder behind)."""
  if records[split]:
    return
  total = sum(len(lines) for lines in records.values())
  raise DataError(f"{field} = {fraction!r} leaves the {split} split of {label} ({total:,} "
                  f"documents) empty; expected a {'larger' if split != 'train' else 'smaller'}"
                  " share")


def _write_changed(paths: dict[str, epath.Path], records: dict[str, list[str]],
                   label: str = "the embedded corpus") -> bool:
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
      logging.warning("%s: sha256 %s... is not %s's %s split (%s...: the cached "
                      "file was truncated, damaged or edited); writing it again",
                      path, have[:12], label, split, want[:12])
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(path, data)
    written = True
  return written


def _write_test_split(two_way: epath.Path, validation_fraction: float,
                      test_fraction: float, corpus: str) -> dict[str, epath.Path]:
  """The three-way split, carved from the two-way cache at `two_way` (written first if
  absent): its validation file is reused as is, its training lines are divided into
  train and test by `split_of`, line for line (order kept); each checked as
  `_write_changed` does."""
  label = frozen_corpus(corpus).label
  base = write_embedded_corpus(two_way.parent, validation_fraction,
                               corpus=corpus)  # checked
  folder = two_way.parent / f"{two_way.name}-test{test_fraction:g}"
  paths = {"train": folder / "train.jsonl", "validation": base["validation"],
           "test": folder / "test.jsonl"}
  records = {"test": [], "train": []}
  for line in base["train"].read_text().splitlines(keepends=True):
    text = json.loads(line)["text"]
    records[split_of(text, validation_fraction, test_fraction)].append(line)
  _check_not_empty(records, "test", "test_fraction", test_fraction, label)
  _check_not_empty(records, "train", "test_fraction", test_fraction, label)
  if not _write_changed(paths, records, label):
    return paths
  logging.info("Held out %d of %s's %d training documents as a test split in %s.",
               len(records["test"]), label,
               len(records["test"]) + len(records["train"]), folder)
  return paths
