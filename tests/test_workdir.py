"""The run folder's names live in lev_jax.workdir; Orbax is used by lev_jax.checkpoint only."""

import json
import os
import re

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


def test_write_json_atomic_writes_indented_json_and_no_temporary(tmp_path):
  path = tmp_path / workdir.EVAL_JSON
  workdir.write_json_atomic(path, {"step": 2, "when": {1, 2}}, default=sorted)
  assert path.read_text() == json.dumps({"step": 2, "when": [1, 2]}, indent=1)
  assert os.listdir(tmp_path) == [workdir.EVAL_JSON]


def test_default_workdir_and_run_outputs():
  assert workdir.default_workdir("smoke_tied") == "runs/smoke_tied"
  assert {n for n, is_dir in workdir.RUN_OUTPUTS.items() if is_dir} == {
      "checkpoints", "tokenizer", "tensorboard"}
