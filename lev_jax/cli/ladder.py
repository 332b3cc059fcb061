r"""`lev-ladder`: train a ladder of tied / Leviathan runs, then report scaling curves.

  lev-ladder --ladder=experiments/smoke_ladder.py --root=runs/smoke_ladder --run
  lev-ladder --ladder=experiments/smoke_ladder.py --root=runs/smoke_ladder   # report only
  lev-ladder --ladder=experiments/ladder.py --root=runs/ladder --run --launcher=print
  lev-ladder --ladder=experiments/ladder.py --root=/shared/runs/ladder --run \
      --launcher=slurm --launcher_flags="--nodes=4 --partition=gpu --time=24:00:00 \
      --venv=/shared/lev_jax/.venv" --train_flags="--config.data.prepared_dir=/shared/pile"

Each rung VARIANT of the ladder's RUNGS lives in ROOT/VARIANT. With --run, every rung
that is not finished is trained (resumed when it has a checkpoint), one after another:
  local   a subprocess `python -m lev_jax.cli.train --config=LADDER:VARIANT
          --workdir=ROOT/VARIANT [train_flags]` (lev-train); a rung that fails is reported
          and the next one runs
  print   prints those lev-train commands, one per line, and stops: nothing is trained
          or written (no report)
  tpu     `python launch/tpu.py [launcher_flags] --workdir=ROOT/VARIANT --
          --config=LADDER:VARIANT [train_flags]` per rung (it creates or reuses the TPU,
          runs, restarts after preemption; LADDER relative to the checkout it copies)
  slurm   `python launch/slurm.py [launcher_flags] --job_name=lev-VARIANT
          --workdir=ROOT/VARIANT -- --config=LADDER:VARIANT [train_flags]` per rung
          (writes and submits an sbatch script; re-run lev-ladder for the report later)
Ctrl-C / SIGTERM reach the rung training (it checkpoints); "unverified" rungs are skipped.
--train_flags are parsed as lev-train parses them, for every rung, before anything runs
or is written: a mistake there is one line (exit 2). They also say what each rung is
meant to be: a run trained with other settings (another train.steps, eval.batches,
data, ...) is reported as "other config" and left out of the analysis, so give the same
--train_flags when reporting a ladder trained with them. Put --dry-run in
--launcher_flags to have launch/ print its plan instead. Before any
rung is launched, the first rung's tpu / slurm command runs once with --dry-run: a
mistake in --launcher_flags is one line (exit 2), not one failed launch per rung; a
rung whose launch fails makes lev-ladder exit 1.

Then it reads every workdir (lev_jax/ladder/runs.py), analyses the ladder
(lev_jax/ladder/analysis.py: perplexity, token efficiency, power-law fit, effective
parameters, frequency buckets, downstream), writes the report (lev_jax/ladder/report.py)
into --report_dir (default ROOT/report; empty, or an earlier lev-ladder report) and
prints its path and one line per size. Missing or unfinished rungs are listed, never
invented.
Exit status: 0; 1 when a rung trained here failed; 2 for a bad flag or ladder file.
"""

from __future__ import annotations

import math
import re
import shlex
import signal
import shutil
import subprocess
import sys
from pathlib import Path

from absl import flags

from lev_jax.cli import common
from lev_jax.experiments import experiments_dir
from lev_jax.ladder.reporting import ratio_text
from lev_jax.workdir import LADDER_CSV, REPORT

PROG = "lev-ladder"
LAUNCHERS = ("local", "print", "tpu", "slurm")
REPO_ROOT = experiments_dir().parent


def _define_flags():
  common.define_path("ladder", None, "Ladder experiment file with RUNGS and get_config, "
                     "e.g. experiments/smoke_ladder.py.", what="a ladder experiment file")
  common.define_path("root", None, "Folder holding one workdir per rung (ROOT/VARIANT).",
                     what="the folder holding one workdir per rung")
  flags.DEFINE_boolean("run", False, "Train the rungs that are not finished before reporting.")
  flags.DEFINE_enum("launcher", "local", LAUNCHERS, "How --run trains: local subprocesses, "
                    "print the commands, or launch/tpu.py / launch/slurm.py per rung.")
  flags.DEFINE_string("launcher_flags", "", "Flags for launch/tpu.py or launch/slurm.py "
                      "(before its --), e.g. \"--name=lev --zone=us-east5-a "
                      "--accelerator_type=v5p-128\".")
  flags.DEFINE_string("train_flags", "", "Extra lev-train flags for every rung, e.g. "
                      "\"--config.data.prepared_dir=...\".")
  common.define_path("report_dir", None, f"Where the report goes (default ROOT/{REPORT}).",
                     what=f"the report's folder, or leave the flag out for ROOT/{REPORT}")
  flags.mark_flags_as_required(["ladder", "root"])


def workdir_of(root: str, variant: str) -> str:
  """ROOT/VARIANT, for local paths and gs:// URLs alike."""
  return str(root).rstrip("/") + "/" + variant


def _split(flag: str, value: str) -> list[str]:
  try:
    return shlex.split(value)
  except ValueError as e:
    raise ValueError(f"--{flag}={value!r}: {e} (quote as in a shell)") from e


def rung_commands(launcher: str, ladder: str, variants, root: str, *, train_flags=(),
                  launcher_flags=(), python: str = sys.executable,
                  prog: str = "lev-ladder") -> list[tuple[str, list[str]]]:
  """[(variant, argv)] that train each rung with `launcher` (see the module docstring);
  `prog` (lev-ladder, or lev-study for its runs) words the errors.

  Raises:
    ValueError: --workdir or --config in train_flags (lev-ladder sets them), --workdir in
      launcher_flags, or a tpu ladder file outside the checkout launch/tpu.py copies.
  """
  unit, name, file = (("run", "RUN", "STUDY") if prog == "lev-study"
                      else ("rung", "VARIANT", "LADDER"))
  for a in train_flags:
    for own in ("--workdir", "--config"):
      if a == own or a.startswith(own + "="):
        raise ValueError(f"--train_flags: {own} is set by {prog} for every {unit} "
                         f"({own}={f'ROOT/{name}' if own == '--workdir' else f'{file}:{name}'})")
  for a in launcher_flags:
    if a == "--workdir" or a.startswith("--workdir="):
      raise ValueError("--launcher_flags: --workdir is set by lev-ladder (ROOT/VARIANT)")
  path = Path(ladder).expanduser()
  if launcher == "tpu":  # the workers run in their copy of the checkout
    try:
      config_path = str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
      raise ValueError(f"--ladder={ladder}: launch/tpu.py copies {REPO_ROOT} to the "
                       "workers; put the ladder file inside it (e.g. experiments/)") from None
  elif launcher == "print":
    config_path = ladder
  else:
    config_path = str(path.resolve())
  out = []
  for v in variants:
    workdir = workdir_of(root, v)
    train = [f"--config={config_path}:{v}", *train_flags]
    if launcher == "local":
      argv = [python, "-m", "lev_jax.cli.train", train[0], f"--workdir={workdir}", *train[1:]]
    elif launcher == "print":
      argv = ["lev-train", train[0], f"--workdir={workdir}", *train[1:]]
    else:
      script = REPO_ROOT / "launch" / f"{launcher}.py"
      own = list(launcher_flags)
      if launcher == "slurm" and not any(a.startswith("--job_name") for a in own):
        own.append(f"--job_name=lev-{v}")
      argv = [python, str(script), *own, f"--workdir={workdir}", "--", *train]
    out.append((v, argv))
  return out


def train_config(config_file: str, variant: str, train_flags):
  """The config lev-train builds for the rung `variant` of `config_file` with
  `train_flags` (parsed as lev-train parses them, in a fresh flags.FlagValues).

  Raises:
    ValueError: `--train_flags: <lev-train's one line>` when lev-train would refuse them
      (an unknown or misspelt flag or config field, a value of the wrong type, a config
      that fails validation).
  """
  import contextlib  # pylint: disable=import-outside-toplevel
  import io  # pylint: disable=import-outside-toplevel
  from lev_jax.cli import train  # pylint: disable=import-outside-toplevel
  from lev_jax.config import ConfigError, validate  # pylint: disable=import-outside-toplevel
  argv = common.config_first(["lev-train", f"--config={config_file}:{variant}",
                              *train_flags])
  fv, err = flags.FlagValues(), io.StringIO()
  try:
    with contextlib.redirect_stderr(err):
      try:
        train._define_flags(fv, argv)  # pylint: disable=protected-access
      except Exception as e:  # an unknown --config.<field>: ml_collections raises here
        common._fail_on_config_error("lev-train", e, argv)  # pylint: disable=protected-access
      common.flags_parser("lev-train", None, fv)(argv)
      return validate(common.config_or_exit("lev-train", fv))
  except SystemExit:
    lines = err.getvalue().strip().splitlines() or ["rejected by lev-train"]
    raise ValueError("--train_flags: " + re.sub(r"^lev-train: error: ", "", lines[-1])) from None
  except ConfigError as e:
    raise ValueError(f"--train_flags: {e}") from None


def train_flags_error(config_file: str, variant: str, train_flags) -> str | None:
  """`--train_flags: <lev-train's one line>` when lev-train would refuse `train_flags`
  for the rung `variant` of `config_file` (`train_config`), instead of one failed run
  per rung; None when lev-train accepts them."""
  try:
    train_config(config_file, variant, train_flags)
  except ValueError as e:
    return str(e)
  return None


def expected_configs(config_file: str, variants, train_flags) -> dict:
  """{variant: the config lev-train trains it with under `train_flags`} for
  `runs.collect`'s `expected`; {} without train_flags (each rung's get_config).

  Raises:
    ValueError: as `train_config`.
  """
  if not train_flags:
    return {}
  return {v: train_config(config_file, v, train_flags) for v in variants}


# The command each launcher submits with (newcomer pass 19, B58: without sbatch on PATH
# the dry run passed, then every rung failed alike and an empty report was written).
_SUBMITS_WITH = {"slurm.py": "sbatch", "tpu.py": "gcloud"}


def check_launcher(commands, runner=subprocess.run, which=shutil.which) -> None:
  """Runs the first launch/tpu.py or launch/slurm.py command with --dry-run (no
  pre-flight, no --compile) before any rung is launched, so that a mistake in
  --launcher_flags is one line, not one failed launch per rung; then, unless
  --launcher_flags hold --dry-run, checks that the launcher's command (sbatch, gcloud)
  is on PATH.

  Raises:
    ValueError: `--launcher_flags: <the launcher's own error>` when that dry run fails;
      `--launcher=slurm: sbatch not found on PATH ...` when the command is missing.
  """
  if not commands:
    return
  argv = list(commands[0][1])
  end = argv.index("--")
  own = [a for a in argv[2:end] if a != "--compile"]
  tool = _SUBMITS_WITH.get(Path(argv[1]).name)
  if tool and "--dry-run" not in own and which(tool) is None:
    raise ValueError(f"--launcher={Path(argv[1]).stem}: {tool} not found on PATH: run "
                     f"lev-ladder where {tool} works (a login node), or put --dry-run in "
                     "--launcher_flags to print each rung's job")
  check = [*argv[:2], *own, "--dry-run", "--no-preflight", *argv[end:]]
  proc = runner(check, capture_output=True, text=True, stdin=subprocess.DEVNULL)
  if proc.returncode == 0:
    return
  lines = [l.strip() for l in proc.stderr.splitlines() if l.strip()]
  last = lines[-1] if lines else f"exit status {proc.returncode}"
  last = re.sub(r"^\S+\.py: error: ", "", last)
  raise ValueError(f"--launcher_flags: {last} (checked with {Path(argv[1]).name} "
                   "--dry-run before any rung was launched)")


# The rung whose command a Ctrl-C or SIGTERM stopped, and that command's exit status:
# set by `train_rungs` for the line `stopped_line` prints.
STOPPED: dict = {}


def _exit_status(returncode: int) -> int:
  return 128 - returncode if returncode < 0 else returncode  # -15 (SIGTERM) -> 143


def call_forwarding(argv, env=None) -> int:
  """subprocess.call(argv, env=env), forwarding a Ctrl-C or SIGTERM to the child.

  The child runs in its own session, so that only this forward reaches it (a terminal's
  Ctrl-C reaches this process alone): KeyboardInterrupt sends it SIGINT, a SIGTERM
  (`interrupt.Terminated`, see `interrupt.terminate_as_interrupt`) SIGTERM; lev-train
  then saves a checkpoint and exits (130 or 143). This waits for it, as long as it
  takes (a second signal is forwarded too), then raises the interrupt again with the
  child's exit status as its `child_status`, so that the command ends as interrupted
  with no child left running (newcomer pass 9: SIGTERM to lev-ladder --run left
  lev-train training, orphaned).
  """
  from lev_jax.cli import interrupt  # pylint: disable=import-outside-toplevel
  proc = subprocess.Popen(argv, env=env, start_new_session=True)
  try:
    return proc.wait()
  except KeyboardInterrupt as e:
    stop = signal.SIGTERM if isinstance(e, interrupt.Terminated) else signal.SIGINT
    while True:
      if proc.poll() is None:
        proc.send_signal(stop)
      try:
        proc.wait()
        break
      except KeyboardInterrupt:
        continue  # another signal: forwarded again
    e.child_status = _exit_status(proc.returncode)
    raise


def stopped_line(cause: str, member: str = "rung", what: str = "unfinished rungs") -> str:
  """`common.run`'s line after a Ctrl-C or SIGTERM: which rung (or run) was stopped and
  that re-running resumes it (`STOPPED`), else that re-running resumes the `what`."""
  if not STOPPED:
    return f"{cause}; re-run the same command to resume the {what}"
  status = STOPPED.get("status")
  how = "" if status is None else f" (it exited with status {status})"
  return (f"{cause}: stopped {member} {STOPPED['variant']}{how}; re-run the same command "
          f"to resume it and the {what}")


def train_rungs(commands, launcher: str, runner=call_forwarding, out=sys.stdout,
                prog: str = PROG) -> dict:
  """Runs (or prints) each command in turn; returns {variant: exit status} of those that
  failed. A failure does not stop the next rung. `prog` heads the progress lines. A
  Ctrl-C or SIGTERM while one runs (`call_forwarding` stops it) is raised again, after
  `STOPPED` records the rung and its exit status."""
  failed = {}
  for variant, argv in commands:
    line = shlex.join(argv)
    if launcher == "print":
      print(line, file=out, flush=True)
      continue
    print(f"{prog}: {variant}: {line}", file=out, flush=True)
    try:
      status = runner(argv)
    except KeyboardInterrupt as e:
      STOPPED.update(variant=variant, status=getattr(e, "child_status", None))
      raise
    if status:
      print(f"{prog}: {variant}: exited with status {status}; continuing with the next one",
            file=out, flush=True)
      failed[variant] = status
  return failed


def trainable(result) -> list[str]:
  """The variants --run trains: every rung not finished, except an "unverified" one (its
  outputs are there without checkpoints/: lev-train refuses such a folder, and its
  reason says to move it aside) and an "other config" one (`check_runnable`)."""
  return [r.variant for r in result.rungs
          if not r.finished and r.status not in ("unverified", "other config")]


def check_runnable(result, command: str = "lev-ladder", flag: str = "--run") -> None:
  """Refuses --run when a rung's folder holds a finished run of other settings than the
  rung's (status "other config"; with --train_flags that differ from the ones it was
  trained with, every rung): lev-train would refuse each, and the report would be
  rewritten without them (newcomer pass 13: a finished ladder's report replaced by a
  "0 of 4" one).

  Also a report-only command given --train_flags (`flag`): with flags that contradict
  the finished rungs, its report would replace theirs with one leaving them out
  (newcomer pass 14).

  Raises:
    ValueError: naming the first such rung and its differing fields; nothing was run or
      written.
  """
  other = [r for r in result.rungs if r.status == "other config"]
  if other:
    more = f" (and {len(other) - 1} more)" if len(other) > 1 else ""
    tail = (f"without --run, {command} only reports" if flag == "--run" else
            f"without --train_flags, {command} reports the "
            f"{'runs' if command == 'lev-study' else 'rungs'} as they were trained")
    raise ValueError(f"{flag}: {other[0].reason}{more}. Nothing was run or written "
                     f"({tail})")


def summary(analysis: dict, paths: dict) -> str:
  """What the command prints after the report: its path and one line per size."""
  done = sum(r["status"] == "finished" for r in analysis["rungs"])
  lines = [f"{PROG}: {done} of {len(analysis['rungs'])} rungs finished; report "
           f"{paths['report']}"]
  lines.append(f"  {'size':<8} {'ppl tied -> leviathan (change)':<34} {'token eff.':<11} "
               "n_eff / N")
  for p in analysis["pairs"]:
    if p["ppl_change"] is None:
      lines.append(f"  {p['size']:<8} n/a ({p['reason']})")
      continue
    ppl = (f"{p['tied_ppl']:.2f} -> {p['leviathan_ppl']:.2f} "
           f"({100 * p['ppl_change']:+.1f} %)")
    eff = p["efficiency"]["ratio"]
    e = p["effective"]
    # n/a as in the report: no estimate, or an infinite one (a loss at or below the
    # fitted floor: no finite N reaches it)
    known = bool(e and e["n_eff"] is not None and math.isfinite(e["n_eff"]))
    n_eff = ratio_text(e["ratio"]) if known else "n/a"
    if known and e["ratio_lo"] is not None and not e.get("warning"):
      # an interval that misses its estimate says nothing
      n_eff += f" ({ratio_text(e['ratio_lo'])} - {ratio_text(e['ratio_hi'])})"
    eff_text = ratio_text(eff) if eff is not None else "not reached"
    lines.append(f"  {p['size']:<8} {ppl:<34} {eff_text:<11} {n_eff}")
  fit = analysis["fit"]
  if fit["ok"]:
    se = fit["stderr"]
    lines.append(f"  fit over {fit['n_points']} tied rungs: E = {fit['E']:.3f} ± {se['E']:.3g}, "
                 f"A = {fit['A']:.3g}, alpha = {fit['alpha']:.3f} ± {se['alpha']:.3g}")
    if fit.get("warnings"):
      lines.append(f"  warning: {'; '.join(fit['warnings'])}")
  else:
    lines.append(f"  no power-law fit: {fit['reason']}")
  for m in analysis["missing"]:
    lines.append(f"  missing {m['variant']}: {m['reason']}")
  return "\n".join(lines)


def load_inputs(ladder: str, root: str, *, run: bool, report_dir: str | None):
  """The ladder module, once the flags naming files are checked, the ladder file first
  (a missing ladder is the error to name, whatever --root is), then --root, then
  --report_dir. Nothing is created: `main` creates --root once every check has passed.

  Raises:
    LadderError: the ladder file is missing or not a ladder (runs.load_ladder).
    ValueError: a remote --root without a local --report_dir; a --root that is a file;
      without --run, a missing --root; a --root that is a training run's folder or an export, or
      inside one (`common.run_folder_error`); with --run, a --root that cannot be
      written (`common.folder_output_error`); a --report_dir that is a file or cannot
      be created (`common.folder_output_error`) or holds a lev-study report
      (`common.report_owner_error`).
  """
  from lev_jax.ladder import runs as ladder_lib  # pylint: disable=import-outside-toplevel
  module = ladder_lib.load_ladder(ladder)
  if "://" in root and not report_dir:
    raise ValueError(f"--root={root} is remote: give a local --report_dir for the report")
  if "://" not in root and Path(root).exists() and not Path(root).is_dir():
    raise ValueError(f"--root={root}: is a file; expected a folder (one workdir per rung)")
  dangling = common.dangling_link_error("--root", root)
  if dangling:
    raise ValueError(dangling)
  if not run and "://" not in root and not Path(root).is_dir():
    raise ValueError(f"--root={root}: no such folder (add --run to train the rungs there)")
  report = report_dir or str(Path(root) / REPORT)
  problem = (common.run_folder_error("--root", root)  # a run's own folder: not a root
             or (run and common.folder_output_error("--root", root))  # --root first
             or common.folder_output_error("--report_dir", report)  # before hours of work
             or common.report_owner_error("--report_dir", report, LADDER_CSV,
                                              source=str(ladder)))
  if problem:
    raise ValueError(problem)
  return module


def main(argv):
  if len(argv) > 1:
    common.fail_unexpected(PROG, argv[1:])
  common.quiet_library_logs()
  from lev_jax.cli import interrupt  # pylint: disable=import-outside-toplevel
  interrupt.terminate_as_interrupt()  # SIGTERM: the rung in training is stopped first
  # after flags: keeps --help fast
  from lev_jax.ladder import analysis as ladder_analysis, report, runs as ladder_lib
  f = flags.FLAGS
  try:
    module = load_inputs(f.ladder, f.root, run=f.run, report_dir=f.report_dir)
  except (ladder_lib.LadderError, ValueError) as e:
    common.fail(PROG, str(e))
  report_dir = f.report_dir or str(Path(f.root) / REPORT)
  try:
    train_flags = _split("train_flags", f.train_flags)
    rung_commands("local", f.ladder, [], f.root, train_flags=train_flags)  # --workdir
    ladder_file = str(Path(f.ladder).expanduser().resolve())
    expected = expected_configs(ladder_file, module.RUNGS, train_flags)
    result = ladder_lib.collect(module, f.root, expected)
    result.ladder = f.ladder
    launcher_flags = _split("launcher_flags", f.launcher_flags)
    if f["launcher"].present and not f.run:  # newcomer pass 13: ignored, report written
      raise ValueError(f"--launcher={f.launcher} acts only with --run (how the unfinished "
                       "rungs are trained; --launcher=print prints their commands); "
                       "without --run lev-ladder writes the report alone")
    if launcher_flags and f.launcher not in ("tpu", "slurm"):
      raise ValueError(f"--launcher_flags is for --launcher=tpu or slurm, not {f.launcher}")
    if f.run or train_flags:
      check_runnable(result, flag="--run" if f.run else "--train_flags")
    todo = trainable(result)
    commands = rung_commands(f.launcher, f.ladder, todo, f.root, train_flags=train_flags,
                             launcher_flags=launcher_flags) if f.run else []
    if f.launcher in ("tpu", "slurm"):
      check_launcher(commands)
  except (ladder_lib.LadderError, ValueError) as e:
    common.fail(PROG, str(e))
  failed = {}
  if f.run and f.launcher == "print":  # the plan only: nothing is trained or written
    train_rungs(commands, f.launcher)
    print(f"{PROG}: --launcher=print: {len(commands)} of {len(result.rungs)} rungs would be "
          f"trained (the commands above); nothing written", file=sys.stderr)
    return
  if f.run:  # every check passed: only now is --root created (every rung writes under it)
    problem = common.created_folder_error("--root", f.root)
    if problem:
      common.fail(PROG, problem)
    if not todo:
      print(f"{PROG}: every rung of {f.ladder} is finished under {f.root}; nothing to train")
    try:
      failed = train_rungs(commands, f.launcher)
    except OSError as e:
      common.fail(PROG, f"cannot start {commands[0][1][0]}: {e.strerror}")
    result = ladder_lib.collect(module, f.root, expected)
    result.ladder = f.ladder
  for variant, status in failed.items():
    rung = result.rung(variant)
    if rung is not None and not rung.finished:
      rung.reason = f"{rung.reason}; {f.launcher} run exited with status {status}"
  analysis = ladder_analysis.analyse(result)
  command = shlex.join([PROG, *sys.argv[1:]])
  try:  # the report folder was checked at the start; a run may have changed it since
    paths = report.write_report(analysis, report_dir, command=command)
  except ValueError as e:
    common.fail(PROG, str(e))
  print(summary(analysis, paths))
  if failed:
    sys.exit(1)


def run():
  _define_flags()
  common.run(PROG, main, __name__, interrupted=stopped_line)


if __name__ == "__main__":
  run()
