"""Tokenizers: SentencePiece (trained here), o200k_base (tiktoken; the class is in
`lev_jax.data.tiktoken_tokenizer`) and UTF-8 bytes.

SentencePiece ids: pad = 0, unk = 1, eos = 2, no bos; id 3 is the newline. Byte fallback
makes every string encodable, and the identity normalisation (no NFKC, whitespace kept,
no dummy prefix) makes ``decode(encode(text)) == text`` for any text without U+2581
("▁", SentencePiece's whitespace symbol): that character encodes as a space does and
decodes as " " ("x▁y" -> "x y"; sentencepiece #863; no trainer option escapes it, and an
escape of our own would give other ids than the Hugging Face export and the seqio
vocabulary, which use the same model). Library:
SentencePiece, https://github.com/google/sentencepiece/blob/master/doc/options.md
(trainer options) and python/README.md (``sentence_iterator`` / ``model_writer``
training in memory).

Every tokenizer has ``name`` (one of config.TOKENIZERS), ``vocab_size``, ``eos_id``,
``pad_id``, ``fingerprint``, ``encode`` / ``encode_batch`` / ``decode``, and pickles
(data-preparation worker processes receive it). `make_tokenizer` builds the one
``config.data`` names and `check_vocab_agreement` is the one check that a model and a
tokenizer have the same number of ids. How a tokenizer is recorded in a folder and
rebuilt from it (`save_tokenizer`, `load_tokenizer`, `tokenizer_info`) is
`lev_jax.data.tokenizer_files`. Nothing here imports TensorFlow or seqio (see
`lev_jax.data.vocabularies` for those).
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import re
import time
from collections.abc import Iterator, Sequence

from absl import logging
from etils import epath
import sentencepiece as spm

from lev_jax import config as config_lib
from lev_jax.data.errors import DataError
from lev_jax.data.files import write_bytes_atomic
from lev_jax.data.tiktoken_tokenizer import TiktokenTokenizer

PAD_ID, UNK_ID, EOS_ID = 0, 1, 2
# Documents beyond this many characters are subsampled (every k-th) for training only.
MAX_TRAINING_CHARS = 50_000_000
# Longer lines (bytes) are split before training: SentencePiece drops longer sentences.
_MAX_LINE_BYTES = 1 << 14

# Every option that changes the model; part of the cache key.
TRAINER_SETTINGS = dict(
    model_type="bpe",
    # The trained model depends on the thread count (measured on the embedded corpus:
    # 1, 2, 8 and 16 threads give four different models), so it is fixed: the same
    # documents give the same vocabulary on every machine.
    num_threads=2,
    byte_fallback=True,               # unseen characters -> <0xNN> byte pieces, never unk
    pad_id=PAD_ID, unk_id=UNK_ID, eos_id=EOS_ID, bos_id=-1,
    normalization_rule_name="identity",
    remove_extra_whitespaces=False,
    add_dummy_prefix=False,
    allow_whitespace_only_pieces=True,  # runs of indentation become single pieces
    split_digits=True,
    user_defined_symbols=["\n"],
    character_coverage=0.9995,        # these characters get pieces; rarer ones bytes
    input_sentence_size=0,            # use every line given (no random sampling)
    max_sentence_length=_MAX_LINE_BYTES,
    hard_vocab_limit=True,
)


class SentencePieceTokenizer:
  """A trained SentencePiece model: text <-> int ids, pad 0 / unk 1 / eos 2, no bos.

  Args:
    model_path: a ``*.model`` file (local or `etils.epath` URL).

  Pickles as its path and serialized model proto (the processor is rebuilt from the
  proto, so the file need not exist where it is unpickled).

  Raises:
    DataError: the file is missing or not a SentencePiece model, or its special ids are
      not pad 0 / unk 1 / eos 2 / no bos.
  """

  name = "sentencepiece"

  def __init__(self, model_path):
    self.model_path = epath.Path(model_path)
    try:
      proto = self.model_path.read_bytes()
    except OSError as e:
      raise DataError(f"{self.model_path}: cannot load a SentencePiece model ({e}); "
                      "expected a *.model file written by train_sentencepiece") from e
    self._load(proto)

  def _load(self, proto: bytes) -> None:
    try:
      self._sp = spm.SentencePieceProcessor(model_proto=proto)
    except (RuntimeError, TypeError) as e:
      raise DataError(f"{self.model_path}: cannot load a SentencePiece model ({e}); "
                      "expected a *.model file written by train_sentencepiece") from e
    ids = (self._sp.pad_id(), self._sp.unk_id(), self._sp.eos_id(), self._sp.bos_id())
    if ids != (PAD_ID, UNK_ID, EOS_ID, -1):
      raise DataError(f"{self.model_path}: special ids (pad, unk, eos, bos) = {ids}; "
                      f"expected {(PAD_ID, UNK_ID, EOS_ID, -1)}")
    self._proto = proto

  def __getstate__(self) -> dict:
    return {"model_path": os.fspath(self.model_path), "proto": self._proto}

  def __setstate__(self, state: dict) -> None:
    self.model_path = epath.Path(state["model_path"])
    self._load(state["proto"])

  @property
  def model_proto(self) -> bytes:
    """The serialized SentencePiece ModelProto (the bytes of the *.model file)."""
    return self._proto

  @property
  def fingerprint(self) -> str:
    """sha256 hex of the model proto: equal fingerprints give equal ids."""
    return hashlib.sha256(self._proto).hexdigest()

  @property
  def vocab_size(self) -> int:
    """Number of ids, special and byte pieces included; every id is < vocab_size."""
    return self._sp.get_piece_size()

  @property
  def eos_id(self) -> int:
    return EOS_ID

  @property
  def pad_id(self) -> int:
    return PAD_ID

  def encode(self, text: str) -> list[int]:
    """Ids of `text`, without eos; ``decode(encode(text)) == text`` unless `text` holds
    U+2581 ("▁"), which encodes as a space and so decodes as " " (module docstring)."""
    return self._sp.encode(text, out_type=int)

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    """`encode` of each text (SentencePiece's multi-threaded batch path)."""
    return self._sp.encode(list(texts), out_type=int)

  def decode(self, ids) -> str:
    """Text of `ids` (list or int array); pad and eos decode to nothing."""
    return self._sp.decode([int(i) for i in ids])

  def id_to_piece(self, i: int) -> str:
    return self._sp.id_to_piece(int(i))

  def __repr__(self) -> str:
    return f"SentencePieceTokenizer({str(self.model_path)!r}, vocab_size={self.vocab_size})"


def _training_lines(docs: Sequence[str]) -> Iterator[str]:
  """Non-blank lines of the (sub-sampled) documents, cut to at most _MAX_LINE_BYTES."""
  total = sum(len(d) for d in docs)
  stride = max(1, math.ceil(total / MAX_TRAINING_CHARS))
  for doc in docs[::stride]:
    for line in doc.split("\n"):
      if not line.strip():
        continue
      # 4 bytes per character at most, so these pieces never exceed the byte limit.
      step = _MAX_LINE_BYTES // 4
      for start in range(0, len(line), step):
        yield line[start:start + step]


def cache_key(docs: Sequence[str], vocab_size: int) -> str:
  """sha256 over the documents, vocab_size, TRAINER_SETTINGS and the library version."""
  h = hashlib.sha256()
  h.update(json.dumps([vocab_size, TRAINER_SETTINGS, spm.__version__,
                       MAX_TRAINING_CHARS], sort_keys=True).encode())
  for doc in docs:
    data = doc.encode("utf-8", "surrogatepass")
    h.update(len(data).to_bytes(8, "little"))
    h.update(data)
  return h.hexdigest()


def train_sentencepiece(docs: Sequence[str], vocab_size: int, cache_dir
                        ) -> SentencePieceTokenizer:
  """Trains (or loads from the cache) a BPE SentencePiece model on `docs`.

  The model is ``{cache_dir}/spm-v{vocab_size}-{key[:16]}.model`` with key =
  `cache_key` (documents, vocab size, settings, library version): a second call with
  the same inputs loads it in milliseconds. Training is in memory
  (``SentencePieceTrainer.train(sentence_iterator=..., model_writer=...)``), one
  sentence per non-blank line, deterministic; the file is written to a temporary name,
  then `os.replace`-d into place.

  Args:
    docs: training texts.
    vocab_size: number of ids in the model (3 special + 1 newline + 256 bytes + merges).
    cache_dir: folder for the model (str or path-like; ``~`` expanded; created).

  Returns:
    The tokenizer; ``tokenizer.vocab_size == vocab_size``.

  Raises:
    DataError: no non-blank text, or a vocab_size the corpus cannot fill or that is
      below the 260 fixed pieces plus the characters covering 99.95% of the text (350
      for the embedded corpus), naming the vocab size and the corpus size; or a cached
      model that does not load or has another vocab size (``config.data.cache_dir:``,
      naming the file and saying to delete it).
  """
  cache = epath.Path(os.path.expanduser(os.fspath(cache_dir)))
  key = cache_key(docs, vocab_size)
  path = cache / f"spm-v{vocab_size}-{key[:16]}.model"
  if path.exists():
    return _cached_model(path, vocab_size)
  chars = sum(len(d) for d in docs)
  if not any(d.strip() for d in docs):
    raise DataError(f"cannot train a SentencePiece vocabulary of {vocab_size} on "
                    f"{len(docs)} documents with no non-blank text")
  start = time.perf_counter()
  writer = io.BytesIO()
  spm.set_random_generator_seed(0)
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=_training_lines(docs), model_writer=writer,
        vocab_size=vocab_size, minloglevel=2,
        **TRAINER_SETTINGS)
  except RuntimeError as e:
    reason = str(e).strip().rstrip(".")
    if "smaller than required_chars" in reason:  # "... required_chars. 3 vs 350. ..."
      need = re.search(r"required_chars\.\s*\d+\s+vs\s+(\d+)", reason)
      minimum = f"at least {need[1]}" if need else "more"
      raise DataError(
          f"vocab_size = {vocab_size} is too small for the training text's characters "
          f"({len(docs)} documents, {chars} characters): it needs {minimum} pieces, 260 "
          "fixed ones (pad, unk, eos, newline, 256 bytes) plus the characters that cover "
          "99.95% of the text; raise config.model.vocab_size") from e
    if "too high" in reason:
      raise DataError(
          f"vocab_size = {vocab_size} is too large for the corpus ({len(docs)} documents, "
          f"{chars} characters): {reason}. Use a smaller vocab_size or more text.") from e
    raise DataError(f"SentencePiece training failed on {len(docs)} documents "
                    f"({chars} characters), vocab_size = {vocab_size}: {reason}") from e
  cache.mkdir(parents=True, exist_ok=True)
  write_bytes_atomic(path, writer.getvalue())
  logging.info("Trained SentencePiece (bpe, vocab %d) on %d documents, %d characters in "
               "%.1f s -> %s", vocab_size, len(docs), chars, time.perf_counter() - start,
               path)
  return SentencePieceTokenizer(path)


def _cached_model(path: epath.Path, vocab_size: int) -> SentencePieceTokenizer:
  """The SentencePiece model `train_sentencepiece` cached at `path` (its name holds
  `vocab_size`), refused when damaged.

  Raises:
    DataError: ``config.data.cache_dir: <path> ...``: it does not load, or has another
      vocab size than its name says; deleting it makes the next run train it again.
  """
  advice = "delete it and it is trained again"
  try:
    tokenizer = SentencePieceTokenizer(path)
  except DataError as e:
    detail = str(e).removeprefix(f"{path}: ").split("; expected")[0]
    raise DataError(f"config.data.cache_dir: {path} is a damaged cached SentencePiece "
                    f"model ({detail}); {advice}") from e
  if tokenizer.vocab_size != vocab_size:
    raise DataError(f"config.data.cache_dir: {path} is a damaged cached SentencePiece "
                    f"model ({tokenizer.vocab_size} ids; its name says {vocab_size}); "
                    f"{advice}")
  return tokenizer


class ByteTokenizer:
  """UTF-8 bytes, ids laid out exactly like ``seqio.ByteVocabulary`` (ByT5).

  Ids: pad = 0, eos = 1, unk = 2 (never produced), byte b -> b + 3; 259 ids. Text is
  encoded with ``errors="surrogatepass"``, so every Python str (lone surrogates
  included) round-trips: ``decode(encode(text)) == text``. Source:
  https://github.com/google/seqio/blob/main/seqio/vocabularies.py (``ByteVocabulary``).
  """

  name = "bytes"
  OFFSET = 3  # pad, eos, unk

  @property
  def vocab_size(self) -> int:
    return self.OFFSET + 256

  @property
  def eos_id(self) -> int:
    return 1

  @property
  def pad_id(self) -> int:
    return 0

  @property
  def unk_id(self) -> int:
    return 2

  @property
  def fingerprint(self) -> str:
    """sha256 hex of "bytes-v1" (the id layout above)."""
    return hashlib.sha256(b"bytes-v1").hexdigest()

  def encode(self, text: str) -> list[int]:
    """Ids of the UTF-8 bytes of `text` (each byte + 3), without eos."""
    return [b + self.OFFSET for b in text.encode("utf-8", "surrogatepass")]

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    return [self.encode(t) for t in texts]

  def decode(self, ids) -> str:
    """Text of `ids` (list or int array): pad / eos / unk and ids >= 259 are dropped;
    invalid UTF-8 sequences become U+FFFD (seqio.ByteVocabulary drops them instead)."""
    data = bytes(i - self.OFFSET for i in map(int, ids)
                 if self.OFFSET <= i < self.vocab_size)
    try:
      return data.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
      return data.decode("utf-8", "replace")

  def __eq__(self, other) -> bool:
    return isinstance(other, ByteTokenizer)

  def __hash__(self) -> int:
    return hash(self.name)

  def __repr__(self) -> str:
    return "ByteTokenizer(vocab_size=259)"


Tokenizer = SentencePieceTokenizer | TiktokenTokenizer | ByteTokenizer


def check_vocab_agreement(vocab_size: int, tokenizer_name: str, tokenizer_vocab_size: int,
                          *, source: str = "", hint: str = "") -> None:
  """The one check that a model and a tokenizer have the same number of ids.

  Args:
    vocab_size: ``config.model.vocab_size``.
    tokenizer_name: the tokenizer's ``name`` (one of config.TOKENIZERS).
    tokenizer_vocab_size: its ``vocab_size`` (or the one recorded for it).
    source: where that tokenizer comes from (e.g. a prepared-data folder), or "".
    hint: appended to the message (what to do), or "".

  Raises:
    DataError: they differ: ``config.model.vocab_size = {vocab_size} but the {name}
      tokenizer[ of {source}] has {n} ids: model and data must agree{hint}``.
  """
  if int(vocab_size) != int(tokenizer_vocab_size):
    of = f" of {source}" if source else ""
    raise DataError(f"config.model.vocab_size = {vocab_size} but the {tokenizer_name} "
                    f"tokenizer{of} has {tokenizer_vocab_size} ids: model and data must "
                    f"agree{hint}")


def make_tokenizer(data_config, vocab_size: int, train_texts: Sequence[str] | None = None,
                   cache_dir=None) -> Tokenizer:
  """Builds the tokenizer ``config.data.tokenizer`` names.

  Args:
    data_config: ``config.data`` (reads ``tokenizer``, ``tiktoken_file``,
      ``sentencepiece_file``, ``cache_dir``).
    vocab_size: ``config.model.vocab_size``; the tokenizer must have exactly this many.
    train_texts: training documents for a new SentencePiece model (``sentencepiece``
      without ``sentencepiece_file``).
    cache_dir: folder for trained SentencePiece models; default
      ``{data.cache_dir}/tokenizers``.

  Returns:
    "bytes" -> ByteTokenizer; "o200k_base" -> TiktokenTokenizer(data.tiktoken_file);
    "sentencepiece" -> SentencePieceTokenizer(data.sentencepiece_file) if set, else
    `train_sentencepiece` (train_texts, vocab_size, cache_dir).

  Raises:
    DataError: an unknown tokenizer name; no training texts when one must be trained;
      the tokenizer's errors; or ``tokenizer.vocab_size != vocab_size``
      (`check_vocab_agreement`).
  """
  name = data_config.tokenizer
  if name == "bytes":
    tokenizer = ByteTokenizer()
  elif name == "o200k_base":
    tokenizer = TiktokenTokenizer(data_config.get("tiktoken_file", "") or "")
  elif name == "sentencepiece":
    model_file = data_config.get("sentencepiece_file", "") or ""
    if model_file:
      try:
        tokenizer = SentencePieceTokenizer(os.path.expanduser(model_file))
      except DataError as e:
        raise DataError(f"config.data.sentencepiece_file: {e}") from e
    else:
      if train_texts is None:
        raise DataError("config.data.tokenizer = 'sentencepiece' with no "
                        "config.data.sentencepiece_file: training texts are needed to "
                        "train one (train_texts)")
      if cache_dir is None:
        cache_dir = epath.Path(os.path.expanduser(data_config.cache_dir)) / "tokenizers"
      try:
        tokenizer = train_sentencepiece(train_texts, vocab_size, cache_dir)
      except DataError as e:  # a field named already (a damaged cache file) stays
        raise DataError(e if str(e).startswith("config.") else
                        f"config.model.vocab_size: {e}") from e
  else:
    raise DataError(f"config.data.tokenizer = {name!r}: expected one of "
                    f"{sorted(config_lib.TOKENIZERS)}")
  check_vocab_agreement(vocab_size, tokenizer.name, tokenizer.vocab_size)
  return tokenizer
