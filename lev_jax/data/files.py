"""Small file helpers the data modules share: atomic writes (bytes, text lines) and
``.npy`` bytes.

Paths are `etils.epath` paths (local or ``gs://``). An atomic write goes to a
temporary name beside the target (``.{name}.tmp-{pid}``), then is renamed into place
(`os.replace` for local files), so a reader never sees a partial file and a killed
writer leaves only a ``.tmp`` file behind (a failed write removes its own).
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable

from etils import epath
import numpy as np

from lev_jax.data.errors import DataError


def write_bytes_atomic(path, data: bytes) -> None:
  """Writes `data` to ``path`` (str or path-like) through a temporary name.

  Raises:
    OSError: the write or the rename failed (e.g. disk full, ``path`` is a folder);
      the temporary is removed and ``path`` is as it was.
  """
  path = epath.Path(path)
  tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
  try:
    tmp.write_bytes(data)
    tmp.replace(path)
  except BaseException:
    try:
      tmp.unlink(missing_ok=True)
    except OSError:
      pass  # the original error says more
    raise


def write_lines_atomic(path, lines: Iterable[str]) -> None:
  """Writes the lines (each ending in a newline) as UTF-8 to ``path`` (str or
  path-like), atomically (`write_bytes_atomic`; raises its OSError)."""
  write_bytes_atomic(path, "".join(lines).encode("utf-8"))


def npy_bytes(array: np.ndarray) -> bytes:
  """`array` in NumPy's ``.npy`` format (`np.save`), for `write_bytes_atomic`."""
  buf = io.BytesIO()
  np.save(buf, array)
  return buf.getvalue()


# The first bytes of every .npy file (https://numpy.org/doc/stable/reference/generated/
# numpy.lib.format.html).
NPY_MAGIC = b"\x93NUMPY"


def read_npy(path) -> np.ndarray:
  """The array in a ``.npy`` file (local or `etils.epath` URL).

  Raises:
    DataError: ``PATH: damaged ...``: not a ``.npy`` array file: no .npy header
      (another file in its place), a truncated one, or an array of Python objects
      (pickled; never loaded); or ``PATH: is a folder``.
    OSError: the file cannot be read.
  """
  if epath.Path(path).is_dir():  # newcomer pass 11: an IsADirectoryError traceback
    raise DataError(f"{path}: is a folder; expected a .npy array file (move it aside)")
  data = epath.Path(path).read_bytes()
  if not data.startswith(NPY_MAGIC):  # np.load would try it as a pickle and say so
    raise DataError(f"{path}: damaged: not a .npy array file (no .npy header: "
                    f"{len(data):,} bytes starting {data[:8]!r})")
  try:
    return np.load(io.BytesIO(data), allow_pickle=False)
  except (ValueError, EOFError, OSError) as e:  # numpy's words name no file
    reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if "pickle" in reason:  # numpy's advice (load it unsafely) is not for a user
      reason = "it holds an array of Python objects (pickled), which is never loaded"
    raise DataError(f"{path}: damaged: not a .npy array file ({reason})") from e
