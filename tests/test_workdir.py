"""The run folder's names live in lev_jax.workdir; Orbax is used by lev_jax.checkpoint only."""

import json
import os
import re

import pytest

from lev_jax import workdir
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _sources():
  for top in ("lev_jax", "launch"):
    for folder, _, files in os.walk(os.path.join(REPO, top)):
      for name in files:
        if name.endswith(".py"):
          path = os.path.join(folder, name)
          yield os.path.relpath(path, REPO), open(path, encoding="utf-8").read()


def test_only_checkpoint_uses_orbax():
  users = [path for path, text in _sources()
           if re.search(r"^\s*(import orbax|from orbax)|\bocp\.", text, re.M)]
  assert users == [os.path.join("lev_jax", "checkpoint.py")]


def test_no_run_folder_name_is_spelled_outside_workdir():
  """Code names a run folder's files through workdir's constants (prose may spell them);
  the prepared-data folder's own layout lives in data/prepared.py."""
  # (workdir.TOKENIZER, "tokenizer", is also a config field and a JSON key: not checked.)
  names = [workdir.CHECKPOINTS, workdir.TOKEN_COUNTS, workdir.EVAL_JSON, workdir.METRICS,
           workdir.LEV_EVAL_JSON, workdir.DATA_REPORT, workdir.TENSORBOARD]
  literal = re.compile(r"([\"'])(?:" + "|".join(map(re.escape, names)) + r")\1")
  allowed = {os.path.join("lev_jax", "workdir.py"), os.path.join("lev_jax", "data", "prepared.py")}
  spelled = [f"{path}:{i}" for path, text in _sources() if path not in allowed
             for i, line in enumerate(text.splitlines(), 1) if literal.search(line)]
  assert not spelled


def test_no_library_module_imports_a_command():
  importers = [path for path, text in _sources()
               if path.startswith("lev_jax") and not path.startswith(os.path.join("lev_jax", "cli"))
               and re.search(r"^\s*(from lev_jax\.cli\b|from lev_jax import .*\bcli\b|"
                             r"import lev_jax\.cli\b)", text, re.M)]
  assert not importers


def test_write_json_atomic_writes_indented_json_and_no_temporary(tmp_path):
  path = tmp_path / workdir.EVAL_JSON
  workdir.write_json_atomic(path, {"step": 2, "when": {1, 2}}, default=sorted)
  assert path.read_text() == json.dumps({"step": 2, "when": [1, 2]}, indent=1)
  assert os.listdir(tmp_path) == [workdir.EVAL_JSON]


def test_default_workdir_and_run_outputs():
  assert workdir.default_workdir("smoke_tied") == "runs/smoke_tied"
  assert {n for n, is_dir in workdir.RUN_OUTPUTS.items() if is_dir} == {
      "checkpoints", "tokenizer", "tensorboard", "profile"}


def test_json_files_are_strict_and_non_finite_numbers_round_trip_as_text(tmp_path):
  import numpy as np
  value = {"loss": float("nan"), "ppl": np.float32("inf"), "low": -float("inf"),
           "buckets": [{"perplexity": None}, {"perplexity": 2.5}], "name": "nan-free"}
  path = tmp_path / workdir.EVAL_JSON
  workdir.write_json_atomic(path, value)
  text = path.read_text()
  assert "NaN" not in text and "Infinity" not in text
  json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
  back = workdir.loads_json(text)
  assert np.isnan(back["loss"]) and back["ppl"] == float("inf") and back["low"] == -float("inf")
  assert back["buckets"] == [{"perplexity": None}, {"perplexity": 2.5}]
  assert back["name"] == "nan-free"
