"""Documents: the embedded corpus that ships with Python, and Pile-format JSONL readers.

A Pile-format line is one JSON object ``{"text": str, "meta": {"pile_set_name": str}}``
(The Pile, Gao et al. 2020, https://pile.eleuther.ai/). Files are ``*.jsonl`` or
``*.jsonl.zst`` (Zstandard, read as a stream with `zstandard.ZstdDecompressor.decompressobj`,
https://python-zstandard.readthedocs.io/). Paths go through `etils.epath`, so local paths
and ``gs://`` URLs are read the same way.

The embedded corpus needs no download: the ``pydoc_data.topics`` help texts and the
docstrings of the standard library (about 2 MB of English technical prose and code).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import inspect
import io
import json
import os
import pkgutil
import sys
import warnings
from collections.abc import Iterable, Iterator, Sequence

from absl import logging
from etils import epath
import zstandard

SKIP_REASONS = ("bad_json", "no_text", "empty", "filtered_subset")
SUFFIXES = (".jsonl", ".jsonl.zst")

# Top-level standard-library modules never imported for the embedded corpus: they act on
# import (open a browser, print, need a display or a terminal, write caches), only exist
# on other platforms, or are test suites (so is any module with "test" in its name).
_SKIP_MODULES = frozenset({
    "__main__", "antigravity", "this", "tkinter", "turtle", "turtledemo", "idlelib",
    "lib2to3", "test", "ensurepip", "distutils", "readline", "rlcompleter", "curses",
    "pydoc_data", "msilib", "msvcrt", "winreg", "winsound", "nt", "site", "sitecustomize",
    "usercustomize", "xxsubtype", "xxlimited", "__hello__", "__phello__", "_tkinter",
    "_curses", "_curses_panel", "_msi", "_winapi", "_overlapped", "_scproxy",
})
_SKIP_SUBMODULE_NAMES = frozenset({"test", "tests", "__main__", "idle_test"})
_ZST_CHUNK_BYTES = 1 << 20


class DataError(ValueError):
  """A bad data input; the message names the file (and line) and what was expected."""


# ----------------------------------------------------------------------------- embedded


def _clean(doc) -> str:
  return inspect.cleandoc(doc) if isinstance(doc, str) and doc.strip() else ""


def _module_text(module) -> str:
  """The module docstring, then its own classes' and functions' docstrings, by name."""
  parts, seen = [], set()

  def add(header: str, doc) -> None:
    text = _clean(doc)
    if text and text not in seen:  # identical boilerplate ("Return self==value.") once
      seen.add(text)
      parts.append(f"{header}\n{text}" if header else text)

  add("", module.__doc__)
  for name, obj in sorted(vars(module).items()):
    if getattr(obj, "__module__", None) != module.__name__:
      continue
    if inspect.isclass(obj):
      add(f"{module.__name__}.{name}", obj.__doc__)
      for attr, member in sorted(vars(obj).items()):
        if isinstance(member, (staticmethod, classmethod)):
          member = member.__func__
        if (isinstance(member, property) or inspect.isfunction(member)
            or inspect.isbuiltin(member) or inspect.ismethoddescriptor(member)):
          add(f"{module.__name__}.{name}.{attr}", getattr(member, "__doc__", None))
    elif inspect.isfunction(obj) or inspect.isbuiltin(obj):
      add(f"{module.__name__}.{name}", obj.__doc__)
  return "\n\n".join(parts)


def _import_quietly(name: str):
  """The module, or None when it cannot be imported here; warnings and output muted."""
  sink = io.StringIO()
  try:
    with warnings.catch_warnings(), contextlib.redirect_stdout(sink), \
        contextlib.redirect_stderr(sink):
      warnings.simplefilter("ignore")
      return importlib.import_module(name)
  except Exception:  # pylint: disable=broad-except  # platform-only or broken module
    return None


def _walk_package(module) -> Iterator:
  """The module and (recursively, sorted by name) its non-test submodules."""
  yield module
  for info in sorted(pkgutil.iter_modules(getattr(module, "__path__", None) or []),
                     key=lambda i: i.name):
    if info.name in _SKIP_SUBMODULE_NAMES:
      continue
    sub = _import_quietly(f"{module.__name__}.{info.name}")
    if sub is not None:
      yield from _walk_package(sub)


def embedded_documents() -> list[dict]:
  """Real text that ships with every Python: pydoc help topics and stdlib docstrings.

  Returns:
    Pile-format records ``{"text": str, "meta": {"pile_set_name": str}}``: one per
    ``pydoc_data.topics`` entry (``"pydoc_topics"``, sorted by topic), then one per
    importable standard-library module and submodule (``"stdlib_docstrings"``, sorted
    by name, `sys.stdlib_module_names` walked with `pkgutil.iter_modules`): the module,
    class, method and function docstrings (`inspect.cleandoc`), each headed by its
    qualified name. Order and content are fixed for a given Python build: 2.3 MB of
    UTF-8 text in 607 documents on CPython 3.11.7 (Linux). Modules with import side
    effects (``antigravity``, ``this``, ``tkinter``, ``turtle``, ``idlelib``,
    ``lib2to3``, ``readline``, ...) and test packages are never imported; modules that
    fail to import here are left out; warnings and output during import are muted.
  """
  from pydoc_data import topics  # pylint: disable=g-import-not-at-top

  docs = [{"text": topics.topics[key], "meta": {"pile_set_name": "pydoc_topics"}}
          for key in sorted(topics.topics) if topics.topics[key].strip()]
  names = sorted(n for n in sys.stdlib_module_names
                 if n not in _SKIP_MODULES and "test" not in n)
  with warnings.catch_warnings():  # deprecated modules warn on attribute access too
    warnings.simplefilter("ignore")
    for name in names:
      top = _import_quietly(name)
      if top is None:
        continue
      for module in _walk_package(top):
        text = _module_text(module)
        if text.strip():
          docs.append({"text": text, "meta": {"pile_set_name": "stdlib_docstrings"}})
  return docs


def is_validation(text: str, validation_fraction: float) -> bool:
  """Deterministic hold-out: the first 8 bytes of sha256(text) as a fraction of 2**64."""
  digest = hashlib.sha256(text.encode("utf-8")).digest()
  return int.from_bytes(digest[:8], "big") < validation_fraction * 2.0**64


def split_documents(texts: Sequence[str], validation_fraction: float
                    ) -> tuple[list[str], list[str]]:
  """(train, validation) texts, each document placed by `is_validation` (order kept)."""
  train, validation = [], []
  for text in texts:
    (validation if is_validation(text, validation_fraction) else train).append(text)
  return train, validation


def _write_atomic(path: epath.Path, lines: Iterable[str]) -> None:
  tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
  with tmp.open("w") as f:
    for line in lines:
      f.write(line)
  tmp.replace(path)  # os.replace for local paths: readers never see a partial file


def write_embedded_corpus(cache_dir, validation_fraction: float
                          ) -> dict[str, epath.Path]:
  """Writes the embedded corpus as Pile-format JSONL once; returns the two shard paths.

  Args:
    cache_dir: folder (str or path-like; ``~`` expanded) holding the cache subfolder
      ``embedded-py{X.Y.Z}-val{fraction}``.
    validation_fraction: share in (0, 1) of documents held out, chosen per document by
      a hash of its text (`is_validation`), so the split never depends on the order.

  Returns:
    ``{"train": path, "validation": path}`` to ``train.jsonl`` / ``validation.jsonl``.
    Existing files are reused; new ones are written to a temporary name, then
    `os.replace`-d into place.

  Raises:
    DataError: validation_fraction outside (0, 1).
  """
  if not 0 < validation_fraction < 1:
    raise DataError(f"validation_fraction = {validation_fraction!r}: expected a number "
                    "in (0, 1)")
  version = ".".join(str(v) for v in sys.version_info[:3])
  folder = epath.Path(os.path.expanduser(os.fspath(cache_dir)))
  folder = folder / f"embedded-py{version}-val{validation_fraction:g}"
  paths = {"train": folder / "train.jsonl", "validation": folder / "validation.jsonl"}
  if all(p.exists() for p in paths.values()):
    return paths
  folder.mkdir(parents=True, exist_ok=True)
  records = {"train": [], "validation": []}
  for doc in embedded_documents():
    split = "validation" if is_validation(doc["text"], validation_fraction) else "train"
    records[split].append(json.dumps(doc, ensure_ascii=False) + "\n")
  for split in ("validation", "train"):  # train last: its presence marks completion
    _write_atomic(paths[split], records[split])
  logging.info("Wrote the embedded corpus to %s (%d train, %d validation documents).",
               folder, len(records["train"]), len(records["validation"]))
  return paths


# ----------------------------------------------------------------------------- reading


def _expand(patterns) -> list[epath.Path]:
  """Sorted files for each path, glob or folder, de-duplicated, in pattern order."""
  if isinstance(patterns, (str, os.PathLike)):
    patterns = [patterns]
  files, seen = [], set()
  for pattern in patterns:
    text = os.path.expanduser(os.fspath(pattern))
    if any(ch in text for ch in "*?["):
      parts = text.split("/")
      cut = next(i for i, p in enumerate(parts) if any(ch in p for ch in "*?["))
      root = "/".join(parts[:cut]) or ("/" if text.startswith("/") else ".")
      matches = sorted(epath.Path(root).glob("/".join(parts[cut:])))
      matches = [m for m in matches if m.is_file()]
      if not matches:
        raise DataError(f"{text}: the glob matches no files (expected Pile-format "
                        "*.jsonl or *.jsonl.zst)")
    else:
      path = epath.Path(text)
      if not path.exists():
        raise DataError(f"{text}: no such file (expected a Pile-format *.jsonl or "
                        "*.jsonl.zst file, folder or glob)")
      if path.is_dir():
        matches = sorted(p for p in path.iterdir() if p.name.endswith(SUFFIXES))
        if not matches:
          raise DataError(f"{text}: the folder holds no *.jsonl or *.jsonl.zst files")
      else:
        matches = [path]
    for m in matches:
      if not m.name.endswith(SUFFIXES):
        raise DataError(f"{m}: expected a Pile-format file named *.jsonl or *.jsonl.zst")
      if os.fspath(m) not in seen:
        seen.add(os.fspath(m))
        files.append(m)
  return files


def _zst_chunks(f, path) -> Iterator[bytes]:
  """Decompressed bytes of every frame; a truncated or corrupt stream -> DataError."""
  dctx = zstandard.ZstdDecompressor()
  dobj, pending = dctx.decompressobj(), False
  try:
    while chunk := f.read(_ZST_CHUNK_BYTES):
      while chunk:
        out = dobj.decompress(chunk)
        pending = True
        if out:
          yield out
        chunk = b""
        if dobj.eof:  # frame done; the rest of the chunk starts the next frame
          chunk, dobj, pending = dobj.unused_data, dctx.decompressobj(), False
  except zstandard.ZstdError as e:
    raise DataError(f"{path}: corrupt Zstandard data ({e}); expected a *.jsonl.zst "
                    "file written by zstd") from e
  if pending:
    raise DataError(f"{path}: truncated Zstandard stream (the last frame is incomplete); "
                    "expected a complete *.jsonl.zst file")


def _lines(path: epath.Path) -> Iterator[bytes]:
  with path.open("rb") as f:
    if not path.name.endswith(".zst"):
      yield from f
      return
    rest = b""
    for block in _zst_chunks(f, path):
      block = rest + block
      cut = block.rfind(b"\n") + 1
      yield from io.BytesIO(block[:cut])
      rest = block[cut:]
    if rest:
      yield rest


def _parse(raw: bytes) -> tuple[str | None, str | None, str | None]:
  """(text, pile_set_name, problem) of one line; problem is a skip reason or None."""
  try:
    record = json.loads(raw)
  except (json.JSONDecodeError, UnicodeDecodeError):
    return None, None, "bad_json"
  if not isinstance(record, dict) or not isinstance(record.get("text"), str):
    return None, None, "no_text"
  meta = record.get("meta")
  subset = meta.get("pile_set_name") if isinstance(meta, dict) else None
  return record["text"], subset, None


_PROBLEMS = {"bad_json": "the line is not valid JSON",
             "no_text": 'the line is not a JSON object with a string "text"'}


def read_documents(patterns, *, strict: bool = False, pile_set_names: Sequence[str] = ()
                   ) -> tuple[list[str], dict]:
  """Reads the texts of Pile-format ``*.jsonl`` / ``*.jsonl.zst`` files.

  Args:
    patterns: a path, glob (``data/*.jsonl.zst``), folder, or a sequence of them; local
      or any `etils.epath` URL (``gs://...``).
    strict: a line that is not JSON, or lacks a string ``"text"``, raises instead of
      being skipped and counted (one `logging.warning` per file).
    pile_set_names: keep only documents whose ``meta.pile_set_name`` is one of these;
      empty keeps all.

  Returns:
    ``(texts, report)``: texts in file then line order; report ``{"files": int,
    "documents": int, "characters": int, "skipped": {"bad_json", "no_text", "empty",
    "filtered_subset": int}}``. Blank lines are ignored; empty or whitespace-only texts
    count as ``empty``.

  Raises:
    DataError: a path that does not exist, a glob or folder with no files, a file not
      named ``*.jsonl[.zst]``, a truncated/corrupt ``.zst``, or (strict) ``file:line``
      and the problem of a bad line.
  """
  keep = frozenset(pile_set_names)
  texts: list[str] = []
  files = _expand(patterns)
  report = {"files": len(files), "documents": 0, "characters": 0,
            "skipped": dict.fromkeys(SKIP_REASONS, 0)}
  for path in files:
    bad = dict.fromkeys(_PROBLEMS, 0)
    for lineno, raw in enumerate(_lines(path), 1):
      if not raw.strip():
        continue
      text, subset, problem = _parse(raw)
      if problem:
        if strict:
          raise DataError(f"{path}:{lineno}: {_PROBLEMS[problem]} (expected a Pile-format "
                          'record {"text": str, "meta": {"pile_set_name": str}})')
        bad[problem] += 1
        report["skipped"][problem] += 1
      elif not text.strip():
        report["skipped"]["empty"] += 1
      elif keep and subset not in keep:
        report["skipped"]["filtered_subset"] += 1
      else:
        texts.append(text)
        report["characters"] += len(text)
    if any(bad.values()):
      logging.warning("%s: skipped %d line(s) that are not JSON and %d without a string "
                      '"text" (data.strict=True makes these errors).', path,
                      bad["bad_json"], bad["no_text"])
  report["documents"] = len(texts)
  return texts, report
