"""lev_jax/cli/common.py: every console script's `--help`, checked against what it accepts.

Each command runs as a user runs it (its [project.scripts] entry point, sys.argv), in a
child forked from one driver process (`python tests/test_cli_common.py`) that imported every
command module once: the flag definitions of the commands would collide in one process.
"""

import importlib
import json
import os
import shlex
import subprocess
import sys
import tomllib
import traceback
from pathlib import Path

import pytest

# One pytest-xdist worker runs this file (--dist loadgroup): its module fixture `helps`
# (every command's --help and empty paths, one subprocess) is built once, not per worker.
pytestmark = pytest.mark.xdist_group("cli_help")

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
OVERRIDE = "--config.eval.batches=2"  # a field of every experiment's config
MAX_HELP_LINES = 60
# Every flag naming a file or folder, per command (common.define_path; --config, a file
# and variant, through common.config_or_exit). lev-lm-eval's flags are lm-eval's own.
PATH_FLAGS = {
    "lev-train": ["workdir", "config"], "lev-eval": ["checkpoint", "baseline", "output"],
    "lev-export": ["checkpoint", "output"], "lev-sample": ["checkpoint", "prompts_file"],
    "lev-ladder": ["ladder", "root", "report_dir"], "lev-study": ["study", "root", "report_dir"],
    "lev-prepare-data": ["output_dir", "config"], "lev-compile": ["json", "dump_hlo", "config"],
    "lev-params": ["config"]}


def listed_flags(help_text: str) -> list[str]:
  """The example of each row of the help's flag listing (`--name=VALUE`, as argv items)."""
  lines = help_text.splitlines()
  start = next((i for i, l in enumerate(lines) if l.startswith("Flags")), len(lines))
  return [_first_word(l) for l in lines[start + 1:] if l.startswith("  --")]


def _first_word(line: str) -> str:
  """The first shell word of `line` (the rest, the flag's help, need not be shell)."""
  lexer = shlex.shlex(line, posix=True)
  lexer.whitespace_split = True
  return lexer.get_token()


def _parse_only():
  """Stop each command right after its flags are parsed (absl's app.run, lm-eval's CLI;
  lev-lm-eval's checks of the tasks' data, the checkpoint folder and its steps are
  skipped)."""
  from absl import app
  from lm_eval._cli import harness
  from lev_jax.cli import lm_eval as lm_eval_cli
  def run(main, argv=None, flags_parser=None):
    flags_parser(sys.argv)
    sys.exit(0)

  app.run = run
  harness.HarnessCLI.execute = lambda self, args: None
  lm_eval_cli.data_problem = lambda tasks, include_path: None
  lm_eval_cli._checkpoint_problem = lambda path: None
  lm_eval_cli._step_problem = lambda path, step: None


def _attempt(entry, prog: str, argv: list[str], parse_only: bool,
             closed_stdout: bool = False) -> tuple[int, str]:
  """(exit status, stdout + stderr) of `entry()` with sys.argv = [prog, *argv], forked.
  closed_stdout: stdout is a pipe nobody reads (`| head` that has exited); only stderr
  is reported."""
  read, write = os.pipe()
  pid = os.fork()
  if pid == 0:  # the child: run the command, report through the pipe
    os.close(read)
    os.dup2(write, 1)
    os.dup2(write, 2)
    if closed_stdout:
      unread, into = os.pipe()
      os.close(unread)
      os.dup2(into, 1)
    code = 0
    try:
      if parse_only:
        _parse_only()
      sys.argv = [prog, *argv]
      entry()
    except SystemExit as e:
      code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # pylint: disable=broad-except
      traceback.print_exc()
      code = 99
    for stream in (sys.stdout, sys.stderr):
      try:
        stream.flush()
      except OSError:  # the closed pipe, for a command that did not handle it
        pass
    os._exit(code)
  os.close(write)
  with os.fdopen(read, errors="replace") as f:
    out = f.read()
  _, status = os.waitpid(pid, 0)
  return os.waitstatus_to_exitcode(status), out


def _drive() -> dict:
  """For each console script: its --help, a parse of every flag it lists, the same
  with a --config.<section>.<field> override, and each of its PATH_FLAGS given empty
  (after the listed flags, so only that one is wrong; --config= alone, run up to where
  the config is first read)."""
  entries = {}
  for prog, target in SCRIPTS.items():
    module, func = target.split(":")
    entries[prog] = getattr(importlib.import_module(module), func)
  results = {}
  for prog, entry in entries.items():
    code, text = _attempt(entry, prog, ["--help"], parse_only=False)
    listed = listed_flags(text) if code == 0 else []
    listed_parse = _attempt(entry, prog, listed, parse_only=True)
    # With the listed flags when they parse (a command may require some), else alone.
    context = listed if listed and listed_parse[0] == 0 else []
    results[prog] = {
        "help_code": code, "help": text, "listed": listed, "listed_parse": listed_parse,
        "help_into_closed_pipe": _attempt(entry, prog, ["--help"], parse_only=False,
                                          closed_stdout=True),
        "override_parse": _attempt(entry, prog, [*context, OVERRIDE], parse_only=True),
        "unknown_flag": _attempt(entry, prog, ["--bogusflag"], parse_only=True),
        "empty": {name: _attempt(entry, prog, ["--config="] if name == "config" else
                                 [*context, f"--{name}="], parse_only=name != "config")
                  for name in PATH_FLAGS.get(prog, [])}}
  return results


@pytest.fixture(scope="module")
def helps():
  proc = subprocess.run([sys.executable, __file__], capture_output=True, text=True,
                        cwd=REPO, timeout=300, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("prog", sorted(SCRIPTS))
def test_help_lists_only_flags_the_command_accepts(prog, helps):
  r = helps[prog]
  text = r["help"]
  assert r["help_code"] == 0, text[-3000:]
  accepts_config = r["override_parse"][0] == 0
  if not accepts_config:
    assert "Traceback" not in r["override_parse"][1], r["override_parse"][1][-2000:]
  assert ("--config.<section>.<field>" in text) == accepts_config, (
      f"{prog} {'accepts' if accepts_config else 'rejects'} {OVERRIDE}, but its --help "
      f"{'does not mention' if accepts_config else 'promises'} --config.<section>.<field>")
  assert len(text.strip().splitlines()) < MAX_HELP_LINES, text
  assert r["listed"], f"{prog} --help lists no flags as examples (--name=VALUE):\n{text}"
  code, out = r["listed_parse"]
  assert code == 0, f"{prog} rejects the flags its --help lists {r['listed']}:\n{out[-2000:]}"


@pytest.mark.parametrize("prog", sorted(PATH_FLAGS))
def test_an_empty_path_flag_is_one_line_naming_it(prog, helps):
  """`--workdir=` (an unset shell variable) meant ./runs/<config.name>: every flag naming
  a file or folder refuses an empty value in one line, before anything runs."""
  for name in PATH_FLAGS[prog]:
    code, out = helps[prog]["empty"][name]
    lines = out.strip().splitlines()
    assert code == 2 and len(lines) == 1, (name, out[-2000:])
    assert lines[0].startswith(f"{prog}: error: --{name} is empty (an unset shell "
                               "variable?); expected "), (name, lines)


@pytest.mark.parametrize("prog", sorted(SCRIPTS))
def test_help_into_a_closed_pipe_ends_quietly(prog, helps):
  """`lev-train --help | head -1`: the reader has gone; no BrokenPipeError traceback,
  nothing on stderr, the shell's status for SIGPIPE (141)."""
  code, err = helps[prog]["help_into_closed_pipe"]
  assert (code, err) == (141, ""), err[-2000:]


@pytest.mark.parametrize("prog", sorted(SCRIPTS))
def test_an_unknown_flag_is_one_line(prog, helps):
  """`lev-lm-eval --bogusflag` printed lm-eval's usage and error twice."""
  code, out = helps[prog]["unknown_flag"]
  lines = out.strip().splitlines()
  assert code == 2 and len(lines) == 1, out[-2000:]
  assert lines[0].startswith(f"{prog}: error: ") and "bogusflag" in lines[0], lines


def test_folder_output_error_names_a_file_or_an_unwritable_ancestor(tmp_path, monkeypatch):
  from lev_jax.cli import common
  (tmp_path / "f").write_text("")
  assert common.folder_output_error("--report_dir", str(tmp_path / "f")) == (
      f"--report_dir={tmp_path / 'f'}: is a file; expected a folder")
  assert common.folder_output_error("--report_dir", str(tmp_path / "f" / "r")) == (
      f"--report_dir={tmp_path / 'f' / 'r'}: cannot write in {tmp_path / 'f'}; expected a "
      "folder you can write to")
  assert common.folder_output_error("--report_dir", str(tmp_path / "new" / "r")) is None
  assert common.folder_output_error("--report_dir", "gs://b/r") is None
  monkeypatch.setattr(common.os, "access", lambda path, mode: False)  # read-only (CI: root)
  assert "cannot write in" in common.folder_output_error("--x", str(tmp_path / "new"))


def test_a_report_of_another_ladder_or_study_file_is_not_replaced(tmp_path):
  """Newcomer pass 10: another ladder file's "0 of 4 rungs finished" replaced a root's
  report (and lev-study's likewise)."""
  from lev_jax.cli import common
  report = tmp_path / "report"
  report.mkdir()
  (report / "ladder.csv").write_text("")
  (report / "analysis.json").write_text(json.dumps({"ladder": "/x/experiments/mine.py"}))
  assert common.report_owner_error("--report_dir", str(report), "ladder.csv",
                                   source="experiments/smoke_ladder.py") == (
      f"--report_dir={report}: holds the report of /x/experiments/mine.py, not of "
      "experiments/smoke_ladder.py; give another --report_dir (or move that report aside)")
  assert common.report_owner_error("--report_dir", str(report), "ladder.csv",
                                   source="mine.py") is None  # the same file, typed otherwise
  (report / "study.csv").write_text("")
  (report / "ladder.csv").unlink()
  (report / "analysis.json").write_text(json.dumps({"study": "experiments/s.py:a"}))
  assert "holds the report of experiments/s.py:a, not of s.py:b" in common.report_owner_error(
      "--report_dir", str(report), "study.csv", source="s.py:b")
  assert common.report_owner_error("--report_dir", str(report), "study.csv",
                                   source="/abs/experiments/s.py:a") is None


@pytest.mark.parametrize("name", ["report.md", "ladder.csv", "trend.png"])
def test_a_report_file_that_is_a_folder_is_refused_before_writing(tmp_path, name):
  """Newcomer pass 12 (B06-B08): report.md (or ladder.csv) replaced by a folder: the
  report was half rewritten, then an IsADirectoryError traceback."""
  from lev_jax.cli import common
  from lev_jax.ladder import reporting
  report = tmp_path / "report"
  report.mkdir()
  (report / "ladder.csv").write_text("")
  (report / "analysis.json").write_text("{}")
  (report / name).unlink(missing_ok=True)
  (report / name).mkdir()
  assert common.report_owner_error("--report_dir", str(report), "ladder.csv") == (
      f"--report_dir={report}: {report / name}: is a folder; expected the report's {name} "
      "file (move it aside)")
  with pytest.raises(ValueError, match=f"{name}: is a folder"):
    reporting.begin_report(report, {"json": "analysis.json", "x": name}, {}, None)
  assert (report / "analysis.json").read_text() == "{}"  # nothing written


def test_a_lock_folder_beside_an_output_is_named(tmp_path):
  """Newcomer pass 13 (N441, N443): lev-export's / lev-prepare-data's PARENT/.NAME.lock
  a folder was "cannot write in PARENT (Is a directory)"."""
  import errno
  from lev_jax.cli import common
  out = tmp_path / "exp"
  (tmp_path / ".exp.lock").mkdir()
  error = OSError(errno.EISDIR, "Is a directory", str(tmp_path / ".exp.lock"))
  assert common.output_path_error("--output", str(out), error) == (
      f"--output={out}: {tmp_path / '.exp.lock'}: is a folder; expected the lock file kept "
      f"beside {out} while it is written: remove that folder (or move it aside) and re-run")
  assert common.output_path_error("--output", str(out), OSError(
      errno.EACCES, "Permission denied", str(tmp_path / ".exp.tmp"))).startswith(
          f"--output={out}: cannot write in {tmp_path} (Permission denied)")


def test_output_file_error_refuses_a_file_in_prepared_data(tmp_path):
  """Newcomer pass 8: lev-eval wrote its result into lev-prepare-data's output."""
  from lev_jax.cli import common
  (tmp_path / "prep" / "prepare").mkdir(parents=True)
  (tmp_path / "prep" / "dataset_info.json").write_text("{}")
  path = tmp_path / "prep" / "prepare" / "e.json"
  assert common.output_file_error(f"--output={path}", str(path)) == (
      f"--output={path}: is inside {tmp_path / 'prep'}, lev-prepare-data's output "
      "(prepared data; only lev-prepare-data writes there); expected a path outside it")
  assert common.output_file_error(f"--json={tmp_path / 'e.json'}",
                                  str(tmp_path / "e.json")) is None


def test_checkpoint_tree_error_names_a_path_in_a_saved_checkpoint(tmp_path, monkeypatch):
  """A run's checkpoints/ (its step folders too) and an export's params/ are only
  written by lev-train and lev-export: every other output flag refuses them."""
  from lev_jax.cli import common
  steps = tmp_path / "run" / "checkpoints" / "300"
  steps.mkdir(parents=True)
  (tmp_path / "run" / "metrics.jsonl").write_text("")  # a run's (lev-train writes it)
  (tmp_path / "mine" / "checkpoints" / "run1").mkdir(parents=True)  # the user's own
  (tmp_path / "exp" / "params").mkdir(parents=True)
  (tmp_path / "exp" / "export.json").write_text("{}")
  (tmp_path / "exp" / "tokenizer").mkdir()  # a run's outputs too
  (tmp_path / "exp" / "token_counts.npy").write_text("")
  (tmp_path / "link").symlink_to(steps)
  monkeypatch.chdir(tmp_path)
  assert common.checkpoint_tree_error("--output", "run/checkpoints/300/x.json") == (
      "--output=run/checkpoints/300/x.json: is inside run/checkpoints, a run's saved "
      "checkpoints (only that run's lev-train writes there); expected a path outside it")
  assert common.checkpoint_tree_error("--workdir", "run/checkpoints").startswith(
      "--workdir=run/checkpoints: is run/checkpoints, a run's saved checkpoints")
  assert common.checkpoint_tree_error("--o", str(tmp_path / "link" / "x")).startswith(
      f"--o={tmp_path / 'link' / 'x'}: is inside {tmp_path / 'run' / 'checkpoints'}, ")
  assert "an export's parameters (only lev-export writes there)" in (
      common.checkpoint_tree_error("--output_path", "exp/params/r.json"))
  assert common.folder_output_error("--report_dir", "run/checkpoints/r").startswith(
      "--report_dir=run/checkpoints/r: is inside run/checkpoints")
  assert common.created_folder_error("--root", "run/checkpoints/r").startswith(
      "--root=run/checkpoints/r: is inside")
  assert not (tmp_path / "run" / "checkpoints" / "r").exists()
  for fine in ("run/lev_eval.json", "exp/r.json", "new/checkpoints/x", "gs://b/checkpoints/1",
               "mine/checkpoints/run1/lev_eval.json"):
    assert common.checkpoint_tree_error("--output", fine) is None, fine


def _a_run_and_an_export(tmp_path, run_file: str, text: str):
  """tmp_path/run: a run's folder (checkpoints/ and `run_file` holding `text`);
  tmp_path/exp: an export (export.json, and a run's tokenizer/ and token_counts.npy)."""
  (tmp_path / "run" / "checkpoints").mkdir(parents=True)
  (tmp_path / "run" / run_file).write_text(text)
  (tmp_path / "exp").mkdir()
  (tmp_path / "exp" / "export.json").write_text("{}")
  (tmp_path / "exp" / "tokenizer").mkdir()  # a run's outputs too
  (tmp_path / "exp" / "token_counts.npy").write_text("")


def test_checkpoint_tree_error_names_every_file_a_run_or_export_owns(tmp_path, monkeypatch):
  """`lev-eval --output=runs/cb3/metrics.jsonl` replaced the run's training metrics."""
  from lev_jax.cli import common
  _a_run_and_an_export(tmp_path, "metrics.jsonl", "")
  monkeypatch.chdir(tmp_path)
  assert common.checkpoint_tree_error("--output", "run/metrics.jsonl") == (
      "--output=run/metrics.jsonl: is run/metrics.jsonl, a run's own file (only that "
      "run's lev-train writes it); expected another path")
  for owned in ("run/eval.json", "run/token_counts.npy", "run/tokenizer/x.json",
                "run/tensorboard", "exp/config.json",
                "run/errors.log", "run/profile/x.json"):  # issue 26: these two were not
    assert common.checkpoint_tree_error("--output", owned), owned
  (tmp_path / "exp" / "token_counts.npy").write_text("")  # an export's, not a run's
  assert "is inside exp/tokenizer, an export's own folder (only lev-export" in (
      common.checkpoint_tree_error("--output", "exp/tokenizer/x"))
  assert common.checkpoint_tree_error("--output", "run/lev_eval.json") is None
  assert common.checkpoint_tree_error("--output", "exp/lev_eval.json") is None


def test_workdir_root_and_report_folder_errors(tmp_path, monkeypatch):
  """lev-train into an export, lev-ladder/lev-study with a run as --root, and a study
  report written over a ladder's, were all silent."""
  from lev_jax.cli import common
  _a_run_and_an_export(tmp_path, "eval.json", "{}")
  (tmp_path / "root" / "report").mkdir(parents=True)
  (tmp_path / "root" / "report" / "ladder.csv").write_text("")
  monkeypatch.chdir(tmp_path)
  assert common.export_folder_error("--workdir", "exp") == (
      "--workdir=exp: is exp, an export (only lev-export writes there); expected another "
      "path")
  assert common.export_folder_error("--workdir", "exp/w").startswith("--workdir=exp/w: is inside exp")
  assert common.export_folder_error("--workdir", "run") is None
  assert common.run_folder_error("--root", "run/r").startswith(
      "--root=run/r: is inside run, a training run's folder")
  assert common.run_folder_error("--root", "root") is None
  assert common.run_folder_error("--root", "exp") == (  # issue 26: "a training run's"
      "--root=exp: is exp, an export (only lev-export writes there); expected another path")
  assert common.report_owner_error("--report_dir", "root/report", "study.csv") == (
      "--report_dir=root/report: holds a lev-ladder report (ladder.csv); expected an empty "
      "folder or this command's own report folder (give another --report_dir)")
  assert common.report_owner_error("--report_dir", "root/report", "ladder.csv") is None
  # issue 26: a run's folder, an export, or a folder of unrelated files took a report
  assert common.report_owner_error("--report_dir", "run", "ladder.csv").startswith(
      "--report_dir=run: is run, a training run's folder")
  assert common.report_owner_error("--report_dir", "exp", "study.csv").startswith(
      "--report_dir=exp: is exp, an export")
  (tmp_path / "mixed").mkdir()
  (tmp_path / "mixed" / "notes.txt").write_text("mine")
  assert common.report_owner_error("--report_dir", "mixed", "ladder.csv") == (
      "--report_dir=mixed: holds files that are not a lev-ladder report (e.g. notes.txt; "
      "no ladder.csv); expected an empty folder or an earlier lev-ladder report folder "
      "(give another --report_dir)")
  (tmp_path / "empty").mkdir()
  assert common.report_owner_error("--report_dir", "empty", "study.csv") is None
  assert common.report_owner_error("--report_dir", "new", "study.csv") is None


def test_define_path_refuses_an_empty_or_blank_value(capsys):
  from absl import flags
  from lev_jax.cli import common
  fv = flags.FlagValues()
  common.define_path("output", None, "Where.", what="the folder to write", fv=fv)
  parse = common.flags_parser("lev-x", None, fv)
  assert parse(["lev-x"]) == ["lev-x"] and fv.output is None  # left out: the default
  for value in ("", "  "):
    with pytest.raises(SystemExit) as e:
      parse(["lev-x", f"--output={value}"])
    assert e.value.code == 2
    assert capsys.readouterr().err == ("lev-x: error: --output is empty (an unset shell "
                                       "variable?); expected the folder to write\n")
  parse(["lev-x", "--output=out"])
  assert fv.output == "out"
  # Newcomer pass 11: a quoted '~/x' was a folder named '~' for lev-ladder's report and a
  # failed lev-export, while lev-train expanded it; every path flag expands it now.
  parse(["lev-x", "--output=~/x"])
  assert fv.output == os.path.join(os.path.expanduser("~"), "x")
  # Issue 26 (fifth pass): a path with bytes that are not UTF-8 (argv keeps them as lone
  # surrogates) trained, then every Orbax save failed with tracebacks: refused when parsed.
  with pytest.raises(SystemExit) as e:
    parse(["lev-x", "--output=/tmp/w\udcff"])
  assert e.value.code == 2
  assert capsys.readouterr().err == (
      "lev-x: error: --output is not UTF-8 text (a byte that is not UTF-8, which Orbax, "
      "TensorStore and ArrayRecord cannot write in a path); expected the folder to write, "
      "named in UTF-8\n")
  # newcomer pass 7: other paths' bytes were shown as Python's surrogates (\udcff)
  with pytest.raises(SystemExit):
    common.fail("lev-x", "--config=\udcff.py: no such file")
  assert capsys.readouterr().err == "lev-x: error: --config=\\xff.py: no such file\n"


def test_a_flag_on_by_default_is_listed_as_what_its_no_form_does(helps):
  """Issue 26: `--noestimate_time  Estimate the step time ...` read backwards: a boolean
  flag that is on by default is listed as --noNAME, which turns it off."""
  rows = {prog: [l for l in helps[prog]["help"].splitlines() if l.startswith("  --no")]
          for prog in ("lev-compile", "lev-eval")}
  assert rows["lev-compile"] and rows["lev-eval"], rows
  for prog, lines in rows.items():
    for line in lines:
      assert line.split(None, 1)[1].startswith("Turns off (default on): "), (prog, line)


def _config_command(monkeypatch, argv, default="experiments/smoke.py:leviathan"):
  """A fresh FlagValues with a config-file flag defined as a command defines it (its
  overrides read from sys.argv = argv), and the command's flags_parser."""
  from absl import flags
  from ml_collections import config_flags
  from lev_jax.cli import common
  monkeypatch.chdir(REPO)
  monkeypatch.setattr(sys, "argv", list(argv))
  fv = flags.FlagValues()
  flags.DEFINE_integer("stop_at_step", None, "Stop.", flag_values=fv)
  common.define_or_exit("lev-x", lambda: config_flags.DEFINE_config_file(
      "config", default, "Experiment.", flag_values=fv))
  return fv, common.flags_parser("lev-x", None, fv)


@pytest.mark.parametrize("argv,error", [
    (["--config=NOGET"], "--config=NOGET: defines no get_config(variant) function"),
    # issue 26: a .py file holding NUL bytes was a 58-line traceback
    (["--config=BINARY"], "--config=BINARY: not Python source (source code string cannot "
     "contain null bytes)"),
    # issue 26: README.md as the config was "README.md:11: leading zeros ... (a Python
    # syntax error in the config file)"
    (["--config=README.md"], "--config=README.md: not a Python file (expected a .py "
     "config file defining get_config(variant)"),
    # newcomer pass 4: /dev/zero was read until memory ran out (/dev/null: "defines no
    # get_config"), then called "no such file"
    (["--config=/dev/null"], "--config=/dev/null: is a character device, not a regular "
     "file (expected a Python config file and variant"),
    (["--config.train.steps=abc"],
     "--config.train.steps=abc: expected an integer (config.train.steps is 300)"),
    (["--config.lev.remat=maybe"],
     "--config.lev.remat=maybe: expected true or false (config.lev.remat is False)"),
    (["--config.optim.lr=x"], "--config.optim.lr=x: expected a number (config.optim.lr is "),
    (["--steps=3"], "unknown flag --steps (did you mean --stop_at_step?); to set the config "
     "field, pass --config.train.steps=3"),
    # newcomer pass 17 (C11): model.remat, the layers' policy, first
    (["--noremat"], "unknown flag --noremat; to set a config field, pass one of "
     "--config.model.remat=none, --config.lev.remat=false\n"),
    # newcomer pass 17 (C12, C13, G55): other codebases' remat and batch names
    (["--remat_policy=full"], "unknown flag --remat_policy; to set the config field, pass "
     "--config.model.remat=full\n"),
    (["--gradient_checkpointing=True"], "unknown flag --gradient_checkpointing; to set the "
     "config field, pass --config.model.remat=full\n"),
    # newcomer pass 18 (F04-F07): HF's save / logging steps, activation checkpointing,
    # and --remat, whose field is the layers' policy before lev.remat
    (["--save_steps=50"], "unknown flag --save_steps; to set the config field, pass "
     "--config.train.checkpoint_every=50\n"),
    (["--activation_checkpointing=false"], "unknown flag --activation_checkpointing; to "
     "set the config field, pass --config.model.remat=none\n"),
    (["--remat=full"], "unknown flag --remat; to set the config field, pass "
     "--config.model.remat=full\n"),
    (["--remat=false"], "unknown flag --remat; to set a config field, pass one of "
     "--config.model.remat=none, --config.lev.remat=false\n"),
    # newcomer pass 19: a bare switch (A06), an invalid value not copied (A39), dashes
    # (A68), other codebases' names (A10, A20, A34, A64, A83)
    (["--gradient_checkpointing"], "unknown flag --gradient_checkpointing; to set the "
     "config field, pass --config.model.remat=full\n"),
    (["--remat_policy=minimal"], "unknown flag --remat_policy; to set the config field, "
     "pass --config.model.remat=VALUE (one of auto, none, full, dots, dots_no_batch)\n"),
    (["--save-steps=5"], "unknown flag --save-steps; to set the config field, pass "
     "--config.train.checkpoint_every=5\n"),
    (["--max_length=256"], "unknown flag --max_length; to set the config field, "
     "pass --config.train.seq_len=256\n"),
    (["--eval_steps=10"], "unknown flag --eval_steps; to set a config field, pass one of "
     "--config.eval.batches=10, --config.train.eval_every=10\n"),
    (["--bf16"], "unknown flag --bf16; to set the config field, "
     "pass --config.model.dtype=bfloat16\n"),
    (["--num-key-value-heads=2"], "unknown flag --num-key-value-heads; to set the config "
     "field, pass --config.model.n_kv_heads=2\n"),  # newcomer pass 20 (N01, N66)
    (["--min-lr=1e-5"], "unknown flag --min-lr; to set the config field, pass "
     "--config.optim.min_lr_ratio=RATIO (the final learning rate / optim.lr)\n"),  # nc21
    (["--ici_fsdp_parallelism=4"], "unknown flag --ici_fsdp_parallelism; to set the config field, "
     "pass --config.mesh.fsdp=4\n"),
    (["--per_device_batch_size=4"], "unknown flag --per_device_batch_size; to set the "
     "config field, pass --config.train.global_batch_size=4 (the batch of a step over all "
     "devices: per device x devices)\n"),
    # newcomer pass 19 (A71, A73): another codebase's name, a field of another section
    (["--config.train.save_steps=5"], "--config.train.save_steps: the config has no field "
     "'save_steps' (did you mean --config.train.checkpoint_every?)\n"),
    (["--config.train.remat=full"], "--config.train.remat: the config has no field 'remat' "
     "(did you mean --config.model.remat?)\n"),
    (["--config.train.class=3"], "--config.train.class: not a valid field path"),
    (["--config.=3"], "--config.: not a valid field path"),
    (["--config.train..steps=3"], "--config.train..steps: not a valid field path"),
    # issue 26: a section, or an override without its value (absl takes the next flag)
    (["--config.train", "--stop_at_step=2"], "--config.train: config.train is a section, "
     "not a field: give one of its fields a value, e.g. --config.train.checkpoint_every="),
    (["--config.train=5"], "--config.train=5: config.train is a section, not a field"),
    (["--config.data.prepared_dir", "--stop_at_step=2"], "--config.data.prepared_dir has "
     "no value (absl took the next flag, --stop_at_step=2, as its value); expected "
     "--config.data.prepared_dir=VALUE, e.g. --config.data.prepared_dir=VALUE\n"),
    (["--config.train.steps"], "--config.train.steps has no value; expected "
     "--config.train.steps=VALUE, e.g. --config.train.steps=300\n"),
    # newcomer pass 13: other codebases' flags name the field they mean here first
    (["--batch_size=4"], "unknown flag --batch_size; to set a config field, pass one of "
     "--config.train.global_batch_size=4, --config.eval.batch_size=4\n"),
    (["--max_iters=6"], "unknown flag --max_iters; to set the config field, pass "
     "--config.train.steps=6\n"),
    # newcomer pass 16: HF's per-device batch (G31), Levanter's dotted form (G34), and
    # --config_path (G35), which absl answered with "Did you mean: config.optim..."
    (["--per_device_train_batch_size=8"], "unknown flag --per_device_train_batch_size; to "
     "set the config field, pass --config.train.global_batch_size=8 (the batch of a step "
     "over all devices: per device x devices)\n"),
    (["--trainer.num_train_steps=10"], "unknown flag --trainer.num_train_steps; to set the "
     "config field, pass --config.train.steps=10\n"),
    (["--config_path=experiments/smoke.py"], "unknown flag --config_path: the config is "
     "--config=FILE:VARIANT (e.g. --config=experiments/smoke.py:leviathan)\n"),
    # newcomer pass 14: the last --config won without a word; an empty file part
    (["--config=experiments/smoke.py:tied", "--config=experiments/smoke.py:leviathan"],
     "--config given 2 times (experiments/smoke.py:tied, experiments/smoke.py:leviathan); "
     "give one\n"),
    (["--config=:tied"], "--config=:tied: the file part is empty (an unset shell "
     "variable?)"),
    # newcomer pass 13: `--config=` (an unset variable) was ml_collections' traceback
    (["--config="], "--config is empty (an unset shell variable?); expected a Python "
     "config file and variant, e.g. experiments/smoke.py:leviathan\n"),
    # newcomer pass 12: a path through a text field was ml_collections' TypeError
    (["--config.data.tokenizer.sentencepiece_file=x.model"],
     "--config.data.tokenizer.sentencepiece_file: config.data.tokenizer = "
     "'sentencepiece' is a value, not a section: it has no field 'sentencepiece_file' "
     "(did you mean --config.data.sentencepiece_file?)\n"),
])
def test_config_flag_mistakes_are_one_line_naming_the_field(monkeypatch, capsys, tmp_path,
                                                            argv, error):
  """Issue 26: a config file without get_config (a traceback), ml_collections' raw words
  for a value of the wrong type, and a config field given as a flag of its own."""
  noget = tmp_path / "noget.py"
  noget.write_text("x = 1\n")
  (tmp_path / "binary.py").write_bytes(b"x = 1\n\0\0")
  # ml_collections loads every --config file as the module "config_config" and
  # re-executes a file into the module already there: an earlier test's get_config
  # would survive in it.
  monkeypatch.delitem(sys.modules, "config_config", raising=False)
  argv = ["lev-x", *(a.replace("NOGET", str(noget)).replace("BINARY", str(tmp_path / "binary.py"))
                     for a in argv)]
  with pytest.raises(SystemExit) as e:
    fv, parse = _config_command(monkeypatch, argv)
    parse(argv)
  err = capsys.readouterr().err
  assert e.value.code == 2 and err.count("\n") == 1, err
  error = error.replace("NOGET", str(noget)).replace("BINARY", str(tmp_path / "binary.py"))
  assert err.startswith("lev-x: error: " + error), err


@pytest.mark.parametrize("given", ["--config=", "--config=experiments/smoke.py:tied"])
def test_a_config_file_given_to_a_command_of_overrides_is_one_line(monkeypatch, capsys,
                                                                   given):
  """Newcomer pass 13: lev-eval --config=FILE was absl's "Overriding config is not
  allowed"; its config is the checkpoint's, changed only by --config.<field> overrides."""
  from absl import flags
  from ml_collections import config_flags
  from lev_jax.cli import common
  from lev_jax.config import base_config
  argv = ["lev-x", given, "--config.eval.batches=2"]
  monkeypatch.setattr(sys, "argv", list(argv))
  fv = flags.FlagValues()
  config_flags.DEFINE_config_dict("config", base_config(), "Overrides.", flag_values=fv)
  with pytest.raises(SystemExit) as e:
    common.flags_parser("lev-x", None, fv)(argv)
  assert e.value.code == 2 and capsys.readouterr().err == (
      f"lev-x: error: {given}: lev-x takes no config file: it uses the checkpoint's own "
      "config; change its fields with --config.<section>.<field>=VALUE (e.g. "
      "--config.eval.batches=4)\n")
  argv = ["lev-x", "--batch_size=3"]
  with pytest.raises(SystemExit) as e:  # not a training: no habit of training flags
    common.flags_parser("lev-x", None, fv)(argv)
  assert capsys.readouterr().err == ("lev-x: error: unknown flag --batch_size; to set the "
                                     "config field, pass --config.eval.batch_size=3\n")
  argv = ["lev-x", "--eval_steps=2"]  # newcomer pass 16 (G41): an eval habit applies
  with pytest.raises(SystemExit) as e:
    common.flags_parser("lev-x", None, fv)(argv)
  assert capsys.readouterr().err == ("lev-x: error: unknown flag --eval_steps; to set the "
                                     "config field, pass --config.eval.batches=2\n")
  argv = ["lev-x", "--remat=full"]  # newcomer pass 21 (F15): not a field lev-eval refuses
  with pytest.raises(SystemExit) as e:
    common.flags_parser("lev-x", None, fv)(argv)
  assert "--config.model.remat" not in capsys.readouterr().err


@pytest.mark.parametrize("flag, said", [
    ("--out_dir=x", "unknown flag --out_dir: the run's folder is --workdir=DIR\n"),
    ("--init_from=resume", "unknown flag --init_from: lev-train resumes from --workdir's "
     "latest checkpoint by itself (a new --workdir starts from scratch)\n"),
    # newcomer pass 19 (A34, A35): MaxText's; dashed
    ("--base_output_directory=x", "unknown flag --base_output_directory: the run's folder "
     "is --workdir=DIR\n"),
    ("--output-dir=x", "unknown flag --output-dir: the run's folder is --workdir=DIR\n"),
])
def test_other_codebases_run_folder_flags_point_at_workdir(monkeypatch, capsys, flag, said):
  """Newcomer pass 14: --out_dir was absl's "Did you mean: log_dir ?"."""
  from absl import flags
  from lev_jax.cli import common
  fv = flags.FlagValues()
  flags.DEFINE_string("workdir", None, "The run's folder.", flag_values=fv)
  with pytest.raises(SystemExit):
    common.flags_parser("lev-x", None, fv)(["lev-x", flag])
  assert capsys.readouterr().err == "lev-x: error: " + said


def test_an_override_without_a_config_to_change_says_so(monkeypatch, capsys):
  """lev-prepare-data has no default config: `--config.data.seed=3` alone was "Unknown
  command line flag 'config.data.seed'"."""
  argv = ["lev-x", "--config.data.seed=3"]
  fv, parse = _config_command(monkeypatch, argv, default=None)
  with pytest.raises(SystemExit) as e:
    parse(argv)
  assert e.value.code == 2
  assert capsys.readouterr().err == (
      "lev-x: error: --config.data.seed: an override needs the config it changes: give "
      "--config=FILE:VARIANT too, e.g. --config=experiments/ladder.py:tied_1.2b\n")


def test_an_override_before_the_config_file_applies_to_that_file(monkeypatch):
  """Issue 26: `--config.train.steps=3 --config=FILE` was refused by ml_collections
  ("Found ... before a value for --config was specified"): it now means what it says."""
  argv = ["lev-x", "--config.train.steps=3", "--stop_at_step=2",
          "--config=experiments/smoke.py:tied", "--config.eval.batches=2"]
  fv, parse = _config_command(monkeypatch, argv)
  parse(sys.argv)
  assert (fv.config.name, fv.config.train.steps, fv.config.eval.batches,
          fv.stop_at_step) == ("smoke_tied", 3, 2, 2)


@pytest.mark.parametrize("form", ["--config=~/exp.py:tied", "--config ~/exp.py:tied"])
def test_a_config_file_under_home_is_expanded(monkeypatch, tmp_path, form):
  """Newcomer pass 12 (T15, T17): `--config='~/x.py:tied'` was read as a file in a
  folder named `~` (lev-train blamed get_config), while every path flag expands `~`."""
  monkeypatch.setenv("HOME", str(tmp_path))
  (tmp_path / "exp.py").write_text(
      "from lev_jax.experiments import load_experiment\n"
      f"_smoke = load_experiment({str(REPO / 'experiments/smoke.py')!r})\n"
      "def get_config(variant):\n  return _smoke.get_config(variant)\n")
  monkeypatch.delitem(sys.modules, "config_config", raising=False)
  argv = ["lev-x", *form.split(" "), "--config.train.steps=3"]
  fv, parse = _config_command(monkeypatch, argv)
  parse(sys.argv)
  assert (fv.config.name, fv.config.train.steps) == ("smoke_tied", 3)


def test_the_tpu_backend_is_skipped_only_without_chips_and_a_platform_choice(monkeypatch):
  """Issue 26: libtpu printed its start-up lines in CPU runs with JAX_PLATFORMS unset
  (the TPU backend, which cannot start without a chip, was still tried)."""
  import jax
  from jax._src import hardware_utils, xla_bridge
  from lev_jax.cli import common
  def libtpu():
    raise AssertionError("libtpu loaded")
  tpu = xla_bridge.BackendRegistration(factory=libtpu, priority=300, fail_quietly=True)
  monkeypatch.setattr(xla_bridge, "_backend_factories", {"tpu": tpu})
  monkeypatch.setattr(xla_bridge, "backends_are_initialized", lambda: False)
  monkeypatch.setattr(hardware_utils, "num_available_tpu_chips_and_device_id",
                      lambda: (0, None))
  monkeypatch.delenv("JAX_FORCE_TPU_INIT", raising=False)
  platforms = jax.config.jax_platforms
  jax.config.update("jax_platforms", "cpu")  # JAX_PLATFORMS given: jax's choice is kept
  try:
    assert not common.skip_tpu_backend_without_chips() and tpu.factory is libtpu
    jax.config.update("jax_platforms", None)
    monkeypatch.setattr(hardware_utils, "num_available_tpu_chips_and_device_id",
                        lambda: (4, None))
    assert not common.skip_tpu_backend_without_chips() and tpu.factory is libtpu  # a TPU VM
    monkeypatch.setattr(hardware_utils, "num_available_tpu_chips_and_device_id",
                        lambda: (0, None))
    assert common.skip_tpu_backend_without_chips()
  finally:
    jax.config.update("jax_platforms", platforms)
  assert list(xla_bridge._backend_factories) == ["tpu"]  # still a known platform
  with pytest.raises(RuntimeError, match="no TPU chip is attached"):
    tpu.factory()


def test_eval_help_does_not_dump_the_config(helps):
  text = helps["lev-eval"]["help"]
  assert "freq_bucket_edges:" not in text and "cache_dir:" not in text, text




def _load_config_file(monkeypatch, capsys, flags_given) -> tuple[int, str]:
  """(exit status, stderr) of parsing `flags_given` and loading the config as a command
  does (common.config_or_exit)."""
  monkeypatch.delitem(sys.modules, "config_config", raising=False)
  argv = ["lev-x", *flags_given]
  from lev_jax.cli import common
  with pytest.raises(SystemExit) as e:
    fv, parse = _config_command(monkeypatch, argv)
    parse(argv)
    common.config_or_exit("lev-x", fv)
  return e.value.code, capsys.readouterr().err


@pytest.mark.parametrize("overrides", [[], ["--config.train.steps=3"]])
@pytest.mark.parametrize("value,kind", [("{'train': {'steps': 5}}", "a dict"),
                                        ("42", "an int"), ("None", "None")])
def test_a_config_file_returning_a_dict_is_one_line(monkeypatch, capsys, tmp_path, overrides,
                                                     value, kind):
  """Issue 26: get_config returning a plain dict reached validate (AttributeError);
  newcomer pass 8: an int was "'int' object has no attribute 'get'"."""
  path = tmp_path / "plain.py"
  path.write_text(f"def get_config():\n  return {value}\n")
  code, err = _load_config_file(monkeypatch, capsys, [f"--config={path}", *overrides])
  assert code == 2 and err.count("\n") == 1, err
  assert err.startswith(f"lev-x: error: --config={path}: get_config returned {kind}; "
                        "expected an ml_collections.ConfigDict"), err


@pytest.mark.parametrize("body,said", [
    ("import sys\ndef get_config(v=None):\n  sys.exit(0)\n",
     "get_config called sys.exit(0) instead of returning a config"),
    ("import ml_collections\nfrom lev_jax.config import base_config\n"
     "def get_config(v=None):\n  return ml_collections.FrozenConfigDict(base_config())\n",
     "get_config returned a FrozenConfigDict, which no override or command can change")])
@pytest.mark.parametrize("overrides", [[], ["--config.eval.batches=1"]])
def test_a_get_config_that_exits_or_freezes_is_one_line(monkeypatch, capsys, tmp_path, body,
                                                         said, overrides):
  """Newcomer pass 10: sys.exit(0) in get_config ended lev-train with exit 0 and nothing
  done; a FrozenConfigDict was "immutable. Cannot call lock()" or a traceback."""
  path = tmp_path / "odd.py"
  path.write_text(body)
  code, err = _load_config_file(monkeypatch, capsys, [f"--config={path}", *overrides])
  assert code == 2 and err.count("\n") == 1 and said in err, err


def test_a_get_config_that_raises_names_the_file_and_line(monkeypatch, capsys, tmp_path):
  """Newcomer pass 9: `lev-train: error: boom` did not say the config file raised."""
  path = tmp_path / "raising.py"
  path.write_text("def get_config(v=None):\n  raise ValueError('boom')\n")
  monkeypatch.delitem(sys.modules, "config_config", raising=False)
  argv = ["lev-x", f"--config={path}:x"]
  with pytest.raises(SystemExit) as e:
    _, parse = _config_command(monkeypatch, argv)
    parse(argv)
  err = capsys.readouterr().err
  assert e.value.code == 2 and err == f"lev-x: error: {path}:2: get_config raised ValueError: boom\n"


def test_a_bad_boolean_or_a_missing_required_flag_is_one_plain_line(capsys):
  """Issue 26: `--restore_fallback=maybe` printed absl's Python tuple ("('Non-boolean
  argument to boolean flag', 'maybe')"), a required --root left out "flag --root=None:
  Flag --root must have a value other than None."."""
  from absl import flags
  from lev_jax.cli import common
  for argv, line in ((["--root=r", "--restore_fallback=maybe"],
                      "--restore_fallback=maybe: expected true or false"),
                     (["--root=r", "--workers=x"], "--workers=x: expected an integer"),
                     (["--root=r", "--workers=0"], "flag --workers=0: 0 is not a positive "
                      "integer"),
                     ([], "--root: required: the folder holding the runs")):
    fv = flags.FlagValues()
    flags.DEFINE_bool("restore_fallback", False, "Fall back.", flag_values=fv)
    flags.DEFINE_integer("workers", None, "Workers.", lower_bound=1, flag_values=fv)
    common.define_path("root", None, "Root.", what="the folder holding the runs", fv=fv)
    flags.mark_flags_as_required(["root"], flag_values=fv)
    parse = common.flags_parser("lev-x", None, fv)
    with pytest.raises(SystemExit) as e:
      parse(["lev-x", *argv])
    assert e.value.code == 2
    assert capsys.readouterr().err == f"lev-x: error: {line}\n"


if __name__ == "__main__":
  print(json.dumps(_drive()))


@pytest.mark.parametrize("platforms,raised,reason", [
    ("cuda", AssertionError(), "no NVIDIA GPU is visible"),
    ("foo", RuntimeError("Unable to initialize backend 'foo': Backend 'foo' is not in the "
                         "list of known backends: ['cpu', 'tpu']. (set JAX_PLATFORMS='' to "
                         "automatically choose an available backend)"),
     "Unable to initialize backend 'foo': Backend 'foo' is not in the list of known "
     "backends: ['cpu', 'tpu']"),
    # newcomer pass 5: "gpu" tries cuda, then rocm, and jax names 'rocm'
    ("gpu", RuntimeError("Unable to initialize backend 'rocm': Backend 'rocm' is not in the "
                         "list of known backends: ['cpu', 'tpu']. (set JAX_PLATFORMS='' to "
                         "automatically choose an available backend)"),
     "no GPU backend is installed: jax has cpu, tpu; for NVIDIA GPUs install jax[cuda12] as "
     "BUILD.md says"),
])
def test_a_backend_jax_cannot_start_is_one_line(monkeypatch, capsys, platforms, raised, reason):
  """Newcomer pass 4: JAX_PLATFORMS=tpu/foo/gpu was a 40-65 line traceback in lev-eval,
  lev-sample, lev-export and lev-lm-eval; cuda without a GPU a bare AssertionError."""
  import jax
  from lev_jax.cli import common
  monkeypatch.setenv("JAX_PLATFORMS", platforms)
  def devices():
    raise raised
  monkeypatch.setattr(jax, "devices", devices)
  with pytest.raises(SystemExit) as e:
    common.backend_or_exit("lev-x")
  assert e.value.code == 2 and capsys.readouterr().err == (
      f"lev-x: error: JAX_PLATFORMS={platforms}: jax cannot start that backend here "
      f"({reason}); expected a platform this machine has, e.g. JAX_PLATFORMS=cpu, or leave "
      "it unset for jax to choose\n")
  monkeypatch.setattr(jax, "devices", lambda: ["cpu"])
  assert common.backend_error() is None


def test_an_unknown_xla_flag_is_named_before_the_job(monkeypatch, tmp_path):
  """Newcomer pass 5: XLA_FLAGS=--bogus_flag lev-train --preflight=cpu:1x1 said ok (XLA
  aborts the real job when its backend starts); pass 6: in a real run XLA's abort line
  (exit 1) was the message. Known flag names are remembered: a second check is free."""
  from lev_jax.cli import common
  monkeypatch.setattr(common, "XLA_FLAGS_CACHE", str(tmp_path / "known"))
  monkeypatch.delenv("XLA_FLAGS", raising=False)
  assert common.xla_flags_error() is None
  monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_enable_latency_hiding_scheduler=true "
                     "--bogus_flag=3")
  assert common.xla_flags_error() == (
      "XLA_FLAGS holds --bogus_flag=3, a flag this jaxlib's XLA does not know: XLA would "
      "abort the job when it starts; expected XLA's own flags (XLA_FLAGS=--help lists them)")
  monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_enable_latency_hiding_scheduler=true")
  assert common.xla_flags_error() is None  # a GPU flag, checked on this CPU host
  (cache,) = tmp_path.iterdir()
  assert cache.read_text() == "--xla_gpu_enable_latency_hiding_scheduler\n"
  import subprocess
  monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("checked again"))
  assert common.xla_flags_error() is None


def test_a_sampling_seed_beyond_64_bits_is_refused_when_parsed(capsys):
  """Newcomer pass 4: lev-sample --seed=99999999999999999999 was an OverflowError."""
  from absl import flags
  from lev_jax.cli import common, sample
  fv = flags.FlagValues()
  sample.define_flags(fv)
  parse = common.flags_parser("lev-sample", None, fv)
  assert parse(["lev-sample", f"--seed={-2**63}"]) == ["lev-sample"]
  assert parse(["lev-sample", f"--seed={2**63 - 1}"]) == ["lev-sample"]
  # newcomer pass 5: the range's upper end printed as 9223372032559808512
  assert [sample._batch_seed(2**63 - 1, i) for i in range(3)] == [2**63 - 1, -2**63,
                                                                   -2**63 + 1]
  with pytest.raises(SystemExit) as e:
    parse(["lev-sample", "--seed=99999999999999999999"])
  assert e.value.code == 2 and capsys.readouterr().err.startswith(
      "lev-sample: error: flag --seed=99999999999999999999: 99999999999999999999 is not an "
      "integer in the range [-9223372036854775808, 9223372036854775807]")


def test_a_dangling_symbolic_link_as_a_folder_is_named(tmp_path):
  """Newcomer pass 4: --workdir=<dangling link> was "cannot create the folder (File
  exists)"; the same for lev-ladder's and lev-study's --root and --report_dir."""
  import re
  from lev_jax import lock
  from lev_jax.cli import common, study as study_cli, train
  (tmp_path / "dl").symlink_to(tmp_path / "gone")
  dl = str(tmp_path / "dl")
  line = (f"is a dangling symbolic link to {tmp_path / 'gone'}; expected a folder (create "
          "the folder it points to, or remove the link)")
  assert train.workdir_error(dl) == f"--workdir={dl}: {line}"
  assert common.dangling_link_error("--root", f"{dl}/sub") == (
      f"--root={dl}/sub: {dl}, a folder on its way, {line}")
  assert common.created_folder_error("--root", dl) == f"--root={dl}: {line}"
  assert study_cli.folders_error(dl, run=False, report_dir=None) == f"--root={dl}: {line}"
  assert common.folder_output_error("--report_dir", dl) == f"--report_dir={dl}: {line}"
  assert common.dangling_link_error("--root", str(tmp_path / "new" / "sub")) is None
  with pytest.raises(lock.WorkdirLockError, match=f"^{dl}: {re.escape(line)}$"):
    with lock.hold(dl, prog="lev-train"):
      pass


def test_a_flag_given_twice_with_other_values_is_named(tmp_path):
  """Newcomer pass 14 (P01-P03): absl keeps the last of a repeated flag without a word
  (an edited command line, or a wrapper adding one); one warning names both values.
  A list flag (absl's multi flags) and the same value twice say nothing."""
  from absl import flags, logging
  from lev_jax.cli import common
  fv = flags.FlagValues()
  flags.DEFINE_string("checkpoint", None, "a run", flag_values=fv)
  flags.DEFINE_bool("run", False, "train", flag_values=fv)
  flags.DEFINE_multi_string("tasks", [], "tasks", flag_values=fv)
  seen = []
  with pytest.MonkeyPatch.context() as m:
    m.setattr(logging, "warning", lambda fmt, *a: seen.append(fmt % a))
    common.flags_parser("lev-x", None, fv)(
        ["lev-x", "--checkpoint=/a", "--checkpoint", "/b", "--run", "--norun",
         "--tasks=x", "--tasks=y", "--", "--checkpoint=/c"])
  assert fv.checkpoint == "/b" and seen == [
      "--checkpoint given twice (/a, /b); using the last, /b",
      "--run given twice (true, false); using the last, false"]
  assert common.flags_given_twice(["lev-x", "--checkpoint=/a", "--checkpoint=/a"], fv) == []
  # newcomer pass 15 (F11): a flag in --flagfile and again on the command line
  flagfile = tmp_path / "f.flags"
  flagfile.write_text("--checkpoint=/f\n")
  assert common.flags_given_twice(
      ["lev-x", f"--flagfile={flagfile}", "--checkpoint=/b"], fv) == [
          "--checkpoint given twice (/f, /b); using the last, /b"]


def test_a_maxtext_style_positional_override_names_the_flag_it_means(capsys):
  """Newcomer pass 19 (A36): `lev-train steps=100` was "unexpected arguments: steps=100";
  pass 20: Hydra's `+train.steps`, the command's own flags (N17, N61, N62), an invalid
  choice (N16)."""
  from absl import flags
  from ml_collections import config_flags
  from lev_jax.cli import common
  from lev_jax.config import base_config
  with_config, without, evaluation = (flags.FlagValues() for _ in range(3))
  config_flags.DEFINE_config_file("config", None, "Experiment.", flag_values=with_config)
  flags.DEFINE_float("temperature", 0.0, "Temperature.", flag_values=without)
  # lev-eval's overrides of a checkpoint's config: never a field it refuses (pass 21, M16)
  config_flags.DEFINE_config_dict("config", base_config(), flag_values=evaluation)
  for fv, args, hint in (
      (with_config, ["steps=100"], "did you mean --config.train.steps=100?)"),
      (with_config, ["+optim.lr=3e-4"], "did you mean --config.optim.lr=3e-4?)"),
      (with_config, ["remat_policy=minimal"], "did you mean --config.model.remat=VALUE, "
       "one of auto, none, full, dots, dots_no_batch?)"),
      (without, ["temperature=0.5"], "did you mean --temperature=0.5?)"),
      (without, ["steps=100"], None), (with_config, ["foo", "bar=1"], None),
      (evaluation, ["steps=100"], None), (evaluation, ["remat=full"], None),
      (with_config, ["+min_lr=1e-5"], "did you mean --config.optim.min_lr_ratio=RATIO, "
       "the final learning rate / optim.lr?)")):  # pass 22 (V18, V21)
    with pytest.raises(SystemExit):
      common.fail_unexpected("lev-x", args, fv)
    assert capsys.readouterr().err == (
        f"lev-x: error: unexpected arguments: {' '.join(args)} (flags start with --"
        + (f": {hint}" if hint else ")") + "\n")


def test_lev_eval_s_unknown_field_hint_names_no_field_it_refuses():
  """Newcomer pass 22 (N70, N72, V03): lev-eval --config.eval.steps was pointed at
  --config.train.steps, which lev-eval then refuses (an evaluation does not train)."""
  from lev_jax.cli import common
  from lev_jax.config import base_config
  argv = ["lev-x", "--config.eval.steps=4"]
  assert common.unknown_override(base_config(), argv).endswith(
      "(did you mean --config.train.steps?)")
  assert common.unknown_override(base_config(), argv, evaluation=True).endswith(
      "(config.eval's fields: batch_size, batches, downstream, downstream_limit, "
      "equal_mass_buckets, freq_bucket_edges)")


def test_an_override_given_to_a_command_without_a_config_names_what_it_means(capsys):
  """Newcomer pass 21 (M07, M09): lev-sample / lev-export --config.model.dtype=... was
  absl's bare "Unknown command line flag"."""
  from absl import flags
  from lev_jax.cli import common
  loader, ladder = flags.FlagValues(), flags.FlagValues()
  flags.DEFINE_string("checkpoint", None, "Run.", flag_values=loader)
  flags.DEFINE_string("dtype", None, "Dtype.", flag_values=loader)
  flags.DEFINE_multi_string("train_flags", None, "Flags.", flag_values=ladder)
  for fv, flag, said in (
      (loader, "--config.model.dtype=bfloat16", "its own flag is --dtype"),
      (loader, "--config.train.steps=3", "it uses the checkpoint's own config"),
      (ladder, "--config.train.steps=3",
       "pass it to the runs in --train_flags='--config.train.steps=...'")):
    with pytest.raises(SystemExit):
      common.flags_parser("lev-x", None, fv)(["lev-x", flag])
    assert capsys.readouterr().err == (
        f"lev-x: error: {flag.split('=')[0]}: this command takes no config overrides; "
        f"{said}\n")


def test_another_tools_name_for_a_flag_of_this_command_is_pointed_at_it(capsys):
  """Newcomer pass 14 (H06): lev-sample --max_tokens=4 (OpenAI / vLLM) was absl's bare
  "Unknown command line flag"; a command without the meant flag keeps absl's line."""
  from absl import flags
  from lev_jax.cli import common
  fv = flags.FlagValues()
  flags.DEFINE_integer("max_new_tokens", 64, "Most tokens.", flag_values=fv)
  with pytest.raises(SystemExit):
    common.flags_parser("lev-x", None, fv)(["lev-x", "--max_tokens=4"])
  assert capsys.readouterr().err.strip() == (
      "lev-x: error: unknown flag --max_tokens (did you mean --max_new_tokens?)")
  with pytest.raises(SystemExit):
    common.flags_parser("lev-x", None, fv)(["lev-x", "--ckpt=/x"])
  assert capsys.readouterr().err.strip() == "lev-x: error: Unknown command line flag 'ckpt'"
  # newcomer pass 18 (F10): HF generate's sampling switch
  flags.DEFINE_float("temperature", 0.0, "Temperature.", flag_values=fv)
  with pytest.raises(SystemExit):
    common.flags_parser("lev-x", None, fv)(["lev-x", "--do_sample"])
  assert capsys.readouterr().err.strip() == (
      "lev-x: error: unknown flag --do_sample: sampling is --temperature > 0; 0, the "
      "default, is greedy")
  with pytest.raises(SystemExit):  # newcomer pass 19 (A79)
    common.flags_parser("lev-x", None, fv)(["lev-x", "--greedy"])
  assert capsys.readouterr().err.strip() == (
      "lev-x: error: unknown flag --greedy: greedy decoding is --temperature=0, the default")


def test_a_launchers_flag_given_to_lev_ladder_points_at_launcher_flags(capsys):
  """Newcomer pass 14 (C13): lev-ladder --venv=... (launch/slurm.py's flag, which
  lev-ladder --help shows inside --launcher_flags) was absl's bare line."""
  from absl import flags
  from lev_jax.cli import common
  fv = flags.FlagValues()
  flags.DEFINE_string("launcher_flags", "", "Launcher flags.", flag_values=fv)
  with pytest.raises(SystemExit):
    common.flags_parser("lev-x", None, fv)(["lev-x", "--venv=/a/b"])
  assert capsys.readouterr().err.strip() == (
      "lev-x: error: unknown flag --venv: a launcher's flag; pass it in "
      "--launcher_flags=--venv=/a/b (with --launcher=slurm, tpu or local)")


def test_lev_sample_model_flag_points_at_checkpoint(capsys):
  """Newcomer pass 15 (G15): lev-sample --model=DIR (Hugging Face / vLLM) was absl's
  bare line while --model_path was pointed at --checkpoint."""
  from absl import flags
  from lev_jax.cli import common
  fv = flags.FlagValues()
  flags.DEFINE_string("checkpoint", None, "A run.", flag_values=fv)
  with pytest.raises(SystemExit):
    common.flags_parser("lev-x", None, fv)(["lev-x", "--model=/runs/a"])
  assert capsys.readouterr().err.strip() == (
      "lev-x: error: unknown flag --model (did you mean --checkpoint?)")
  # newcomer pass 17 (G63, G68): Hugging Face's --model_name_or_path
  with pytest.raises(SystemExit):
    common.flags_parser("lev-x", None, fv)(["lev-x", "--model_name_or_path=/runs/a"])
  assert capsys.readouterr().err.strip() == (
      "lev-x: error: unknown flag --model_name_or_path (did you mean --checkpoint?)")
