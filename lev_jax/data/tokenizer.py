"""SentencePiece tokenizer: training on documents in memory, a content-keyed cache, ids.

Ids: pad = 0, unk = 1, eos = 2, no bos; id 3 is the newline. Byte fallback makes every
string encodable, and the identity normalisation (no NFKC, whitespace kept, no dummy
prefix) makes ``decode(encode(text)) == text`` for any text. Library: SentencePiece,
https://github.com/google/sentencepiece/blob/master/doc/options.md (trainer options)
and python/README.md (``sentence_iterator`` / ``model_writer`` training in memory).
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import time
from collections.abc import Iterator, Sequence

from absl import logging
from etils import epath
import sentencepiece as spm

from lev_jax.data.corpus import DataError

PAD_ID, UNK_ID, EOS_ID = 0, 1, 2
# Documents beyond this many characters are subsampled (every k-th) for training only.
MAX_TRAINING_CHARS = 50_000_000
# Longer lines (bytes) are split before training: SentencePiece drops longer sentences.
_MAX_LINE_BYTES = 1 << 14

# Every option that changes the model; part of the cache key.
TRAINER_SETTINGS = dict(
    model_type="bpe",                 # deterministic for any thread count (unigram is not)
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

  Raises:
    DataError: the file is missing or not a SentencePiece model, or its special ids are
      not pad 0 / unk 1 / eos 2 / no bos.
  """

  def __init__(self, model_path):
    self.model_path = epath.Path(model_path)
    try:
      proto = self.model_path.read_bytes()
      self._sp = spm.SentencePieceProcessor(model_proto=proto)
    except (OSError, RuntimeError) as e:
      raise DataError(f"{self.model_path}: cannot load a SentencePiece model ({e}); "
                      "expected a *.model file written by train_sentencepiece") from e
    ids = (self._sp.pad_id(), self._sp.unk_id(), self._sp.eos_id(), self._sp.bos_id())
    if ids != (PAD_ID, UNK_ID, EOS_ID, -1):
      raise DataError(f"{self.model_path}: special ids (pad, unk, eos, bos) = {ids}; "
                      f"expected {(PAD_ID, UNK_ID, EOS_ID, -1)}")

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
    """Ids of `text`, without eos; ``decode(encode(text)) == text``."""
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
      for the embedded corpus), naming the vocab size and the corpus size.
  """
  cache = epath.Path(os.path.expanduser(os.fspath(cache_dir)))
  key = cache_key(docs, vocab_size)
  path = cache / f"spm-v{vocab_size}-{key[:16]}.model"
  if path.exists():
    return SentencePieceTokenizer(path)
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
        vocab_size=vocab_size, num_threads=min(16, os.cpu_count() or 1), minloglevel=2,
        **TRAINER_SETTINGS)
  except RuntimeError as e:
    reason = str(e).strip().rstrip(".")
    if "smaller than required_chars" in reason:
      raise DataError(
          f"vocab_size = {vocab_size} is too small for the corpus ({len(docs)} documents, "
          f"{chars} characters): it must hold 260 fixed pieces (pad, unk, eos, newline, "
          f"256 bytes) plus the characters that cover 99.95% of the text: {reason}") from e
    if "too high" in reason:
      raise DataError(
          f"vocab_size = {vocab_size} is too large for the corpus ({len(docs)} documents, "
          f"{chars} characters): {reason}. Use a smaller vocab_size or more text.") from e
    raise DataError(f"SentencePiece training failed on {len(docs)} documents "
                    f"({chars} characters), vocab_size = {vocab_size}: {reason}") from e
  cache.mkdir(parents=True, exist_ok=True)
  tmp = cache / f".{path.name}.tmp-{os.getpid()}"
  tmp.write_bytes(writer.getvalue())
  tmp.replace(path)
  logging.info("Trained SentencePiece (bpe, vocab %d) on %d documents, %d characters in "
               "%.1f s -> %s", vocab_size, len(docs), chars, time.perf_counter() - start,
               path)
  return SentencePieceTokenizer(path)


def _o200k_spec(mergeable_ranks: dict[bytes, int]) -> dict:
  """tiktoken's own o200k_base spec (pattern, special ids) with the given ranks.

  tiktoken_ext.openai_public.o200k_base() fetches its ranks by URL; we hand it the ranks
  read from a local file instead, so the pattern and special tokens stay tiktoken's.
  """
  from tiktoken_ext import openai_public
  fetch = openai_public.load_tiktoken_bpe
  openai_public.load_tiktoken_bpe = lambda *args, **kwargs: mergeable_ranks
  try:
    return openai_public.o200k_base()
  finally:
    openai_public.load_tiktoken_bpe = fetch


class TiktokenTokenizer:
  """o200k_base through tiktoken (the Leviathan paper's tokenizer; LEV.md "setup").

  Ids: 200,019 (200,000 merges + specials; <|endoftext|> = 199999 is eos); there is no
  pad id (padding is marked by the packer's segment ids). Library: tiktoken,
  https://github.com/openai/tiktoken (``Encoding``, ``load.load_tiktoken_bpe``).

  Args:
    ranks_file: a local or gs:// ``o200k_base.tiktoken`` file; "" uses
      ``tiktoken.get_encoding("o200k_base")``, which reads tiktoken's cache
      (TIKTOKEN_CACHE_DIR) and downloads only when the cache lacks it.

  Raises:
    DataError: the ranks file is missing or unreadable.
  """

  name = "o200k_base"

  def __init__(self, ranks_file: str = ""):
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe
    self.ranks_file = ranks_file
    if ranks_file:
      path = epath.Path(os.path.expanduser(ranks_file))
      if not path.exists():
        raise DataError(f"config.data.tiktoken_file = {ranks_file!r}: no such file; "
                        "expected an o200k_base.tiktoken ranks file")
      try:
        spec = _o200k_spec(load_tiktoken_bpe(os.fspath(path)))
      except (ValueError, OSError) as e:
        raise DataError(f"{ranks_file}: not a tiktoken ranks file ({e})") from e
      self._enc = tiktoken.Encoding(**spec)
    else:
      try:
        self._enc = tiktoken.get_encoding(self.name)
      except Exception as e:  # no cache and no network: requests / OSError / ValueError
        raise DataError(
            f"config.data.tokenizer = 'o200k_base': tiktoken has no cached copy and could "
            f"not fetch one ({type(e).__name__}); set config.data.tiktoken_file to a local "
            "o200k_base.tiktoken file (or TIKTOKEN_CACHE_DIR to a folder holding it)") from e

  @property
  def vocab_size(self) -> int:
    return self._enc.n_vocab

  @property
  def eos_id(self) -> int:
    return self._enc.eot_token

  @property
  def pad_id(self) -> None:
    return None

  def encode(self, text: str) -> list[int]:
    """Ids of `text` (special-token text is encoded as plain text), without eos."""
    return self._enc.encode_ordinary(text)

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    return self._enc.encode_ordinary_batch(list(texts))

  def decode(self, ids) -> str:
    return self._enc.decode([int(i) for i in ids])

  def __repr__(self) -> str:
    return f"TiktokenTokenizer({self.name}, vocab_size={self.vocab_size})"
