"""lev_jax.data.files: atomic writes that leave nothing behind when they fail."""

import pytest

from lev_jax.data.files import write_bytes_atomic


def test_a_failed_atomic_write_removes_its_temporary_and_keeps_the_target(tmp_path):
  (tmp_path / "report.json").mkdir()  # the rename onto a folder fails
  with pytest.raises(OSError):
    write_bytes_atomic(tmp_path / "report.json", b"{}")
  assert [p.name for p in tmp_path.iterdir()] == ["report.json"]
  assert (tmp_path / "report.json").is_dir()
  write_bytes_atomic(tmp_path / "ok.json", b"{}")
  assert (tmp_path / "ok.json").read_bytes() == b"{}"
  assert sorted(p.name for p in tmp_path.iterdir()) == ["ok.json", "report.json"]
