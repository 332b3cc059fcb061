"""o200k_base through tiktoken: the Leviathan paper's tokenizer (LEV.md "setup"), read
from a local ranks file (nothing is downloaded).

  tok = TiktokenTokenizer("o200k_base.tiktoken")   # config.data.tiktoken_file
  ids = tok.encode("text")                          # list[int], ids < 200,019

It has the interface of every lev_jax tokenizer (`lev_jax.data.tokenizer`): ``name``
("o200k_base"), ``vocab_size``, ``eos_id``, ``pad_id``, ``fingerprint``, ``encode`` /
``encode_batch`` / ``decode``, and pickles. Library: tiktoken (openai/tiktoken,
tiktoken_ext/openai_public.py for the pattern and special tokens).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import os
from collections.abc import Sequence

from etils import epath

from lev_jax.data.errors import DataError

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

  Pickles its mergeable ranks (rebuilt with tiktoken's o200k_base pattern and special
  tokens, no file needed) or, with ``ranks_file == ""``, only the name (rebuilt with
  ``tiktoken.get_encoding``, i.e. from tiktoken's cache).

  Args:
    ranks_file: a local or gs:// ``o200k_base.tiktoken`` file; "" uses
      ``tiktoken.get_encoding("o200k_base")``, which reads tiktoken's cache
      (TIKTOKEN_CACHE_DIR) and downloads only when the cache lacks it.

  Raises:
    DataError: the ranks file is missing or unreadable.
  """

  name = "o200k_base"

  def __init__(self, ranks_file: str = ""):
    self.ranks_file = os.fspath(ranks_file)
    self._enc = self._build(self.ranks_file, None)

  @classmethod
  def _build(cls, ranks_file: str, mergeable_ranks: dict[bytes, int] | None):
    import tiktoken  # pylint: disable=g-import-not-at-top
    from tiktoken.load import load_tiktoken_bpe  # pylint: disable=g-import-not-at-top
    if mergeable_ranks is not None:
      return tiktoken.Encoding(**_o200k_spec(mergeable_ranks))
    if ranks_file:
      path = epath.Path(os.path.expanduser(ranks_file))
      if not path.exists():
        raise DataError(f"config.data.tiktoken_file = {ranks_file!r}: no such file; "
                        "expected an o200k_base.tiktoken ranks file")
      try:
        spec = _o200k_spec(load_tiktoken_bpe(os.fspath(path)))
      except (ValueError, OSError) as e:
        raise DataError(f"{ranks_file}: not a tiktoken ranks file ({e})") from e
      return tiktoken.Encoding(**spec)
    try:
      return tiktoken.get_encoding(cls.name)
    except Exception as e:  # no cache and no network: requests / OSError / ValueError
      raise DataError(
          f"config.data.tokenizer = 'o200k_base': tiktoken has no cached copy and could "
          f"not fetch one ({type(e).__name__}); set config.data.tiktoken_file to a local "
          "o200k_base.tiktoken file (or TIKTOKEN_CACHE_DIR to a folder holding it)") from e

  def __getstate__(self) -> dict:
    # Encoding._mergeable_ranks: tiktoken keeps no public accessor for the ranks.
    enc = self._enc
    ranks = enc._mergeable_ranks if self.ranks_file else None  # pylint: disable=protected-access
    return {"ranks_file": self.ranks_file, "mergeable_ranks": ranks}

  def __setstate__(self, state: dict) -> None:
    self.ranks_file = state["ranks_file"]
    self._enc = self._build(self.ranks_file, state["mergeable_ranks"])

  @property
  def vocab_size(self) -> int:
    return self._enc.n_vocab

  @property
  def eos_id(self) -> int:
    return self._enc.eot_token

  @property
  def pad_id(self) -> None:
    return None

  def ranks_bytes(self) -> bytes:
    """The mergeable ranks in tiktoken's ``.tiktoken`` format: ``base64(token) rank``
    lines sorted by rank (what ``tiktoken.load.dump_tiktoken_bpe`` writes)."""
    ranks = self._enc._mergeable_ranks  # pylint: disable=protected-access
    return b"".join(base64.b64encode(token) + b" " + str(rank).encode() + b"\n"
                    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]))

  @functools.cached_property
  def fingerprint(self) -> str:
    """sha256 hex of the ranks (`ranks_bytes`), the split pattern and special tokens."""
    enc = self._enc
    spec = {"pat_str": enc._pat_str, "special_tokens": enc._special_tokens}  # pylint: disable=protected-access
    h = hashlib.sha256(self.ranks_bytes())
    h.update(json.dumps(spec, sort_keys=True).encode())
    return h.hexdigest()

  def encode(self, text: str) -> list[int]:
    """Ids of `text` (special-token text is encoded as plain text), without eos."""
    return self._enc.encode_ordinary(text)

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    return self._enc.encode_ordinary_batch(list(texts))

  def decode(self, ids) -> str:
    return self._enc.decode([int(i) for i in ids])

  def __repr__(self) -> str:
    return f"TiktokenTokenizer({self.name}, vocab_size={self.vocab_size})"
