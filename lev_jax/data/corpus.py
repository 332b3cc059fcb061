"""Documents: the Pile-format JSONL files that paths, globs and folders name, and their
records, read in memory or as a stream.

A Pile-format line is one JSON object ``{"text": str, "meta": {"pile_set_name": str}}``
(The Pile, Gao et al. 2020, https://pile.eleuther.ai/). Files are ``*.jsonl`` or
``*.jsonl.zst`` (Zstandard, read as a stream with `zstandard.ZstdDecompressor.decompressobj`,
https://python-zstandard.readthedocs.io/). Paths go through `etils.epath`, so local paths
and ``gs://`` URLs are read the same way.

Bad inputs (`reports.SKIP_REASONS`: a missing path, an empty glob, a truncated ``.zst``,
a line that is not UTF-8 or not JSON or has no string ``"text"``, an empty document,
another subset) are skipped and counted in a read report (`reports.new_report`), or
raise `DataError` naming the file and line with ``strict``. `expand_files` lists the
files, `iter_file` streams one file's documents, `read_documents` reads them all into
memory; `pattern_texts` and `pile_subsets` check their arguments (`stream` shares them).

The hash splits are in `lev_jax.data.splits`, the read reports in `lev_jax.data.reports`.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator, Sequence

from absl import logging
from etils import epath
import zstandard

from lev_jax.data.errors import DataError, check_index
from lev_jax.data.reports import new_report

SUFFIXES = (".jsonl", ".jsonl.zst")

_ZST_CHUNK_BYTES = 1 << 20


def pattern_texts(patterns) -> list[str]:
  """The patterns as strings (``~`` expanded); a lone path becomes a list of one.

  Args:
    patterns: a path, glob or folder (str or path-like), or a sequence of them.

  Returns:
    One str per pattern, in the given order.

  Raises:
    DataError: not a path or a sequence of them, or an empty or non-path item.
  """
  if isinstance(patterns, (str, os.PathLike)):
    patterns = [patterns]
  try:
    items = list(patterns)
  except TypeError:
    raise DataError(f"patterns = {patterns!r}: expected a path, glob or folder (str or "
                    "path-like), or a sequence of them") from None
  texts = []
  for item in items:
    text = os.fspath(item) if isinstance(item, (str, os.PathLike)) else None
    if not isinstance(text, str) or not text:
      raise DataError(f"pattern {item!r} in {items!r}: expected a non-empty path, glob "
                      "or folder (str or path-like)")
    texts.append(os.path.expanduser(text))
  return texts


def _is_glob(text: str) -> bool:
  return any(ch in text for ch in "*?[")


def _matches(text: str, strict: bool, report: dict, warn: bool = True
             ) -> list[epath.Path]:
  """The sorted files one pattern names; [] (counted and warned) when it names none."""
  if _is_glob(text):
    if "**" in text:  # epath refuses recursive globs (thousands of requests on GCS)
      raise DataError(f"{text}: recursive '**' globs are not supported; expected one "
                      "'*' per folder level, e.g. data/*/*.jsonl.zst")
    parts = text.split("/")
    cut = next(i for i, p in enumerate(parts) if _is_glob(p))
    root = "/".join(parts[:cut]) or ("/" if text.startswith("/") else ".")
    matches = sorted(m for m in epath.Path(root).glob("/".join(parts[cut:]))
                     if m.is_file())
    reason, problem = "empty_glob", "the glob matches no files"
  else:
    path = epath.Path(text)
    if not path.exists():
      matches, reason, problem = [], "missing_file", "no such file or folder"
    elif path.is_dir():
      matches = sorted(p for p in path.iterdir() if p.name.endswith(SUFFIXES))
      reason, problem = "empty_glob", "the folder holds no *.jsonl or *.jsonl.zst files"
    else:
      matches = [path]
  if not matches:
    message = (f"{text}: {problem} (expected a Pile-format *.jsonl or *.jsonl.zst file, "
               "folder or glob)")
    if strict:
      raise DataError(message)
    report["skipped"][reason] += 1
    if warn:
      logging.warning("%s; skipped (data.strict=True makes this an error).", message)
  return matches


def expand_files(patterns, *, strict: bool = False, report: dict | None = None,
                 warn: bool = True) -> list[epath.Path]:
  """The Pile-format files that paths, globs and folders name.

  Args:
    patterns: a path, glob (``data/*.jsonl.zst``; ``**`` is not supported), folder (its
      ``*.jsonl`` / ``*.jsonl.zst`` files), or a sequence of them; ``~`` expanded; local
      or any `etils.epath` URL (``gs://bucket/...``), https://github.com/google/etils.
    strict: a missing path, or a glob or folder that names no file, raises instead of
      being skipped.
    report: a `new_report` dict: ``skipped["missing_file"]`` / ``["empty_glob"]`` count
      the skipped patterns (each also logged with `logging.warning`) and ``"files"``
      grows by the number of files returned.
    warn: False counts the skipped patterns without logging them (a second listing of
      patterns whose skips were already reported).

  Returns:
    Each pattern's files sorted by name, patterns in the given order, each file once
    (the first time it is named).

  Raises:
    DataError: a pattern that is not a non-empty str or path-like; a file not named
      ``*.jsonl`` / ``*.jsonl.zst`` (always: a config mistake); no file at all (always:
      names the patterns and how many were missing or empty); with ``strict``, the
      first missing path or empty glob / folder.
  """
  texts = pattern_texts(patterns)
  report = new_report() if report is None else report
  before = dict(report["skipped"])
  files, seen = [], set()
  for text in texts:
    for m in _matches(text, strict, report, warn):
      if not m.name.endswith(SUFFIXES):
        raise DataError(f"{m} (from {text}): expected a Pile-format file named *.jsonl "
                        "or *.jsonl.zst")
      if os.fspath(m) not in seen:
        seen.add(os.fspath(m))
        files.append(m)
  if not files:
    missing = report["skipped"]["missing_file"] - before["missing_file"]
    empty = report["skipped"]["empty_glob"] - before["empty_glob"]
    raise DataError(f"{', '.join(texts) or '(no patterns)'}: no Pile-format *.jsonl or "
                    f"*.jsonl.zst file to read ({len(texts)} pattern(s): {missing} "
                    f"missing, {empty} glob(s) or folder(s) with no files)")
  report["files"] += len(files)
  return files


class _DamagedZst(DataError):
  """A truncated or corrupt Zstandard stream (`iter_file` adds the file and line)."""


def _zst_chunks(f) -> Iterator[bytes]:
  """Decompressed bytes of every frame, in order; raises _DamagedZst at the damage."""
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
    raise _DamagedZst(f"corrupt Zstandard data ({e})") from e
  if pending:
    raise _DamagedZst("truncated Zstandard stream (the last frame is incomplete)")


def _lines(path: epath.Path) -> Iterator[bytes]:
  """The raw lines of a file, newline kept; a damaged .zst stops with _DamagedZst
  after its last complete line (the partial line before the damage is dropped)."""
  with path.open("rb") as f:
    if not path.name.endswith(".zst"):
      yield from f
      return
    rest = b""
    for block in _zst_chunks(f):
      block = rest + block
      cut = block.rfind(b"\n") + 1
      yield from io.BytesIO(block[:cut])
      rest = block[cut:]
    if rest:
      yield rest


_EXPECTED = 'expected a Pile-format record {"text": str, "meta": {"pile_set_name": str}}'


def _parse(raw: bytes) -> tuple[str | None, str | None, str | None, str]:
  """(text, pile_set_name, reason, problem) of one line; reason is a skip reason or
  None, problem says what is wrong for an error message."""
  try:
    line = raw.decode("utf-8")
  except UnicodeDecodeError as e:
    return None, None, "bad_utf8", (f"the line is not valid UTF-8 at byte offset {e.start} "
                                    f"({e.reason}); expected UTF-8 text")
  try:
    record = json.loads(line)
  except (ValueError, RecursionError) as e:  # JSONDecodeError, or nested too deep
    return None, None, "bad_json", f"the line is not valid JSON ({e}); {_EXPECTED}"
  if not isinstance(record, dict) or not isinstance(record.get("text"), str):
    if not isinstance(record, dict):
      got = f"a JSON {type(record).__name__}"
    else:
      got = ('"text" is ' + type(record["text"]).__name__ if "text" in record
             else 'no "text"')
    return None, None, "no_text", (f'the line is not a JSON object with a string "text" '
                                   f"(got {got}); {_EXPECTED}")
  text = record["text"]
  if b"\\ud" in raw or b"\\uD" in raw:  # a \uXXXX surrogate escape: is it paired?
    try:
      text.encode("utf-8")
    except UnicodeEncodeError:
      return None, None, "bad_utf8", ('"text" escapes a lone surrogate (\\ud800-\\udfff), '
                                      "which UTF-8 cannot encode; expected UTF-8 text")
  meta = record.get("meta")
  subset = meta.get("pile_set_name") if isinstance(meta, dict) else None
  return text, subset, None, ""


def pile_subsets(pile_set_names) -> frozenset:
  """The ``meta.pile_set_name`` values to keep, as a frozenset (empty: keep all).

  Raises:
    DataError: a lone string, or not an iterable of names.
  """
  if isinstance(pile_set_names, (str, bytes)):
    raise DataError(f"pile_set_names = {pile_set_names!r}: expected a sequence of subset "
                    "names such as ('Pile-CC',), not a string")
  try:
    return frozenset(pile_set_names)
  except TypeError:
    raise DataError(f"pile_set_names = {pile_set_names!r}: expected a sequence of subset "
                    "names (str)") from None


def iter_file(path, *, strict: bool = False, pile_set_names: Sequence[str] = (),
              report: dict | None = None, start_line: int = 0, shard_index: int = 0,
              shard_count: int = 1, warn: bool = True
              ) -> Iterator[tuple[int, str, str | None]]:
  """The kept documents of one Pile-format file, read as a stream.

  Args:
    path: a ``*.jsonl`` or ``*.jsonl.zst`` file (str or path-like; local or an
      `etils.epath` URL such as ``gs://``). ``.zst`` files may hold several frames and
      are decompressed in 1 MiB reads with `zstandard.ZstdDecompressor.decompressobj`
      (https://python-zstandard.readthedocs.io/en/latest/decompressor.html).
    strict: a line that is not UTF-8, not JSON or has no string ``"text"``, or a
      truncated / corrupt ``.zst``, or a file that no longer exists, raises instead of
      being skipped and counted.
    pile_set_names: keep only documents whose ``meta.pile_set_name`` is one of these;
      empty keeps all.
    report: a `new_report` dict updated as lines are read: ``documents`` and
      ``characters`` for each document yielded, ``skipped[reason]`` for each line
      skipped (``bad_utf8``, ``bad_json``, ``no_text``, ``empty``: empty or whitespace
      text, ``filtered_subset``), ``truncated_file`` / ``missing_file`` once per file.
      Blank lines are ignored and not counted.
    start_line: lines 1..start_line are passed over without being parsed (resuming a
      stream); they are still read and, for ``.zst``, decompressed.
    shard_index, shard_count: keep only line numbers n with ``(n - 1) % shard_count ==
      shard_index``, chosen before parsing, so that shards 0..shard_count-1 together
      read every line once.
    warn: False counts skips in `report` without logging them: for a read whose skips
      another read of the same file reports (a tokenizer's training sample, read before
      the file is read in full), so each warning is printed once.

  Yields:
    ``(lineno, text, pile_set_name)``: 1-based line number, the non-empty text, and
    ``meta.pile_set_name`` (None when absent), in line order. A damaged ``.zst`` still
    yields every line that decompressed before the damage (then counts
    ``truncated_file`` once and logs a warning naming the file and that line); zstd
    emits whole blocks (up to 128 KiB), so the lines of the damaged block are lost.
    One `logging.warning` per file sums up its skipped bad lines.

  Raises:
    DataError: bad arguments; with ``strict``, ``"file:line: problem (expected ...)"``
      for a bad line, or the file and its last complete line for a damaged ``.zst``, or
      a missing file.
  """
  path = epath.Path(path)
  keep = pile_subsets(pile_set_names)
  start_line = check_index("start_line", start_line, 0)
  shard_count = check_index("shard_count", shard_count, 1)
  shard_index = check_index("shard_index", shard_index, 0, shard_count)
  report = new_report() if report is None else report
  skipped = report["skipped"]
  bad = {"bad_utf8": 0, "bad_json": 0, "no_text": 0}
  lineno = 0
  try:
    for lineno, raw in enumerate(_lines(path), 1):
      if (lineno <= start_line or (lineno - 1) % shard_count != shard_index
          or not raw.strip()):
        continue
      text, subset, reason, problem = _parse(raw)
      if reason:
        if strict:
          raise DataError(f"{path}:{lineno}: {problem}")
        bad[reason] += 1
        skipped[reason] += 1
      elif not text.strip():
        skipped["empty"] += 1
      elif keep and subset not in keep:
        skipped["filtered_subset"] += 1
      else:
        report["documents"] += 1
        report["characters"] += len(text)
        yield lineno, text, subset
  except _DamagedZst as e:
    where = (f"after line {lineno} (the last complete line)" if lineno
             else "before its first complete line")
    message = f"{path}: {e} {where}"
    if strict:
      raise DataError(f"{message}; expected a complete *.jsonl.zst file written by zstd"
                      ) from e
    skipped["truncated_file"] += 1
    if warn:
      logging.warning("%s; kept the lines before the damage and skipped the rest "
                      "(data.strict=True makes this an error).", message)
  except FileNotFoundError as e:
    if strict:
      raise DataError(f"{path}: no such file (it was listed, then disappeared); expected "
                      "a Pile-format *.jsonl or *.jsonl.zst file") from e
    skipped["missing_file"] += 1
    if warn:
      logging.warning("%s: no such file (it was listed, then disappeared); skipped "
                      "(data.strict=True makes this an error).", path)
  if warn and any(bad.values()):
    logging.warning('%s: skipped %d line(s) that are not UTF-8, %d that are not JSON and '
                    '%d without a string "text" (data.strict=True makes these errors).',
                    path, bad["bad_utf8"], bad["bad_json"], bad["no_text"])


def read_documents(patterns, *, strict: bool = False, pile_set_names: Sequence[str] = ()
                   ) -> tuple[list[str], dict]:
  """Reads the texts of Pile-format ``*.jsonl`` / ``*.jsonl.zst`` files into memory.

  Args:
    patterns: a path, glob (``data/*.jsonl.zst``), folder, or a sequence of them; local
      or any `etils.epath` URL (``gs://...``); see `expand_files`.
    strict: every bad input raises (see `expand_files` and `iter_file`) instead of
      being skipped, counted and logged with `logging.warning`.
    pile_set_names: keep only documents whose ``meta.pile_set_name`` is one of these;
      empty keeps all.

  Returns:
    ``(texts, report)``: texts in file then line order; report ``{"files": int,
    "documents": int, "characters": int, "skipped": {reason: int for each of
    SKIP_REASONS}}`` (see `new_report`, `iter_file`).

  Raises:
    DataError: no file at all, a file not named ``*.jsonl[.zst]``, bad arguments, or
      (strict) the first bad input, naming the file (and ``file:line``).
  """
  keep = pile_subsets(pile_set_names)
  report = new_report()
  texts = [text for path in expand_files(patterns, strict=strict, report=report)
           for _, text, _ in iter_file(path, strict=strict, pile_set_names=keep,
                                       report=report)]
  return texts, report
