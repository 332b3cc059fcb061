"""Documents streamed from Pile-format JSONL files, as a resumable grain ``IterDataset``.

For training straight from raw files (The Pile's ``*.jsonl.zst`` shards) without reading
them into memory: `JsonlStreamDataset` yields document texts; tokenizing, packing and the
shuffle buffer are downstream grain stages::

  ds = JsonlStreamDataset("pile/train/*.jsonl.zst", seed=0,
                          shard_index=jax.process_index(), shard_count=jax.process_count())
  ds = grain.experimental.WindowShuffleIterDataset(ds.map(tokenize), window_size=4096,
                                                  seed=1)

Epoch e reads every file, in the order ``np.random.default_rng([seed, e]).permutation``,
each file's lines in order. The iterator's state is three ints (epoch, position in that
epoch's file order, last line consumed) and what it has counted (documents, tokens,
skipped lines per reason, of the current epoch so far and of the last whole epoch), so
a checkpoint is small and JSON-safe; resuming re-opens the file and passes over the
lines already consumed without parsing them. ``JsonlStreamDataset.counts()`` gives those
counts (the data report of a streamed run, `lev_jax.data.DataBundle.current_report`).

Library: Grain, https://google-grain.readthedocs.io/ (``grain.IterDataset``,
``grain.DatasetIterator``); reading: `lev_jax.data.corpus`; skip counting:
`lev_jax.data.reports`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import grain
import numpy as np

from lev_jax.data.corpus import expand_files, iter_file, pattern_texts, pile_subsets
from lev_jax.data.errors import DataError, check_index
from lev_jax.data.reports import describe_skipped, merge_reports, new_report

_STATE_KEYS = ("epoch", "file", "line")
_COUNTS_KEY = "counts"  # optional in set_state: states saved before it was counted


def _new_counts() -> dict:
  """A read report (`reports.new_report`) plus ``"tokens"``: encoded ids, no eos."""
  return {**new_report(), "tokens": 0}


def _add_counts(*counts: dict) -> dict:
  """The field-wise sum of `_new_counts` dicts (a new dict).

  Raises:
    DataError: an argument that is not such a dict.
  """
  total = merge_reports(*counts)
  try:
    total["tokens"] = sum(int(c["tokens"]) for c in counts)
  except (KeyError, TypeError, ValueError) as e:
    raise DataError(f"counts {counts!r}: expected read reports with \"tokens\" "
                    f"({type(e).__name__}: {e})") from e
  return total


class JsonlStreamDataset(grain.IterDataset):
  """Endless (or ``num_epochs``) stream of the document texts of Pile-format files.

  Iterating yields ``str`` texts: epoch e visits the files in the order
  ``np.random.default_rng([seed, e]).permutation(n_files)`` (NumPy ``Generator``,
  https://numpy.org/doc/stable/reference/random/generator.html), each file's documents
  in line order, skipping and counting bad lines as `corpus.iter_file` does.

  Sharding (one shard per process): this shard keeps only the lines whose 1-based number
  n satisfies ``(n - 1) % shard_count == shard_index``, decided before parsing; shards
  0..shard_count-1 together see every line exactly once per epoch (each shard still
  reads, and for ``.zst`` decompresses, every byte of every file).

  ``iter(ds)`` returns a `JsonlStreamIterator` (exact resume with ``get_state`` /
  ``set_state``). The dataset chains like any ``grain.IterDataset``: ``.map(f)``,
  ``.batch(n)``, ``grain.experimental.WindowShuffleIterDataset(...)``.

  Attributes:
    files: the files, in the order `corpus.expand_files` listed them (epoch orders are
      permutations of it).
    report: the read report of expanding the patterns (``files``, and the skipped
      ``missing_file`` / ``empty_glob`` counts); each iterator starts from a copy.
    patterns: the patterns as given (``~`` expanded), joined by ", " (for messages).
    seed, strict, pile_set_names (a frozenset), shard_index, shard_count, num_epochs,
      encode, warn: the arguments, checked.
  """

  def __init__(self, patterns, *, seed: int, strict: bool = False,
               pile_set_names: Sequence[str] = (), shard_index: int = 0,
               shard_count: int = 1, num_epochs: int | None = None,
               encode: Callable[[str], Sequence[int]] | None = None, warn: bool = True):
    """Lists the files once (so path errors are raised here).

    Args:
      patterns: a path, glob, folder, or a sequence of them (local or ``gs://``); see
        `corpus.expand_files`.
      seed: non-negative int; the file order of each epoch.
      strict: every bad input raises `DataError` instead of being skipped and counted.
      pile_set_names: keep only these ``meta.pile_set_name`` subsets; empty keeps all.
      shard_index, shard_count: this process's share of the lines (see above).
      num_epochs: stop after this many passes (>= 1); None: endless.
      encode: a tokenizer's ``encode``: the stream yields ``{"tokens": int32 [n]}`` (the
        document's ids, no eos: `pipeline.make_train_dataset` appends it) instead of
        the text, and counts the tokens (`counts`). None: texts, tokens not counted.
      warn: log skipped paths and lines (`corpus.expand_files`, `corpus.iter_file`),
        each file's the first time an iterator reads it (not again every epoch);
        False for a read whose skips another read of the same files reports (the
        sample a tokenizer is trained on).

    Raises:
      DataError: a bad argument (named), no file at all, a file not named
        ``*.jsonl[.zst]``, or (strict) a missing path or empty glob.
    """
    super().__init__()
    self.seed = check_index("seed", seed, 0)
    self.shard_count = check_index("shard_count", shard_count, 1)
    self.shard_index = check_index("shard_index", shard_index, 0, self.shard_count)
    self.num_epochs = (None if num_epochs is None
                       else check_index("num_epochs", num_epochs, 1))
    self.strict = bool(strict)
    self.pile_set_names = pile_subsets(pile_set_names)
    if encode is not None and not callable(encode):
      raise DataError(f"encode = {encode!r}: expected a callable str -> token ids (a "
                      "tokenizer's encode) or None")
    self.encode, self.warn = encode, bool(warn)
    texts = pattern_texts(patterns)  # a list: a one-shot iterable is read once here
    self.patterns = ", ".join(texts)
    self._report = new_report()
    self.files = tuple(expand_files(texts, strict=self.strict, report=self._report,
                                    warn=self.warn))
    self._latest: _Counter | None = None  # the counts of the iterator made last

  @property
  def report(self) -> dict:
    """A copy of the expansion report (see the class docstring)."""
    return merge_reports(self._report)

  def file_order(self, epoch: int) -> np.ndarray:
    """int64 [n_files]: indices into `files`, in the order epoch ``epoch`` reads them."""
    return np.random.default_rng([self.seed, int(epoch)]).permutation(len(self.files))

  def counts(self) -> dict | None:
    """What the iterator made last (``iter(ds)``; the trainer makes one) has counted, as
    `JsonlStreamIterator.counts` returns it; None before the first ``iter``. Stays
    readable after that iterator is closed or garbage-collected."""
    return None if self._latest is None else self._latest.snapshot(self)

  def __iter__(self) -> JsonlStreamIterator:
    it = JsonlStreamIterator(self)
    self._latest = it._counter
    return it

  def __str__(self) -> str:
    return (f"JsonlStreamDataset({self.patterns}, files={len(self.files)}, "
            f"seed={self.seed}, shard={self.shard_index}/{self.shard_count}, "
            f"num_epochs={self.num_epochs})")


class JsonlStreamIterator(grain.DatasetIterator):
  """Iterator of a `JsonlStreamDataset`: yields texts (or token ids, with ``encode``),
  checkpoints as three ints and its counts.

  State ``{"epoch": int, "file": int, "line": int, "counts": {...}}``: the epoch, the
  position in that epoch's file order, the line number of the last document yielded
  from that file (0 before the first), and the counts (`counts`: the current epoch's
  so far, the last whole epoch's). ``set_state(s)`` on a fresh iterator makes it yield
  exactly what the iterator ``s`` came from yielded next, and count on from its counts;
  a state without ``"counts"`` (saved before they were kept) resumes the position, and
  counting restarts at the next epoch (at once when it is the start of an epoch).

  Cost of a resume: the file is re-opened and its lines 1..line are read again, and for
  ``.zst`` decompressed, but not parsed: up to one whole file, at about 1 GB/s
  (``.jsonl``) or 300 MB/s of decompressed text (``.jsonl.zst``) on one CPU core, i.e. a
  few minutes for a whole Pile shard (~45 GB decompressed). A state taken at the last
  document of a file re-reads that file.

  Attributes:
    report: (read-only) a `reports.new_report` dict, the dataset's expansion report plus
      everything this iterator read (cumulative over epochs and `set_state` calls;
      lines re-read to resume are not counted).
  """

  def __init__(self, dataset: JsonlStreamDataset):
    super().__init__()
    self._ds = dataset
    self._read = dataset.report  # files this iterator finished reading (+ expansion)
    self._counter = _Counter()
    self._orders: dict[int, np.ndarray] = {}
    self._reader: Iterator | None = None
    self._epoch = self._file = self._line = 0
    self._epoch_has_documents = False
    self._warned: set[int] = set()  # files whose skips were logged: once per iterator

  @property
  def report(self) -> dict:
    return merge_reports(self._read, self._counter.file)

  def counts(self) -> dict:
    """What this iterator has counted, JSON-safe, for a data report.

    Returns:
      ``{"complete", "report", "epoch", "files_read", "files", "shard_index",
      "shard_count"}``. complete: a whole epoch (every file of this shard) was read
      since counting began, and report is the latest whole epoch's counts: this
      shard's documents, characters, tokens and skipped lines per reason (the dataset's
      counts, as every epoch reads the same lines). Otherwise report is the current
      epoch's counts so far (files_read of files finished), or None when this
      iterator resumed mid-epoch from a state without counts (counting restarts at the
      next epoch). report: a `reports.new_report` dict plus ``"tokens"`` (ids without
      eos; None without ``encode``); its ``files`` is files listed (complete) or files
      finished (partial), and its skips include the dataset's missing paths and empty
      globs. epoch: whole epochs passed (the position).
    """
    return self._counter.snapshot(self._ds)

  def _order(self, epoch: int) -> np.ndarray:
    if epoch not in self._orders:
      self._orders = {epoch: self._ds.file_order(epoch)}  # only the current epoch kept
    return self._orders[epoch]

  def _exhausted(self) -> bool:
    return self._ds.num_epochs is not None and self._epoch >= self._ds.num_epochs

  def __next__(self) -> str | dict[str, np.ndarray]:
    self._assert_not_closed()
    ds, counter = self._ds, self._counter
    while not self._exhausted():
      if self._reader is None:
        index = int(self._order(self._epoch)[self._file])
        self._reader = iter_file(
            ds.files[index], strict=ds.strict, pile_set_names=ds.pile_set_names,
            report=counter.file, start_line=self._line, shard_index=ds.shard_index,
            shard_count=ds.shard_count, warn=ds.warn and index not in self._warned)
        self._warned.add(index)
      item = next(self._reader, None)
      if item is not None:
        self._line, text, _ = item
        self._epoch_has_documents = True
        if ds.encode is None:
          return text
        ids_N = np.asarray(ds.encode(text), dtype=np.int32)
        counter.file["tokens"] += int(ids_N.size)
        return {"tokens": ids_N}
      self._reader = None  # the file is done: the next one, or the next epoch
      self._read = merge_reports(self._read, counter.file)
      counter.end_file()
      self._file, self._line = self._file + 1, 0
      counter.position = (self._epoch, self._file)
      if self._file == len(ds.files):
        if not self._epoch_has_documents:
          raise DataError(
              f"{ds.patterns}: epoch {self._epoch} of the stream yielded no document "
              f"(shard {ds.shard_index} of {ds.shard_count}, {len(ds.files)} file(s); "
              f"skipped so far: {describe_skipped(self.report)}); expected at least one "
              "non-empty Pile-format document per epoch")
        counter.end_epoch()
        self._epoch, self._file, self._epoch_has_documents = self._epoch + 1, 0, False
        counter.position = (self._epoch, 0)
    raise StopIteration

  def get_state(self) -> dict:
    """``{"epoch", "file", "line"}`` plain ints and ``"counts"`` (JSON-safe); see the
    class docstring."""
    return {"epoch": int(self._epoch), "file": int(self._file), "line": int(self._line),
            _COUNTS_KEY: self._counter.state()}

  def set_state(self, state: dict) -> None:
    """Resumes at a state from `get_state` (of an iterator of an equal dataset).

    Raises:
      DataError: a state that is not ``{"epoch", "file", "line"}`` ints in range (and
        optionally ``"counts"`` as `get_state` writes them), naming the key and what
        was expected.
    """
    if (not isinstance(state, dict) or not set(_STATE_KEYS) <= set(state)
        or not set(state) <= {*_STATE_KEYS, _COUNTS_KEY}):
      raise DataError(f"state = {state!r}: expected a dict with exactly the keys "
                      f"{_STATE_KEYS} (and {_COUNTS_KEY!r}) from "
                      "JsonlStreamIterator.get_state()")
    num_epochs = self._ds.num_epochs
    epoch = check_index("state['epoch']", state["epoch"], 0,
                         None if num_epochs is None else num_epochs + 1)
    file = check_index("state['file']", state["file"], 0, len(self._ds.files))
    line = check_index("state['line']", state["line"], 0)
    if _COUNTS_KEY in state:
      counter = _Counter.from_state(state[_COUNTS_KEY])
    else:  # saved before counts were kept: known only from the start of an epoch
      counter = _Counter()
      if file or line:
        counter.epoch = None
    if self._reader is not None:
      self._reader.close()
    self._reader = None
    self._read = merge_reports(self._read, self._counter.file)  # read, if not counted
    self._counter.restore(counter, (epoch, file))
    self._epoch, self._file, self._line = epoch, file, line
    # `line` > 0 only after a document of this epoch was yielded (get_state is only
    # seen between documents), so the epoch is known not to be empty.
    self._epoch_has_documents = line > 0

  def close(self) -> None:
    """Closes the open file (idempotent); `__next__` then raises ValueError."""
    reader, self._reader = getattr(self, "_reader", None), None
    if reader is not None:
      reader.close()
    super().close()

  def __str__(self) -> str:
    return f"JsonlStreamIterator({self._ds})"


class _Counter:
  """The counts of one `JsonlStreamIterator`, kept apart from it so that the dataset can
  report them after the iterator is gone (`JsonlStreamDataset.counts`).

  Attributes:
    epoch: `_new_counts` of the current epoch's finished files (None: unknown, counting
      restarts at the next epoch).
    file: `_new_counts` of the file being read (`corpus.iter_file` adds to it).
    whole: the last whole epoch's counts, or None before one was counted.
    position: (epoch, files finished in it).
  """

  def __init__(self):
    self.epoch: dict | None = _new_counts()
    self.file = _new_counts()
    self.whole: dict | None = None
    self.position = (0, 0)

  def end_file(self) -> None:
    if self.epoch is not None:
      self.epoch = _add_counts(self.epoch, self.file)
    self.file = _new_counts()

  def end_epoch(self) -> None:
    if self.epoch is not None:
      self.whole = self.epoch
    self.epoch = _new_counts()

  def so_far(self) -> dict | None:
    """The current epoch's counts so far, the file being read included (a new dict).

    Called for every document (grain's packer takes its parent's state before each
    element), so it adds the two dicts directly: both hold every key of
    `_new_counts` (`from_state` fills in missing skip reasons)."""
    e, f = self.epoch, self.file
    if e is None:
      return None
    out = {k: e[k] + f[k] for k in ("files", "documents", "characters", "tokens")}
    out["skipped"] = {k: n + f["skipped"][k] for k, n in e["skipped"].items()}
    return out

  def state(self) -> dict:
    # `whole` is never changed in place (each epoch's counts are a new dict).
    return {"epoch": self.so_far(), "whole": self.whole}

  @classmethod
  def from_state(cls, state) -> _Counter:
    """A counter from `state` (a fresh file, as a resumed iterator re-opens it).

    Raises:
      DataError: not ``{"epoch", "whole"}`` of None or counts dicts.
    """
    counter = cls()
    if not isinstance(state, dict) or set(state) != {"epoch", "whole"}:
      raise DataError(f"state['counts'] = {state!r}: expected {{'epoch', 'whole'}} from "
                      "JsonlStreamIterator.get_state()")
    for key in ("epoch", "whole"):
      value = state[key]
      if value is not None:
        if not isinstance(value, dict) or "tokens" not in value:
          raise DataError(f"state['counts'][{key!r}] = {value!r}: expected None or a read "
                          "report with 'tokens'")
        value = _add_counts(value)  # checked, and with every skip reason
      setattr(counter, key, value)
    return counter

  def restore(self, other: _Counter, position: tuple[int, int]) -> None:
    self.epoch, self.file, self.whole = other.epoch, other.file, other.whole
    self.position = position

  def snapshot(self, ds: JsonlStreamDataset) -> dict:
    epoch, files_read = self.position
    complete = self.whole is not None
    report = self.whole if complete else self.so_far()
    if report is not None:
      report = _add_counts(report, {**ds.report, "files": 0, "tokens": 0})
      report["files"] = len(ds.files) if complete else files_read
      if ds.encode is None:
        report["tokens"] = None
    return {"complete": complete, "report": report, "epoch": epoch,
            "files_read": files_read, "files": len(ds.files),
            "shard_index": ds.shard_index, "shard_count": ds.shard_count}
