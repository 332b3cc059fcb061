"""lev_jax/experiments.py: the repo's experiment files, imported by path."""

import pytest

from lev_jax.experiments import (ExperimentImportError, NotAnExperimentFile, experiments_dir,
                                 file_problem, load_experiment)


def test_every_shipped_experiment_file_loads_and_builds_its_default_config():
  files = sorted(experiments_dir().glob("*.py"))
  assert {f.name for f in files} >= {"smoke.py", "ladder.py", "smoke_ladder.py",
                                     "smoke_study.py", "fidelity_study.py",
                                     "scale_study.py"}
  for f in files:
    module = load_experiment(f)
    assert module.get_config().model.vocab_size > 0, f.name


def test_each_load_is_a_fresh_module():
  a = load_experiment(experiments_dir() / "smoke.py")
  b = load_experiment(experiments_dir() / "smoke.py")
  assert a is not b and a.get_config("tied").to_dict() == b.get_config("tied").to_dict()


def test_a_missing_file_is_named():
  with pytest.raises(FileNotFoundError, match=r"nope\.py: no such experiment file"):
    load_experiment(experiments_dir() / "nope.py")


def test_a_file_that_fails_to_import_names_itself_and_chains_its_error(tmp_path):
  bad = tmp_path / "bad.py"
  bad.write_text("x = 1\nraise RuntimeError('boom')\n")
  with pytest.raises(ExperimentImportError, match=r"bad\.py: failed to import: RuntimeError: "
                     r"boom") as info:
    load_experiment(bad)
  assert isinstance(info.value.__cause__, RuntimeError)


def test_what_is_not_a_python_file_is_named(tmp_path):
  """Newcomer pass 4: FILE.txt was an AttributeError traceback in lev-ladder and
  lev-study (importlib has no loader for the suffix); a folder and /dev/zero were "no
  such file" (lev-train read /dev/zero until memory ran out)."""
  txt = tmp_path / "smoke_copy.txt"
  txt.write_text((experiments_dir() / "smoke.py").read_text())
  (tmp_path / "link.py").symlink_to(tmp_path / "gone.py")
  assert file_problem(experiments_dir() / "smoke.py") is None
  assert file_problem(tmp_path / "nope.py") == "no such file"
  assert file_problem(tmp_path / "link.py") == (
      f"is a dangling symbolic link to {tmp_path / 'gone.py'}")
  assert file_problem(tmp_path) == "is a folder"
  assert file_problem("/dev/null") == "is a character device, not a regular file"
  assert file_problem(txt) == "not a Python file (no .py suffix)"
  for path, problem in ((txt, "not a Python file"), (tmp_path, "is a folder")):
    with pytest.raises(NotAnExperimentFile, match=problem) as info:
      load_experiment(path)
    assert str(info.value).startswith(f"{path}: ")
