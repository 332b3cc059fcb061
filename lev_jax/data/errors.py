"""The data package's error, and the argument check every reader shares.

`DataError` (a `ValueError`) is what every data module raises for a bad input: a
missing or malformed file, an empty split, a bad argument or config field. Its message
is one line that names the file (and line) or the ``config.data.<field>``, and says
what was expected, so that a command-line tool can print it as is.

`check_index` validates the integer arguments of the readers and streams (line and
file positions, shard numbers, seeds, epoch counts) and raises `DataError` naming the
argument.
"""

from __future__ import annotations

import numpy as np


class DataError(ValueError):
  """A bad data input; the message names the file (and line) and what was expected."""


def check_index(name: str, value, low: int, high: int | None = None) -> int:
  """`value` as an int in [low, high) (high None: no upper bound).

  Args:
    name: how the message names the argument (e.g. ``"shard_index"``,
      ``"state['epoch']"``).
    value: a Python or NumPy integer (not a bool).
    low, high: the bounds, low included, high excluded.

  Returns:
    ``int(value)``.

  Raises:
    DataError: ``"{name} = {value!r}: expected an int [low, high)"`` (or ``>= low``)
      for a non-integer, a bool, or a value out of range.
  """
  ok = (isinstance(value, (int, np.integer)) and not isinstance(value, bool)
        and value >= low and (high is None or value < high))
  if not ok:
    bound = f"[{low}, {high})" if high is not None else f">= {low}"
    raise DataError(f"{name} = {value!r}: expected an int {bound}")
  return int(value)
