"""A tokenizer recorded in a folder, and rebuilt from it.

The folder holds ``tokenizer.json`` (`TOKENIZER_JSON`: `tokenizer_info`, i.e. name,
vocab_size, padded_vocab_size, eos_id, pad_id and the fingerprint of what defines the
ids) plus the one file that rebuilds the tokenizer without anything else
(`MODEL_FILES`): ``spm.model`` (the SentencePiece model proto) or
``o200k_base.tiktoken`` (the tiktoken ranks); a ByteTokenizer needs no file.
`load_tokenizer` rebuilds the tokenizer and checks its fingerprint, vocab_size, eos_id
and pad_id against the record, so a model and its data can never disagree.

Writers (`save_tokenizer`): the trainer (``WORKDIR/tokenizer/``), `lev_jax.inference`
exports (``DIR/tokenizer/``), `lev_jax.data.prepare` and `lev_jax.data.tfds_builder`
(a prepared dataset's ``tokenizer/``) and `lev_jax.hf_export` (``lev_tokenizer/``).
Readers (`load_tokenizer`): `lev_jax.inference` (a workdir or export),
`lev_jax.data.prepared` (a prepared dataset) and `lev_jax.data.prepare` (resuming a
preparation). The tokenizers themselves live in `lev_jax.data.tokenizer`.
"""

from __future__ import annotations

import json
import os

from etils import epath

from lev_jax import config as config_lib
from lev_jax.data.errors import DataError
from lev_jax.data.files import write_bytes_atomic
from lev_jax.data.tokenizer import (ByteTokenizer, SentencePieceTokenizer, TiktokenTokenizer,
                                    Tokenizer)

TOKENIZER_JSON = "tokenizer.json"
# The file beside tokenizer.json that rebuilds each tokenizer (None: nothing needed).
MODEL_FILES = {"sentencepiece": "spm.model", "o200k_base": "o200k_base.tiktoken",
               "bytes": None}
_INFO_KEYS = ("name", "vocab_size", "padded_vocab_size", "eos_id", "pad_id", "fingerprint")


def tokenizer_info(tokenizer: Tokenizer, vocab_multiple: int = 128) -> dict:
  """What identifies a tokenizer's ids, JSON-serialisable; recorded with prepared data.

  Args:
    tokenizer: a SentencePieceTokenizer, TiktokenTokenizer or ByteTokenizer.
    vocab_multiple: the model's padding multiple (config.model.vocab_multiple).

  Returns:
    ``{"name": str, "vocab_size": int, "padded_vocab_size": int (vocab_size rounded up
    to vocab_multiple, `config.padded_vocab_size`), "eos_id": int, "pad_id": int or
    None, "fingerprint": sha256 hex str}``; the fingerprint hashes what defines the ids
    (the SentencePiece model proto; the tiktoken ranks, pattern and special tokens;
    "bytes-v1").
  """
  return {"name": tokenizer.name, "vocab_size": int(tokenizer.vocab_size),
          "padded_vocab_size": config_lib.padded_vocab_size(tokenizer.vocab_size,
                                                            vocab_multiple),
          "eos_id": int(tokenizer.eos_id), "pad_id": tokenizer.pad_id,
          "fingerprint": tokenizer.fingerprint}


def save_tokenizer(tokenizer: Tokenizer, folder, vocab_multiple: int = 128) -> dict:
  """Writes what rebuilds `tokenizer` into `folder` (local or `etils.epath` URL).

  Files: ``tokenizer.json`` (`tokenizer_info`), plus ``spm.model`` (SentencePiece model
  proto) or ``o200k_base.tiktoken`` (the ranks, `TiktokenTokenizer.ranks_bytes`), so the
  folder is self-contained; nothing else for bytes. Each file is written to a temporary
  name, then renamed into place; ``tokenizer.json`` last.

  Returns:
    The info written to ``tokenizer.json``.
  """
  folder = epath.Path(os.path.expanduser(os.fspath(folder)))
  folder.mkdir(parents=True, exist_ok=True)
  info = tokenizer_info(tokenizer, vocab_multiple)
  files = {TOKENIZER_JSON: (json.dumps(info, indent=2, sort_keys=True) + "\n").encode()}
  if isinstance(tokenizer, SentencePieceTokenizer):
    files = {MODEL_FILES["sentencepiece"]: tokenizer.model_proto, **files}
  elif isinstance(tokenizer, TiktokenTokenizer):
    files = {MODEL_FILES["o200k_base"]: tokenizer.ranks_bytes(), **files}
  for name, data in files.items():  # dicts keep order: tokenizer.json last
    write_bytes_atomic(folder / name, data)
  return info


def load_tokenizer(folder) -> Tokenizer:
  """Rebuilds the tokenizer `save_tokenizer` wrote into `folder`.

  Raises:
    DataError: ``tokenizer.json`` is missing, not JSON or lacks a field; an unknown
      name; a missing model/ranks file; or the rebuilt tokenizer's fingerprint (or
      vocab_size / eos_id) differs from the recorded one. The message names the folder.
  """
  folder = epath.Path(os.path.expanduser(os.fspath(folder)))
  path = folder / TOKENIZER_JSON
  try:
    info = json.loads(path.read_text())
  except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
    raise DataError(f"{path}: cannot read the tokenizer record ({e}); expected the "
                    "tokenizer.json written by save_tokenizer") from e
  missing = [k for k in _INFO_KEYS if not isinstance(info, dict) or k not in info]
  if missing:
    raise DataError(f"{path}: missing field(s) {missing}; expected {list(_INFO_KEYS)}")
  name = info["name"]
  if name not in MODEL_FILES:
    raise DataError(f"{path}: name = {name!r}; expected one of {sorted(MODEL_FILES)}")
  if name == "bytes":
    tokenizer = ByteTokenizer()
  elif name == "sentencepiece":
    tokenizer = SentencePieceTokenizer(folder / MODEL_FILES[name])
  else:
    ranks = folder / MODEL_FILES[name]
    if not ranks.exists():
      raise DataError(f"{folder}: no {MODEL_FILES[name]}; expected the ranks file written "
                      "by save_tokenizer beside tokenizer.json")
    tokenizer = TiktokenTokenizer(os.fspath(ranks))
  for key in ("fingerprint", "vocab_size", "eos_id", "pad_id"):
    if getattr(tokenizer, key) != info[key]:
      raise DataError(
          f"{folder}: the rebuilt {name} tokenizer has {key} = {getattr(tokenizer, key)!r} "
          f"but tokenizer.json records {info[key]!r}: the tokenizer files do not match "
          "the data they were saved with")
  return tokenizer
