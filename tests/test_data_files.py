"""lev_jax.data.files: atomic writes that leave nothing behind when they fail."""

import numpy as np
import pytest

from lev_jax.data.errors import DataError
from lev_jax.data.files import read_npy, write_bytes_atomic


def test_a_failed_atomic_write_removes_its_temporary_and_keeps_the_target(tmp_path):
  (tmp_path / "report.json").mkdir()  # the rename onto a folder fails
  with pytest.raises(OSError):
    write_bytes_atomic(tmp_path / "report.json", b"{}")
  assert [p.name for p in tmp_path.iterdir()] == ["report.json"]
  assert (tmp_path / "report.json").is_dir()
  write_bytes_atomic(tmp_path / "ok.json", b"{}")
  assert (tmp_path / "ok.json").read_bytes() == b"{}"
  assert sorted(p.name for p in tmp_path.iterdir()) == ["ok.json", "report.json"]


def test_a_damaged_npy_file_is_named(tmp_path):
  """Issue 26: a token_counts.npy replaced by another file failed lev-eval and lev-sample
  with numpy's "This file contains pickled (object) data..." naming no file."""
  path = tmp_path / "token_counts.npy"
  np.save(path, np.array([{"a": 1}], dtype=object), allow_pickle=True)
  with pytest.raises(DataError, match=f"^{path}: damaged: not a .npy array file \\(it "
                     "holds an array of Python objects \\(pickled\\), which is never "
                     "loaded\\)$"):
    read_npy(path)
  # newcomer pass 8: random bytes and text were both "it holds pickled Python objects"
  path.write_text("hello\n")
  with pytest.raises(DataError, match=f"^{path}: damaged: not a .npy array file \\(no .npy "
                     "header: 6 bytes starting b'hello\\\\n'\\)$"):
    read_npy(path)
  path.write_bytes(b"\x80\x04\x95" + bytes(range(40)))  # a pickle: not loaded either
  with pytest.raises(DataError, match=f"^{path}: damaged: not a .npy array file \\(no .npy "
                     "header: 43 bytes starting"):
    read_npy(path)
  np.save(path, np.arange(3))
  path.write_bytes(path.read_bytes()[:-8])  # truncated: numpy's own words
  with pytest.raises(DataError, match=f"^{path}: damaged: not a .npy array file \\("):
    read_npy(path)
  np.save(path, np.arange(3))
  assert read_npy(path).tolist() == [0, 1, 2]
