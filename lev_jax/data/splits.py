"""Per-document hash splits: train / validation (/ test), by a hash of the text alone.

A document's place never depends on the order or the number of documents read, or on
which file holds it: the first 8 bytes of sha256(text), as a fraction h of 2**64 in
[0, 1), decide. h < validation_fraction is validation (`is_validation`); then
h < validation_fraction + test_fraction is test (`split_of`); the rest is train. The
hold-out of the in-memory sources (`split_documents`) and the splits of the embedded
corpus (`lev_jax.data.embedded.write_embedded_corpus`, which every source reading it
uses) place documents this way.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from lev_jax.data.errors import DataError


def _hash_fraction(text: str) -> float:
  """The first 8 bytes of sha256(text) as a fraction of 2**64, in [0, 1)."""
  digest = hashlib.sha256(text.encode("utf-8")).digest()
  return int.from_bytes(digest[:8], "big") / 2.0**64


def is_validation(text: str, validation_fraction: float) -> bool:
  """Deterministic hold-out: the first 8 bytes of sha256(text) as a fraction of 2**64."""
  digest = hashlib.sha256(text.encode("utf-8")).digest()
  return int.from_bytes(digest[:8], "big") < validation_fraction * 2.0**64


def split_of(text: str, validation_fraction: float, test_fraction: float = 0.0) -> str:
  """"validation", "test" or "train" for one document, by a hash of its text only.

  The hash fraction h (`_hash_fraction`) places it: h < validation_fraction ->
  validation (exactly `is_validation`, whatever test_fraction is); then
  h < validation_fraction + test_fraction -> test; else train. So a test split takes
  its documents from the training split only, and test_fraction = 0 gives the two-way
  split unchanged.
  """
  if is_validation(text, validation_fraction):
    return "validation"
  if test_fraction > 0 and _hash_fraction(text) < validation_fraction + test_fraction:
    return "test"
  return "train"


def split_documents(texts: Sequence[str], validation_fraction: float
                    ) -> tuple[list[str], list[str]]:
  """(train, validation) texts, each document placed by `is_validation` (order kept)."""
  train, validation = [], []
  for text in texts:
    (validation if is_validation(text, validation_fraction) else train).append(text)
  return train, validation


def check_fractions(validation_fraction: float, test_fraction: float) -> None:
  """Raises DataError (naming the field) unless 0 < validation_fraction < 1 and
  0 <= test_fraction < 1 - validation_fraction."""
  if not 0 < validation_fraction < 1:
    raise DataError(f"validation_fraction = {validation_fraction!r}: expected a number "
                    "in (0, 1)")
  if not 0 <= test_fraction < 1 - validation_fraction:
    raise DataError(f"test_fraction = {test_fraction!r}: expected a number in [0, "
                    f"1 - validation_fraction = {1 - validation_fraction:g})")
