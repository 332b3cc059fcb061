"""The README's commands (benchmarks/readme_commands.py): parsed in order, and no
lev-train command lands on a workdir an earlier one filled with another config (it
would resume or refuse that run instead of doing what the README says)."""

import importlib.util
import re
import shlex
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _module(path, name):
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


readme_commands = _module(REPO / "benchmarks" / "readme_commands.py", "readme_commands")


def _flags(command):
  return dict(re.match(r"--([\w.]+)=?(.*)", a).groups() for a in shlex.split(command)[1:]
              if a.startswith("--"))


def test_commands_are_parsed_in_order_with_continuations_joined():
  text = ("x\n```bash\n# comment\nlev-train --a=1 \\\n  --b=2   # why\n```\n"
          "```console\n$ lev-eval --c=3 \\\n    --d=4\nprinted output\n```\n"
          "```python\nnot_a_command()\n```\n")
  assert readme_commands.readme_commands(text) == ["lev-train --a=1 --b=2",
                                                   "lev-eval --c=3 --d=4"]


def test_no_two_lev_train_commands_share_a_workdir_with_different_configs():
  seen = {}
  for command in readme_commands.readme_commands((REPO / "README.md").read_text()):
    command = command.split("&& ")[-1].replace(".venv/bin/", "")
    if not command.startswith("lev-train") or readme_commands.skip_reason(command):
      continue
    flags = _flags(command)
    config = flags.get("config", "experiments/smoke.py:leviathan")
    path, variant = config.split(":")
    name = _module(REPO / path, Path(path).stem).get_config(variant).name
    workdir = flags.get("workdir", f"runs/{name}")
    setup = {k: v for k, v in flags.items() if k != "workdir"} or {"config": config}
    setup.setdefault("config", config)
    assert seen.setdefault(workdir, setup) == setup, (
        f"{command!r} writes {workdir}, which an earlier README command filled with "
        f"{seen[workdir]}")
  assert "runs/smoke_leviathan" in seen and "runs/khronos" in seen
