"""The corpora and tokenizers of lev_jax as seqio vocabularies, Tasks and Mixtures.

For using lev_jax data with seqio-based tooling (T5X, evaluation harnesses); training
never imports this module, which imports seqio and so TensorFlow (~5 s).

* `as_seqio_vocabulary`: SentencePiece -> ``seqio.SentencePieceVocabulary`` (same model
  proto, same ids: pad 0 / unk 1 / eos 2), bytes -> ``seqio.ByteVocabulary``,
  o200k_base -> `TiktokenVocabulary` (tiktoken called from ``tf.numpy_function``).
* `register_jsonl_task`, `register_embedded_task`: a ``seqio.Task`` per corpus whose
  examples are ``{"targets": int32 [n <= L]}`` ending in eos (``L`` =
  ``sequence_length["targets"]``) plus ``"targets_pretokenized"`` (the text).
* `register_pile_mixture`: one Task per Pile subset (``meta.pile_set_name``) and a
  ``seqio.Mixture`` sampling them by rate.

Library: seqio, https://github.com/google/seqio (README "Task", "Mixture",
``seqio/vocabularies.py`` for the ``Vocabulary`` contract).
"""

from __future__ import annotations

import functools
import hashlib
import math
import numbers
import os
import re
import tempfile
from collections.abc import Mapping, Sequence

import numpy as np
import seqio
import tensorflow as tf

from lev_jax.data import corpus, embedded
from lev_jax.data.errors import DataError
from lev_jax.data.files import write_bytes_atomic
from lev_jax.data.tokenizer import ByteTokenizer, SentencePieceTokenizer, TiktokenTokenizer

# seqio.dataset_providers._VALID_TASK_NAME_REGEX: Task names allow only these.
_NAME_RE = re.compile(r"^[\w.:#]+$")
_NAME_BAD_CHARS = re.compile(r"[^\w.:#]")


class TiktokenVocabulary(seqio.Vocabulary):
  """o200k_base (a `TiktokenTokenizer`) as a ``seqio.Vocabulary``.

  Python ``_encode`` / ``_decode`` call the tokenizer; TF ``_encode_tf`` /
  ``_decode_tf`` call it through ``tf.numpy_function`` (so the graph holds Python
  callbacks: it runs in this process only, and cannot be serialised to a SavedModel).
  eos = 199999 (<|endoftext|>), no unk (every string encodes; unassigned or negative ids
  are dropped when decoding), no bos. seqio's pad id 0 is a real token here ("!"): seqio
  pads with 0, so padding must be told apart by length or segment ids, not by value.

  Args:
    tokenizer: the o200k_base tokenizer.
  """

  def __init__(self, tokenizer: TiktokenTokenizer):
    self._tokenizer = tokenizer
    super().__init__(extra_ids=0)

  @property
  def tokenizer(self) -> TiktokenTokenizer:
    return self._tokenizer

  @property
  def bos_id(self) -> None:
    return None

  @property
  def eos_id(self) -> int:
    return self._tokenizer.eos_id

  @property
  def unk_id(self) -> None:
    return None

  @property
  def _base_vocab_size(self) -> int:
    return self._tokenizer.vocab_size

  def _encode(self, s) -> list[int]:
    """Ids of `s` (str or UTF-8 bytes), without eos."""
    if isinstance(s, bytes):
      s = _utf8(s)
    return self._tokenizer.encode(s)

  def _decode(self, ids) -> str:
    """Text of `ids` up to (not including) the first eos; ids < 0 (padding) dropped."""
    ids = [int(i) for i in ids]
    if self.eos_id in ids:
      ids = ids[:ids.index(self.eos_id)]
    ids = [i for i in ids if i >= 0]
    try:
      return self._tokenizer.decode(ids)
    except KeyError:  # ids tiktoken does not assign (e.g. 200000..200017)
      return self._tokenizer.decode([i for i in ids if self._is_token(i)])

  def _is_token(self, i: int) -> bool:
    try:
      self._tokenizer.decode([i])
      return True
    except KeyError:
      return False

  def _encode_np(self, s) -> np.ndarray:
    # tf.numpy_function passes bytes in a graph (tf.data), a 0-d object array eagerly.
    s = s.item() if isinstance(s, np.ndarray) else s
    return np.asarray(self._encode(s), np.int32)

  def _encode_flat_np(self, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    rows = self._tokenizer.encode_batch([_utf8(b) for b in s.tolist()])
    lengths = np.asarray([len(r) for r in rows], np.int64)
    values = np.asarray([i for r in rows for i in r], np.int32)
    return values, lengths

  def _encode_tf(self, s: tf.Tensor) -> tf.Tensor | tf.RaggedTensor:
    """tf.string [...] -> int32 ids: [n] for a scalar; else ragged [..., None].

    Raises:
      DataError: `s` has an unknown rank.
    """
    s = tf.convert_to_tensor(s, tf.string)
    if s.shape.rank is None:
      raise DataError("TiktokenVocabulary.encode_tf: expected a tf.string tensor of "
                      "known rank, got an unknown rank")
    if s.shape.rank == 0:
      ids = tf.numpy_function(self._encode_np, [s], tf.int32, stateful=False)
      ids.set_shape([None])
      return ids
    values, lengths = tf.numpy_function(self._encode_flat_np, [tf.reshape(s, [-1])],
                                        [tf.int32, tf.int64], stateful=False)
    values.set_shape([None])
    lengths.set_shape([None])
    ids = tf.RaggedTensor.from_row_lengths(values, lengths)
    shape = tf.shape(s, out_type=tf.int64)
    for axis in range(s.shape.rank - 1, 0, -1):  # regroup the flattened outer axes
      ids = tf.RaggedTensor.from_uniform_row_length(ids, shape[axis])
    return ids

  def _decode_np(self, ids: np.ndarray) -> np.ndarray:
    n_rows = math.prod(ids.shape[:-1])
    text = np.empty(n_rows, dtype=object)
    for r, row in enumerate(ids.reshape(n_rows, ids.shape[-1])):
      text[r] = self._decode(row).encode("utf-8", "surrogatepass")
    return text.reshape(ids.shape[:-1])

  def _decode_tf(self, ids) -> tf.Tensor:
    """int ids [..., n] (dense or ragged) -> tf.string [...], each up to its first eos.

    Raises:
      DataError: `ids` is a scalar.
    """
    if isinstance(ids, tf.RaggedTensor):
      ids = ids.to_tensor(default_value=-1)  # -1: dropped by _decode (0 is "!")
    ids = tf.cast(tf.convert_to_tensor(ids), tf.int64)
    if ids.shape.rank == 0:
      raise DataError("TiktokenVocabulary.decode_tf: expected ids of rank >= 1, got a "
                      "scalar")
    text = tf.numpy_function(self._decode_np, [ids], tf.string, stateful=False)
    text.set_shape(ids.shape[:-1])
    return text

  def decode_tf(self, ids) -> tf.Tensor:
    """Like ``seqio.Vocabulary.decode_tf`` (text through the first eos) without its
    masking: that replaces ids after eos with pad id 0, which here decodes to "!"."""
    return self._decode_tf(ids)

  def __eq__(self, other) -> bool:
    return (isinstance(other, TiktokenVocabulary)
            and other.tokenizer.fingerprint == self._tokenizer.fingerprint)

  def __hash__(self) -> int:
    return hash(self._tokenizer.fingerprint)

  def __str__(self) -> str:
    return (f"TiktokenVocabulary(o200k_base, vocab_size={self.vocab_size}, "
            f"sha256={self._tokenizer.fingerprint[:16]})")


def _utf8(data: bytes) -> str:
  """`data` as text: surrogates written with "surrogatepass" come back; other invalid
  UTF-8 becomes U+FFFD."""
  try:
    return data.decode("utf-8", "surrogatepass")
  except UnicodeDecodeError:
    return data.decode("utf-8", "replace")


def _spm_model_file(tokenizer: SentencePieceTokenizer) -> str:
  """A local file holding exactly the tokenizer's model proto, named by its sha256.

  seqio caches loaded models by file path (``functools.lru_cache``), so a path must
  never change content: the proto goes to ``{tempdir}/lev_jax_spm/{sha256}.model``.
  """
  proto = tokenizer.model_proto
  folder = os.path.join(tempfile.gettempdir(), "lev_jax_spm")
  path = os.path.join(folder, f"{hashlib.sha256(proto).hexdigest()}.model")
  if not os.path.exists(path):
    os.makedirs(folder, exist_ok=True)
    write_bytes_atomic(path, proto)
  return path


def as_seqio_vocabulary(tokenizer) -> seqio.Vocabulary:
  """The ``seqio.Vocabulary`` giving the same ids as `tokenizer`.

  Args:
    tokenizer: a SentencePieceTokenizer, ByteTokenizer or TiktokenTokenizer.

  Returns:
    ``seqio.SentencePieceVocabulary`` over the same model proto (ids, eos 2, unk 1
    unchanged; encode_tf through tensorflow_text's SentencePiece op),
    ``seqio.ByteVocabulary()`` (identical id layout to ByteTokenizer), or a
    `TiktokenVocabulary`.

  Raises:
    DataError: any other object.
  """
  if isinstance(tokenizer, SentencePieceTokenizer):
    return seqio.SentencePieceVocabulary(_spm_model_file(tokenizer))
  if isinstance(tokenizer, ByteTokenizer):
    return seqio.ByteVocabulary()
  if isinstance(tokenizer, TiktokenTokenizer):
    return TiktokenVocabulary(tokenizer)
  raise DataError(f"tokenizer = {tokenizer!r}: expected a SentencePieceTokenizer, "
                  "TiktokenTokenizer or ByteTokenizer")


def _check_name(name: str, what: str) -> str:
  if not isinstance(name, str) or not _NAME_RE.match(name):
    raise DataError(f"{what} = {name!r}: expected a seqio name of letters, digits and "
                    "'_', '.', ':', '#' only")
  return name


def _documents_fn(task: str, files: dict[str, list], strict: bool,
                  pile_set_names: tuple[str, ...]):
  """dataset_fn(split, shuffle_files, seed=None) for ``seqio.FunctionDataSource``."""

  def generate(split: str):
    count = 0
    for path in files[split]:  # file order, then line order, streamed
      for _, text, _ in corpus.iter_file(path, strict=strict,
                                         pile_set_names=pile_set_names):
        count += 1
        yield {"text": text.encode("utf-8", "surrogatepass")}
    if not count:
      subsets = f" with meta.pile_set_name in {pile_set_names}" if pile_set_names else ""
      raise DataError(f"seqio task {task!r}, split {split!r}: "
                      f"{[os.fspath(p) for p in files[split]]} hold no documents{subsets}")

  def dataset_fn(split: str, shuffle_files: bool, seed: int | None = None
                 ) -> tf.data.Dataset:
    del shuffle_files, seed  # one ordered stream; Task.get_dataset shuffles examples
    if split not in files:
      raise DataError(f"seqio task {task!r}: no split {split!r}; expected one of "
                      f"{sorted(files)}")
    return tf.data.Dataset.from_generator(
        functools.partial(generate, split),
        output_signature={"text": tf.TensorSpec(shape=(), dtype=tf.string)})

  return dataset_fn


def register_jsonl_task(name: str, *, files: Mapping[str, object], tokenizer,
                        pile_set_names: Sequence[str] = (), strict: bool = False
                        ) -> seqio.Task:
  """Registers (or replaces) a ``seqio.Task`` over Pile-format JSONL files.

  Source: ``seqio.FunctionDataSource`` yielding ``{"text": tf.string []}`` per kept
  document, streamed with `corpus.iter_file` in file then line order (bad lines are
  skipped and counted as there, or raise with ``strict``). ``shuffle_files`` is a
  no-op: the stream is always in order, and ``get_dataset(shuffle=True)`` shuffles
  examples in the Task's buffer (seqio's default, 1000). Preprocessors: ``rekey`` text -> "targets",
  ``tokenize`` (keeps "targets_pretokenized"), ``append_eos_after_trim``. Output
  features: ``{"targets": seqio.Feature(vocabulary, add_eos=True)}`` (int32).

  Args:
    name: the Task name (letters, digits, ``_ . : #``); an existing one is replaced.
    files: split name -> path, glob, folder or list of them (``*.jsonl[.zst]``, local or
      gs://), resolved to files now with `corpus.expand_files` (which, unless
      ``strict``, skips and warns about missing paths or empty globs while others
      match).
    tokenizer: a lev_jax tokenizer (`as_seqio_vocabulary`).
    pile_set_names: keep only documents of these ``meta.pile_set_name``; () keeps all.
    strict: a bad JSON line raises instead of being skipped.

  Returns:
    The registered Task; its ``get_dataset(sequence_length={"targets": L}, split=...)``
    yields ``{"targets": int32 [<= L], "targets_pretokenized": tf.string []}``.

  Raises:
    DataError: a bad name, no splits, or a split whose patterns name no file (with
      ``strict``: any missing path or empty glob), naming the split. While iterating:
      a bad line (strict) or a split holding no kept documents, raised inside tf.data
      (the message is kept; the type becomes ``tf.errors.InvalidArgumentError``).
  """
  _check_name(name, "task name")
  if not files:
    raise DataError(f"seqio task {name!r}: files is empty; expected a dict of split "
                    "name -> Pile-format file patterns")
  resolved = {}
  for split, patterns in files.items():
    try:
      resolved[split] = corpus.expand_files(patterns, strict=strict)
    except DataError as e:
      raise DataError(f"seqio task {name!r}, files[{split!r}]: {e}") from e
  vocabulary = as_seqio_vocabulary(tokenizer)
  seqio.TaskRegistry.remove(name)
  return seqio.TaskRegistry.add(
      name,
      source=seqio.FunctionDataSource(
          _documents_fn(name, resolved, strict, tuple(pile_set_names)),
          splits=tuple(resolved)),
      preprocessors=[
          functools.partial(seqio.preprocessors.rekey, key_map={"targets": "text"}),
          seqio.preprocessors.tokenize,
          seqio.preprocessors.append_eos_after_trim,
      ],
      output_features={"targets": seqio.Feature(vocabulary, add_eos=True)})


def register_embedded_task(name: str = "lev_embedded", *, cache_dir,
                           validation_fraction: float = 0.05, tokenizer,
                           corpus: str = embedded.DEFAULT_CORPUS) -> seqio.Task:
  """`register_jsonl_task` over a frozen corpus (`embedded.write_embedded_corpus`;
  `corpus` is a name of `embedded.CORPORA`): splits "train" and "validation", written
  under `cache_dir` on first use.

  Raises:
    DataError: validation_fraction outside (0, 1), an unknown or damaged corpus, or as
      `register_jsonl_task`.
  """
  paths = embedded.write_embedded_corpus(cache_dir, validation_fraction, corpus=corpus)
  return register_jsonl_task(name, files={k: [p] for k, p in paths.items()},
                             tokenizer=tokenizer)


def register_pile_mixture(name: str, *, files: Mapping[str, object],
                          rates: Mapping[str, float], tokenizer) -> seqio.Mixture:
  """Registers one Task per Pile subset and a ``seqio.Mixture`` sampling them by rate.

  Task ``f"{name}_{subset}"`` (characters seqio forbids in names, such as the space and
  "-" of "Pile-CC", become "_") reads `files` keeping only ``meta.pile_set_name ==
  subset``. The mixture draws each example from task i with probability rate_i /
  sum(rates) (``tf.data.Dataset.sample_from_datasets``); its ``get_dataset`` repeats
  the tasks forever by default (``num_epochs=None``). Existing registrations of the
  same names are replaced.

  Args:
    name: the Mixture name (letters, digits, ``_ . : #``).
    files: split name -> Pile-format file patterns, as in `register_jsonl_task`.
    rates: subset (``meta.pile_set_name``) -> positive sampling weight.
    tokenizer: a lev_jax tokenizer.

  Returns:
    The registered Mixture.

  Raises:
    DataError: no rates, a rate that is not a positive finite number (naming the
      subset), two subsets with the same task name, or as `register_jsonl_task`.
  """
  _check_name(name, "mixture name")
  if not rates:
    raise DataError(f"seqio mixture {name!r}: rates is empty; expected "
                    "{pile_set_name: positive rate}")
  task_names = {}
  for subset, rate in rates.items():
    if (isinstance(rate, bool) or not isinstance(rate, numbers.Real)
        or not math.isfinite(rate) or rate <= 0):
      raise DataError(f"seqio mixture {name!r}: rates[{subset!r}] = {rate!r}; expected "
                      "a positive finite number")
    task = f"{name}_{_NAME_BAD_CHARS.sub('_', str(subset))}"
    if task in task_names.values():
      other = next(s for s, t in task_names.items() if t == task)
      raise DataError(f"seqio mixture {name!r}: subsets {other!r} and {subset!r} both "
                      f"map to the task name {task!r}")
    task_names[subset] = task
  tasks = [register_jsonl_task(task_names[subset], files=files, tokenizer=tokenizer,
                               pile_set_names=(subset,)) for subset in rates]
  seqio.MixtureRegistry.remove(name)
  return seqio.MixtureRegistry.add(
      name, [(task, float(rates[subset])) for subset, task in zip(rates, tasks)])
