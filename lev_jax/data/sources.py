"""The data sources: `load(config)` reads ``config.data`` once into a `DataBundle`.

Sources (``config.data.source``):

* ``'embedded'``: a corpus frozen in the package, chosen by ``config.data.corpus``
  (`embedded.CORPORA`): ``python_docs`` (default), CPython 3.11.7's pydoc topics and
  standard-library docstrings (607 documents, 2.3 MB); ``debian_books``, four Debian
  manuals (1,050 sections, 2.0 MB of prose); ``foldoc``, the Free On-line Dictionary of
  Computing (6,366 entries, 3.9 MB). Each is sha256-checked
  (`embedded.embedded_documents`), written once as Pile-format JSONL under
  ``config.data.cache_dir`` and split per document by a hash of its text (a test split
  too with ``data.test_fraction`` > 0, for ``lev-eval --split=test``);
* ``'jsonl'``: Pile-format ``*.jsonl`` / ``*.jsonl.zst`` files or globs (local or
  ``gs://``) in ``config.data.train_files`` read into memory (and ``validation_files``,
  else a hash hold-out of ``validation_fraction``); small corpora;
* ``'jsonl_stream'``: the same files streamed (`stream.JsonlStreamDataset`); no
  preparation step; token counts and a SentencePiece vocabulary from the first
  `STREAM_SAMPLE_DOCUMENTS` documents of the training stream;
* ``'prepared'``: the ArrayRecord dataset written by ``lev-prepare-data``
  (`prepared.open_prepared`), with its own tokenizer, token counts and data report.

The in-memory and streamed sources build their tokenizer from the training text
(cached under ``{cache_dir}/tokenizers``) and cache the training split's token counts
beside it, keyed by the documents, the vocabulary size and the tokenizer.

`evaluation_batches` is the evaluation data of a checkpoint's config (``lev-eval``): the
configured validation split with the checkpoint's tokenizer, or given files read whole.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import os
from collections.abc import Sequence

from absl import logging
from etils import epath
import grain
import ml_collections
import numpy as np

from lev_jax.config import ConfigError
from lev_jax.data.bundle import DataBundle
from lev_jax.data.corpus import expand_files, read_documents
from lev_jax.data.embedded import DEFAULT_CORPUS, write_embedded_corpus
from lev_jax.data.errors import DataError
from lev_jax.data.files import npy_bytes, read_npy, write_bytes_atomic
from lev_jax.data.pipeline import count_tokens, make_eval_batches, token_counts
from lev_jax.data.splits import split_documents
from lev_jax.data.tokenizer import cache_key, make_tokenizer

# jsonl_stream: token counts (for the frequency buckets) and a SentencePiece vocabulary
# come from the first documents of the stream, up to these many.
STREAM_SAMPLE_DOCUMENTS = 20_000


def _read(patterns: Sequence[str] | str, d: ml_collections.ConfigDict, field: str):
  if isinstance(patterns, (str, os.PathLike)):  # a lone path, not a sequence of them
    patterns = [patterns]
  try:
    return read_documents(list(patterns), strict=d.strict,
                          pile_set_names=tuple(d.pile_set_names))
  except DataError as e:
    raise DataError(f"config.data.{field}: {e}") from e


def _stream(patterns, d: ml_collections.ConfigDict, field: str, **kwargs):
  """A `stream.JsonlStreamDataset` of config.data.<field> (kwargs: its options)."""
  from lev_jax.data.stream import JsonlStreamDataset  # pylint: disable=g-import-not-at-top
  if isinstance(patterns, (str, os.PathLike)):
    patterns = [patterns]
  try:
    return JsonlStreamDataset(list(patterns), seed=d.seed, strict=d.strict,
                              pile_set_names=tuple(d.pile_set_names), **kwargs)
  except DataError as e:
    raise DataError(f"config.data.{field}: {e}") from e


def _cached_counts(tokenizer, docs: list[str], vocab_size: int, path: epath.Path
                   ) -> tuple[np.ndarray, epath.Path]:
  """Token counts of docs, cached at `path` (keyed by the docs, vocab and tokenizer); a
  cache file that is unreadable or of another shape is counted and written again."""
  if path.exists():
    try:
      counts_V = read_npy(path)
    except (ValueError, OSError, EOFError) as e:  # truncated or not a .npy file
      logging.warning("%s: unreadable cached token counts (%s); counting again", path, e)
      counts_V = None
    if counts_V is not None and counts_V.shape == (vocab_size,) and (
        counts_V.dtype == np.int64):
      return counts_V, path
  counts_V = token_counts(docs, tokenizer, vocab_size)
  write_bytes_atomic(path, npy_bytes(counts_V))
  return counts_V, path


def _check_not_empty(train_docs, validation_docs, d) -> None:
  if not train_docs:
    where = (f"the embedded corpus {d.get('corpus', DEFAULT_CORPUS)!r}"
             if d.source == "embedded"
             else f"config.data.train_files = {tuple(d.train_files)}")
    raise DataError(f"the training split has no documents: {where} gave no non-empty text"
                    + (f" in subsets {tuple(d.pile_set_names)} (config.data.pile_set_names)"
                       if d.pile_set_names else ""))
  if not validation_docs:
    if d.source == "jsonl" and d.validation_files:
      where = f"config.data.validation_files = {tuple(d.validation_files)} gave no non-empty text"
    else:
      where = (f"holding out config.data.validation_fraction = {d.validation_fraction} of "
               f"{len(train_docs)} training documents selected none; set "
               "config.data.validation_files or raise data.validation_fraction")
    raise DataError(f"the validation split has no documents: {where}")


def _check_disjoint(d: ml_collections.ConfigDict) -> None:
  """DataError when a file that data.train_files resolves to (a folder, a glob) is also
  a validation or test file: training would see the held-out documents. Patterns that
  name no file are left to the readers, which report them with their field."""
  def files(field):
    try:
      return {os.path.normpath(os.fspath(p))
              for p in expand_files(list(d[field]), warn=False)} if d[field] else set()
    except DataError:
      return set()
  train = files("train_files")
  for field in ("validation_files", "test_files"):
    shared = sorted(train & files(field))
    if shared:
      raise DataError(f"config.data.{field}: {shared[0]} is also matched by "
                      "config.data.train_files; a file belongs to one split only")


@contextlib.contextmanager
def _writing_cache(d: ml_collections.ConfigDict):
  """OSError while writing under ``data.cache_dir`` -> DataError naming the field."""
  try:
    yield
  except OSError as e:
    where = f" ({e.filename})" if e.filename else ""
    raise DataError(f"config.data.cache_dir = {d.cache_dir!r}: cannot write the data cache "
                    f"there: {e.strerror or e}{where}; expected a folder you can write "
                    "to") from e


def _in_memory(config, report: dict) -> DataBundle:
  """Sources 'embedded' and 'jsonl': every document in memory, split, tokenizer, counts."""
  d = config.data
  cache_dir = epath.Path(os.path.expanduser(d.cache_dir))
  if d.source == "embedded":
    corpus = d.get("corpus", DEFAULT_CORPUS)
    with _writing_cache(d):
      paths = write_embedded_corpus(cache_dir, d.validation_fraction, d.test_fraction,
                                    corpus=corpus)
    report["corpus"] = corpus
    report["corpus_paths"] = {k: os.fspath(v) for k, v in paths.items()}
    train_docs, report["train"] = _read([paths["train"]], d, "cache_dir")
    validation_docs, report["validation"] = _read([paths["validation"]], d, "cache_dir")
  else:
    train_docs, report["train"] = _read(d.train_files, d, "train_files")
    if d.validation_files:
      validation_docs, report["validation"] = _read(d.validation_files, d,
                                                    "validation_files")
    else:
      train_docs, validation_docs = split_documents(train_docs, d.validation_fraction)
  _check_not_empty(train_docs, validation_docs, d)
  tokenizer, counts_path = _tokenizer(config, train_docs, report)
  with _writing_cache(d):
    counts_V, counts_path = _cached_counts(tokenizer, train_docs, config.model.vocab_size,
                                           counts_path)
  report.update(train_tokens=int(counts_V.sum()), counts_path=os.fspath(counts_path))
  logging.info(
      "Data (%s): %d train documents (%d tokens, eos included), %d validation documents; "
      "tokenizer %s; "
      "token counts %s.", " ".join(filter(None, (d.source, report.get("corpus")))),
      len(train_docs), report["train_tokens"],
      len(validation_docs), report["tokenizer_path"], report["counts_path"])
  return DataBundle(tokenizer=tokenizer, report=report, token_counts_V=counts_V,
                    config=config, train_documents=lambda i, n: train_docs[i::n],
                    validation_documents=validation_docs)


def _tokenizer(config, sample_docs: list[str], report: dict):
  """The configured tokenizer and the path of its token-counts cache file."""
  d = config.data
  cache_dir = epath.Path(os.path.expanduser(d.cache_dir)) / "tokenizers"
  try:
    with _writing_cache(d):
      cache_dir.mkdir(parents=True, exist_ok=True)
      tokenizer = make_tokenizer(d, config.model.vocab_size, train_texts=sample_docs,
                                 cache_dir=cache_dir)
  except DataError as e:
    raise DataError(e if "config." in str(e) else f"config.model.vocab_size: {e}") from e
  if tokenizer.name == "sentencepiece":
    report["tokenizer_path"] = os.fspath(tokenizer.model_path)
  else:
    report["tokenizer_path"] = (d.tiktoken_file or "tiktoken:o200k_base"
                                if tokenizer.name == "o200k_base" else "bytes")
  key = cache_key(sample_docs, config.model.vocab_size)[:16]
  counts_path = cache_dir / f"{tokenizer.name}-{tokenizer.fingerprint[:12]}-{key}.counts.npy"
  return tokenizer, counts_path


def _streamed(config, report: dict) -> DataBundle:
  """Source 'jsonl_stream': nothing read up front beyond a sample of the training
  stream (tokenizer training, token counts)."""
  d = config.data
  # Quiet: the training stream reads these lines again and logs their skips then.
  sample_stream = _stream(d.train_files, d, "train_files", num_epochs=1, warn=False)
  sample_docs = list(itertools.islice(iter(sample_stream), STREAM_SAMPLE_DOCUMENTS))
  tokenizer, counts_path = _tokenizer(config, sample_docs, report)
  with _writing_cache(d):
    counts_V, counts_path = _cached_counts(tokenizer, sample_docs, config.model.vocab_size,
                                           counts_path)
  validation = _stream(d.validation_files, d, "validation_files", num_epochs=1,
                       encode=tokenizer.encode)
  # train, validation, train_tokens: counted as the streams are read (current_report).
  report.update(train_tokens=None, counts_path=os.fspath(counts_path), train=None,
                validation=None, counts_from=(
                    f"the first {len(sample_docs)} documents of the training stream "
                    f"({int(counts_V.sum())} tokens, eos included)"))
  logging.info("Data (jsonl_stream): token counts from %s; tokenizer %s.",
               report["counts_from"], report["tokenizer_path"])
  return DataBundle(
      tokenizer=tokenizer, report=report, token_counts_V=counts_V, config=config,
      train_documents=lambda i, n: _stream(d.train_files, d, "train_files",
                                           shard_index=i, shard_count=n,
                                           encode=tokenizer.encode),
      validation_documents=validation)


def _prepared(config, report: dict) -> DataBundle:
  """Source 'prepared': the lev-prepare-data dataset at data.prepared_dir."""
  from lev_jax.data import prepared  # pylint: disable=g-import-not-at-top
  d = config.data
  try:
    dataset = prepared.open_prepared(os.path.expanduser(d.prepared_dir))
  except DataError as e:
    raise DataError(f"config.data.prepared_dir: {e}") from e
  dataset.check_vocab(config.model.vocab_size)
  tokenizer = dataset.tokenizer
  if tokenizer.name != d.tokenizer:
    raise DataError(
        f"config.data.tokenizer = {d.tokenizer!r} but {d.prepared_dir} was prepared with "
        f"{tokenizer.name!r}: model and data must agree (prepare again or fix the config)")
  if "validation" not in dataset.splits:
    raise DataError(f"config.data.prepared_dir: {d.prepared_dir} has no validation split "
                    "(set data.validation_files and run lev-prepare-data again)")
  train_source = dataset.source("train")
  splits = (dataset.report or {}).get("splits", {})
  report.update(prepared_dir=os.fspath(d.prepared_dir), preparation=dataset.report,
                train=splits.get("train"), validation=splits.get("validation"),
                train_tokens=int(dataset.token_counts_V.sum()),
                tokenizer_path=os.fspath(epath.Path(d.prepared_dir) / prepared.TOKENIZER_DIR),
                counts_path=os.fspath(epath.Path(d.prepared_dir) / prepared.COUNTS_FILE))
  logging.info("Data (prepared %s): %d train / %d validation documents, %d train tokens "
               "(eos included); tokenizer %s.", d.prepared_dir, dataset.splits["train"],
               dataset.splits["validation"], report["train_tokens"], tokenizer.name)
  return DataBundle(
      tokenizer=tokenizer, report=report, token_counts_V=dataset.token_counts_V,
      config=config,
      train_documents=lambda i, n: grain.MapDataset.source(train_source)[i::n],
      validation_documents=dataset.source("validation"))


def load(config: ml_collections.ConfigDict) -> DataBundle:
  """Reads the documents (or opens the stream / prepared dataset), the tokenizer and
  the token counts of ``config.data``.

  Reads ``config.data`` (source, corpus, train_files, validation_files, pile_set_names,
  validation_fraction, cache_dir, strict, tokenizer, tiktoken_file,
  sentencepiece_file, prepared_dir) and ``config.model.vocab_size``; the bundle's batch
  methods read ``config.train.seq_len``, ``config.data.shuffle_buffer`` / ``seed`` /
  ``segment_masking`` and ``config.eval.batch_size`` / ``batches``.

  Raises:
    DataError: missing or bad files (named, with ``config.data.<field>``); an unknown,
      missing or damaged ``data.corpus`` (one line naming the field or file); an empty
      training or validation split, a file in both data.train_files and
      validation_files (or test_files), an unfinished or mismatched prepared dataset, a
      vocab_size the tokenizer does not have, or a ``data.cache_dir`` that cannot be
      written (named, with the OS reason).
  """
  d = config.data
  report = {"source": d.source, "validation": None, "corpus_paths": None}
  if d.source in ("jsonl", "jsonl_stream"):
    _check_disjoint(d)
  loaders = {"embedded": _in_memory, "jsonl": _in_memory, "jsonl_stream": _streamed,
             "prepared": _prepared}
  if d.source not in loaders:
    raise DataError(f"config.data.source = {d.source!r}: expected 'embedded', 'jsonl', "
                    "'jsonl_stream' or 'prepared'")
  bundle = loaders[d.source](config, report)
  # In the run's data_report.json: lev-eval tells a replaced tokenizer/ by it.
  report["tokenizer_fingerprint"] = bundle.tokenizer.fingerprint
  return bundle


def evaluation_batches(config: ml_collections.ConfigDict, tokenizer, *,
                       files: Sequence[str] | None = None, split: str = "validation"
                       ) -> tuple[list[dict[str, np.ndarray]], np.ndarray | None, dict]:
  """The evaluation batches of a checkpoint's config, encoded with its tokenizer.

  Args:
    config: the checkpoint's config with any overrides applied; not changed (the data
      is loaded from a copy).
    tokenizer: the checkpoint's tokenizer. For ``data.tokenizer = 'sentencepiece'``
      its model file is the copy's ``data.sentencepiece_file``, so that no vocabulary
      is trained again.
    files: None: the configured validation split, as `load` reads it (source, files,
      hold-out, caches); else paths, globs or folders of Pile-format files read whole
      (``data.strict`` and ``data.pile_set_names`` apply; ``data.source`` and
      ``train_files`` are not read).
    split: the split name that the data record gives `files` ("validation" or
      "test"); the configured split is always "validation".

  Returns:
    ``(batches, token_counts_V, record)``: ``config.eval.batches`` batches of
    ``{"inputs", "targets": int32 [eval.batch_size, train.seq_len], "weights": float32
    [...]}`` (`pipeline.make_eval_batches`); the training split's token counts, int64
    [model.vocab_size] (None with `files`); and `evaluate.data_record` of the batches
    (split, files, sha256, tokens evaluated of the split's).

  Raises:
    ConfigError: ``config.data`` builds a tokenizer other than `tokenizer`.
    DataError: as `load` (configured split) or `corpus.read_documents` (files); less
      than one batch of tokens (`pipeline.make_eval_batches`).
  """
  from lev_jax.eval.evaluate import data_record  # pylint: disable=g-import-not-at-top
  d = config.data
  if files is None:
    config = copy.deepcopy(config)
    if d.tokenizer == "sentencepiece" and hasattr(tokenizer, "model_path"):
      config.data.sentencepiece_file = str(tokenizer.model_path)
    bundle = load(config)
    if bundle.tokenizer.fingerprint != tokenizer.fingerprint:
      raise ConfigError("config.data builds a different tokenizer than the checkpoint's "
                        f"({bundle.tokenizer!r} vs {tokenizer!r})")
    return bundle.eval_batches(), bundle.token_counts_V, bundle.eval_data()
  files = [files] if isinstance(files, (str, os.PathLike)) else list(files)
  texts, _ = read_documents(files, strict=d.strict, pile_set_names=tuple(d.pile_set_names))
  if not len(texts):  # newcomer pass 6: "no validation documents" named no file
    raise DataError(f"the {split} split has no documents: {', '.join(map(str, files))} gave "
                    "no non-empty text; expected Pile-format JSONL lines with a \"text\" "
                    "field")
  batches = make_eval_batches(texts, tokenizer, seq_len=config.train.seq_len,
                              batch_size=config.eval.batch_size, n_batches=config.eval.batches,
                              vocab_size=config.model.vocab_size,
                              segment_masking=d.segment_masking)
  return batches, None, data_record(batches, split=split, files=files,
                                    tokens_in_split=count_tokens(texts, tokenizer))
