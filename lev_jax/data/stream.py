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
epoch's file order, last line consumed), so a checkpoint is tiny and JSON-safe; resuming
re-opens the file and passes over the lines already consumed without parsing them.

Library: Grain, https://google-grain.readthedocs.io/ (``grain.IterDataset``,
``grain.DatasetIterator``); reading and skip counting: `lev_jax.data.corpus`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import grain
import numpy as np

from lev_jax.data.corpus import (DataError, _check_index, _pattern_texts, _subsets,
                                 describe_skipped, expand_files, iter_file, merge_reports,
                                 new_report)

_STATE_KEYS = ("epoch", "file", "line")


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
    seed, strict, pile_set_names (a frozenset), shard_index, shard_count, num_epochs:
      the arguments, checked.
  """

  def __init__(self, patterns, *, seed: int, strict: bool = False,
               pile_set_names: Sequence[str] = (), shard_index: int = 0,
               shard_count: int = 1, num_epochs: int | None = None):
    """Lists the files once (so path errors are raised here).

    Args:
      patterns: a path, glob, folder, or a sequence of them (local or ``gs://``); see
        `corpus.expand_files`.
      seed: non-negative int; the file order of each epoch.
      strict: every bad input raises `DataError` instead of being skipped and counted.
      pile_set_names: keep only these ``meta.pile_set_name`` subsets; empty keeps all.
      shard_index, shard_count: this process's share of the lines (see above).
      num_epochs: stop after this many passes (>= 1); None: endless.

    Raises:
      DataError: a bad argument (named), no file at all, a file not named
        ``*.jsonl[.zst]``, or (strict) a missing path or empty glob.
    """
    super().__init__()
    self.seed = _check_index("seed", seed, 0)
    self.shard_count = _check_index("shard_count", shard_count, 1)
    self.shard_index = _check_index("shard_index", shard_index, 0, self.shard_count)
    self.num_epochs = (None if num_epochs is None
                       else _check_index("num_epochs", num_epochs, 1))
    self.strict = bool(strict)
    self.pile_set_names = _subsets(pile_set_names)
    texts = _pattern_texts(patterns)  # a list: a one-shot iterable is read once here
    self.patterns = ", ".join(texts)
    self._report = new_report()
    self.files = tuple(expand_files(texts, strict=self.strict, report=self._report))

  @property
  def report(self) -> dict:
    """A copy of the expansion report (see the class docstring)."""
    return merge_reports(self._report)

  def file_order(self, epoch: int) -> np.ndarray:
    """int64 [n_files]: indices into `files`, in the order epoch ``epoch`` reads them."""
    return np.random.default_rng([self.seed, int(epoch)]).permutation(len(self.files))

  def __iter__(self) -> JsonlStreamIterator:
    return JsonlStreamIterator(self)

  def __str__(self) -> str:
    return (f"JsonlStreamDataset({self.patterns}, files={len(self.files)}, "
            f"seed={self.seed}, shard={self.shard_index}/{self.shard_count}, "
            f"num_epochs={self.num_epochs})")


class JsonlStreamIterator(grain.DatasetIterator):
  """Iterator of a `JsonlStreamDataset`: yields texts, checkpoints as three ints.

  State ``{"epoch": int, "file": int, "line": int}``: the epoch, the position in that
  epoch's file order, and the line number of the last document yielded from that file
  (0 before the first). ``set_state(s)`` on a fresh iterator makes it yield exactly what
  the iterator ``s`` came from yielded next. Cost of a resume: the file is re-opened and
  its lines 1..line are read again, and for ``.zst`` decompressed, but not parsed: up to
  one whole file, at about 1 GB/s (``.jsonl``) or 300 MB/s of decompressed text
  (``.jsonl.zst``) on one CPU core, i.e. a few minutes for a whole Pile shard (~45 GB
  decompressed). A state taken at the last document of a file re-reads that file.

  Attributes:
    report: a `corpus.new_report` dict, the dataset's expansion report plus everything
      this iterator read (cumulative over epochs and `set_state` calls; lines re-read
      to resume are not counted).
  """

  def __init__(self, dataset: JsonlStreamDataset):
    super().__init__()
    self._ds = dataset
    self.report = dataset.report
    self._orders: dict[int, np.ndarray] = {}
    self._reader: Iterator | None = None
    self._epoch = self._file = self._line = 0
    self._epoch_has_documents = False

  def _order(self, epoch: int) -> np.ndarray:
    if epoch not in self._orders:
      self._orders = {epoch: self._ds.file_order(epoch)}  # only the current epoch kept
    return self._orders[epoch]

  def _exhausted(self) -> bool:
    return self._ds.num_epochs is not None and self._epoch >= self._ds.num_epochs

  def __next__(self) -> str:
    self._assert_not_closed()
    ds = self._ds
    while not self._exhausted():
      if self._reader is None:
        path = ds.files[self._order(self._epoch)[self._file]]
        self._reader = iter_file(
            path, strict=ds.strict, pile_set_names=ds.pile_set_names, report=self.report,
            start_line=self._line, shard_index=ds.shard_index, shard_count=ds.shard_count)
      item = next(self._reader, None)
      if item is not None:
        self._line, text, _ = item
        self._epoch_has_documents = True
        return text
      self._reader = None  # the file is done: the next one, or the next epoch
      self._file, self._line = self._file + 1, 0
      if self._file == len(ds.files):
        if not self._epoch_has_documents:
          raise DataError(
              f"{ds.patterns}: epoch {self._epoch} of the stream yielded no document "
              f"(shard {ds.shard_index} of {ds.shard_count}, {len(ds.files)} file(s); "
              f"skipped so far: {describe_skipped(self.report)}); expected at least one "
              "non-empty Pile-format document per epoch")
        self._epoch, self._file, self._epoch_has_documents = self._epoch + 1, 0, False
    raise StopIteration

  def get_state(self) -> dict[str, int]:
    """``{"epoch", "file", "line"}`` as plain ints (JSON-safe); see the class docstring."""
    return {"epoch": int(self._epoch), "file": int(self._file), "line": int(self._line)}

  def set_state(self, state: dict) -> None:
    """Resumes at a state from `get_state` (of an iterator of an equal dataset).

    Raises:
      DataError: a state that is not ``{"epoch", "file", "line"}`` ints in range,
        naming the key and the expected range.
    """
    if not isinstance(state, dict) or set(state) != set(_STATE_KEYS):
      raise DataError(f"state = {state!r}: expected a dict with exactly the keys "
                      f"{_STATE_KEYS} from JsonlStreamIterator.get_state()")
    num_epochs = self._ds.num_epochs
    epoch = _check_index("state['epoch']", state["epoch"], 0,
                         None if num_epochs is None else num_epochs + 1)
    file = _check_index("state['file']", state["file"], 0, len(self._ds.files))
    line = _check_index("state['line']", state["line"], 0)
    if self._reader is not None:
      self._reader.close()
    self._reader = None
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
