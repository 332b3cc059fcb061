r"""`lev-study`: train a seeded study of tied / Leviathan / untied cells, evaluate every run
on the validation and test splits, and report means, standard errors and paired
intervals.

  lev-study --study=experiments/fidelity_study.py --root=runs/study --run
  lev-study --study=experiments/fidelity_study.py --root=runs/study          # report only
  python -m lev_jax.cli.study --study=... --root=...                          # same, no install
  lev-study --study=experiments/scale_study.py:foldoc --root=runs/scale --run  # one piece

The study file is a ladder file (RUNGS: one name per run, get_config(run)) whose runs
differ only in the factors of lev_jax/ladder/study.py (variant, vocab, backbone size,
corpus, seed, options: LEV optimiser options and issue 25's ablations); anything else
(steps, batch, seq_len, data pipeline, LEV's d_seed or heads) is refused before a run
starts, with the differing fields named
(exit status 2). `--study=FILE:PIECE` runs and reports only the runs of the file's
PIECES[PIECE] (report in ROOT/report_PIECE); the same ROOT holds every piece, so the
whole study's report (`--study=FILE`) reads them all.

With --run, every run that is not finished trains in turn as its own subprocess
`python -m lev_jax.cli.train --config=STUDY:RUN --workdir=ROOT/RUN [train_flags]` (lev-train;
a run with a checkpoint resumes, a finished one is skipped; a failure is reported and the
next run goes on). The subprocesses share a persistent XLA compilation cache
(ROOT/jax_cache, JAX_COMPILATION_CACHE_DIR), so the seeds of a cell compile once.
Then each finished run without a current ROOT/RUN/study_eval.json is evaluated in this
process on the validation and test splits (lev_jax.ladder.study.evaluate_run; eval.batches from
--eval_batches, else the study file's FINAL_EVAL_BATCHES, else the run's own), and the
report (lev_jax/ladder/study_report.py) goes to --report_dir (default ROOT/report).
Re-running the same command resumes; Ctrl-C or SIGTERM is forwarded to the run in
training, which saves a checkpoint and exits; lev-study waits for it and ends (130 or
143) naming the run stopped. A current study_eval.json whose figures disagree
(lev_jax.ladder.study.study_eval_problem: edited), or that records another run or
checkpoint (study_eval_owner_problem: its "run" and the sha256 of the evaluated step's
checksums.json; copied from another run's folder), makes its run "unreadable", never
summarised. Exit status: 0; 1 when a run failed to train or evaluate; 2 for a bad
flag or study file.
"""

from __future__ import annotations

import collections
import os
import shlex
import sys
from pathlib import Path

from absl import flags

from lev_jax.cli import common
from lev_jax.workdir import JAX_CACHE, REPORT, STUDY_CSV

PROG = "lev-study"


def _define_flags(fv: flags.FlagValues = flags.FLAGS):
  """Defines lev-study's flags in `fv` (tests pass a fresh one)."""
  common.define_path("study", None, "Study file (RUNGS + get_config), e.g. "
                     "experiments/fidelity_study.py, or FILE:PIECE for the runs of its "
                     "PIECES[PIECE].", what="a study file", fv=fv)
  common.define_path("root", None, "Folder holding one workdir per run (ROOT/RUN).",
                     what="the folder holding one workdir per run", fv=fv)
  flags.DEFINE_boolean("run", False, "Train the runs that are not finished first.",
                       flag_values=fv)
  flags.DEFINE_string("train_flags", "", "Extra lev-train flags for every run (the same "
                      "for all, e.g. \"--config.data.cache_dir=/tmp/c\").", flag_values=fv)
  flags.DEFINE_integer("eval_batches", 0, "eval.batches of the validation / test "
                       "evaluation (0: the study's FINAL_EVAL_BATCHES, else each run's).",
                       lower_bound=0, flag_values=fv)
  common.define_path("report_dir", None, f"Where the report goes (default ROOT/{REPORT}; "
                     f"ROOT/{REPORT}_PIECE for FILE:PIECE).",
                     what=f"the report's folder, or leave the flag out for ROOT/{REPORT}",
                     fv=fv)
  flags.mark_flags_as_required(["study", "root"], flag_values=fv)


def load_study(study) -> tuple[object, dict]:
  """(the study module, {run: config}) after every check that needs no training.

  Raises:
    runs.LadderError: a broken study file, or a get_config that fails or returns no
      full ConfigDict (runs.checked_config); config.ConfigError: a run's invalid config
      (the run named); study.StudyError: runs that differ in a non-factor field.
  """
  from lev_jax.ladder import runs, study as study_lib
  from lev_jax.config import ConfigError, validate
  module = study_lib.load_study_module(study)
  configs = {}
  for run in module.RUNGS:
    # a ConfigDict with every section (newcomer pass 9: "is a int" from validate)
    config = runs.checked_config(module, run, where=study)
    try:
      configs[run] = validate(config)
    except ConfigError as e:
      raise ConfigError(f"{study}:{run}: {e}") from e
    except Exception as e:  # the study file's own error
      raise runs.LadderError(f"{study}: get_config({run!r}) failed: "
                               f"{type(e).__name__}: {e}") from e
  study_lib.check_factors(configs)
  _check_not_a_ladder(study, module.RUNGS, study_lib.cells_of(configs))
  return module, configs


def _check_not_a_ladder(study, names, cells: dict) -> None:
  """Refuses a ladder file given as a study (newcomer pass 14, H02: each rung was
  evaluated as a study run, every cell n = 1): every name a ladder rung's (tied_SIZE
  with its leviathan_SIZE), at more than one size, one run per cell (no seeds).

  Raises:
    runs.LadderError: naming lev-ladder."""
  from lev_jax.ladder import runs
  if len(names) < 2 or any(runs.variant_name_problem(n) for n in names):
    return
  if any(runs.partner_of(n) not in names for n in names):
    return
  per_cell = collections.Counter(f.cell for f in cells.values())
  sizes = {f.size for f in cells.values()}
  if len(sizes) > 1 and max(per_cell.values()) == 1:
    raise runs.LadderError(
        f"--study={study}: its runs are a ladder's rungs (tied_SIZE and leviathan_SIZE at "
        f"{len(sizes)} sizes, one run each: no seeds to average); a ladder file? use "
        f"lev-ladder --ladder={study}")


def _runner_with_cache(cache_dir: str):
  """lev-ladder's call_forwarding (a Ctrl-C or SIGTERM stops the run in training
  first) with a persistent XLA compilation cache shared by the runs."""
  from lev_jax.cli.ladder import call_forwarding
  env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=cache_dir)
  return lambda argv: call_forwarding(argv, env=env)


def evaluate_finished(result, *, eval_batches: int | None, evaluate=None,
                      out=None) -> tuple[dict, dict]:
  """({run: study_eval.json}, {run: error}) for every finished run; a run whose file is
  current (same step and eval.batches) is read, the others are evaluated. A current
  file whose figures disagree (`study.study_eval_problem`: edited), or that records
  another run or checkpoint than this run's (`study.study_eval_owner_problem`: copied
  from another run's folder), makes its run "unreadable" with the reason, neither
  evaluated again nor summarised."""
  from lev_jax.ladder import study as study_lib
  from lev_jax.workdir import STUDY_EVAL_JSON
  out = out or sys.stdout  # at call time (a redirected sys.stdout included)
  on_device = evaluate is None  # in this process: jax's backends must start
  evaluate = evaluate or study_lib.evaluate_run
  evals, errors = {}, {}
  for rung in result.rungs:
    if not rung.finished:
      continue
    try:
      ev = study_lib.read_eval(rung.workdir)
    except study_lib.runs.LadderError as e:
      rung.status, rung.reason = "unreadable", str(e)
      continue
    found = isinstance(ev, dict)
    wanted = eval_batches or found and ev.get("eval_batches")
    current = found and ev.get("step") == rung.steps and ev.get("eval_batches") == wanted
    if current or (ev is not None and not found):  # one that is not an object: edited
      problem = study_lib.study_eval_problem(ev, rung.steps)
      if problem:  # newcomer pass 9: loss and perplexity edited to agree were reported
        path = Path(rung.workdir) / STUDY_EVAL_JSON
        rung.status, rung.reason = "unreadable", (
            f"{path}: {problem}: the file was edited; expected lev-study's own evaluation "
            "(delete it and re-run lev-study to evaluate again)")
        continue
      problem = study_lib.study_eval_owner_problem(ev, rung.workdir)
      if problem:  # newcomer pass 13 (N182): another run's file, one seed counted twice
        path = Path(rung.workdir) / STUDY_EVAL_JSON
        rung.status, rung.reason = "unreadable", (
            f"{path}: {problem}; expected lev-study's own evaluation of this run's "
            "checkpoint (delete it and re-run lev-study to evaluate again)")
        continue
      if found and "run" not in ev:  # newcomer pass 14 (S05): read as before, but said
        print(f"{PROG}: {rung.variant}: {Path(rung.workdir) / STUDY_EVAL_JSON} records no "
              "run (written before lev-study recorded which checkpoint it evaluated): read "
              "unchecked; delete it to evaluate again", file=out, flush=True)
    if not current:
      if on_device:  # JAX_PLATFORMS naming a backend this machine lacks: one line
        common.backend_or_exit(PROG)
      replaced = (f" (replacing its {STUDY_EVAL_JSON} of step {ev.get('step')}, "
                  f"eval_batches {ev.get('eval_batches')})" if found else "")
      print(f"{PROG}: {rung.variant}: evaluating validation and test{replaced}", file=out,
            flush=True)  # newcomer pass 13: another --eval_batches replaced it unsaid
      try:
        if not os.access(rung.workdir, os.W_OK):  # newcomer pass 16 (O10): read-only
          raise OSError(f"{Path(rung.workdir)}: cannot write in it (a read-only "
                        f"filesystem?); lev-study stores each run's evaluation there "
                        f"({STUDY_EVAL_JSON}): copy the study root to a writable place")
        ev = evaluate(rung.workdir, eval_batches=eval_batches)
      except OSError as e:  # the result's write failed (O10: a traceback after evaluating)
        errors[rung.variant] = (common.first_line(e) if not e.filename else
                                f"{e.filename}: cannot be written ({e.strerror}); lev-study "
                                "stores each run's evaluation in the run's folder: copy "
                                "the study root to a writable place")
        print(f"{PROG}: {rung.variant}: evaluation failed: {errors[rung.variant]}",
              file=out, flush=True)
        continue
      except ValueError as e:  # InferenceError, ConfigError, DataError
        errors[rung.variant] = common.first_line(e)
        print(f"{PROG}: {rung.variant}: evaluation failed: {errors[rung.variant]}",
              file=out, flush=True)
        continue
    evals[rung.variant] = ev
  return evals, errors


def run_study(study, root, *, run: bool = False, train_flags=(), eval_batches=None,
              report_dir=None, command=None, runner=None, evaluate=None,
              out=None, loaded=None) -> tuple[dict, dict, dict]:
  """Checks, trains (with run), evaluates and reports a study.

  Args:
    study: the study file's path; root: ROOT (local).
    runner: argv -> exit status for each lev-train command (default: a subprocess with
      the shared compilation cache); evaluate: workdir -> study_eval.json (default
      lev_jax.ladder.study.evaluate_run).
    loaded: `load_study(study)`'s result when the caller has checked it already (main,
      before ROOT is created); loaded here when None.

  Returns:
    (the analysis, the report's paths, {run: why it failed} for runs that failed to
    train or evaluate here).

  Raises:
    runs.LadderError, ConfigError, StudyError: before anything runs (see load_study).
    ValueError: a file of the report folder is there as a folder (before the report
      is written); with run, a run's folder holding a finished run of other settings
      (ladder.check_runnable), before anything runs.
  """
  from lev_jax.ladder import runs, study as study_lib, study_report
  from lev_jax.cli import ladder as ladder_cli
  out = out or sys.stdout  # at call time (a redirected sys.stdout included)
  module, configs = loaded or load_study(study)
  if eval_batches is None:
    eval_batches = getattr(module, "FINAL_EVAL_BATCHES", None)
  expected = ladder_cli.expected_configs(
      str(Path(study_lib.split_spec(study)[0]).expanduser().resolve()), module.RUNGS,
      train_flags)
  if expected:  # newcomer pass 15 (S20): --train_flags="--config.seed=0" made every
    try:        # seed of a cell the same run, reported as n = 2 with an interval
      study_lib.check_factors(expected)
    except study_lib.StudyError as e:
      raise study_lib.StudyError(f"--train_flags={shlex.join(train_flags)}: {e}") from None
  result = runs.collect(module, root, expected, owner="study")
  failed = {}
  if run or train_flags:
    ladder_cli.check_runnable(result, PROG, "--run" if run else "--train_flags")
  if run:
    todo = ladder_cli.trainable(result)
    if not todo:
      print(f"{PROG}: every run of {study} is finished under {root}; nothing to train",
            file=out)
    commands = ladder_cli.rung_commands("local", study_lib.split_spec(study)[0], todo, root,
                                        train_flags=train_flags)
    runner = runner or _runner_with_cache(str(Path(root).absolute() / JAX_CACHE))
    failed = {v: f"lev-train exited with status {s}" for v, s in
              ladder_cli.train_rungs(commands, "local", runner=runner, out=out,
                                     prog=PROG).items()}
    result = runs.collect(module, root, expected, owner="study")
  result.ladder = str(study)
  evals, errors = evaluate_finished(result, eval_batches=eval_batches, evaluate=evaluate,
                                    out=out)
  failed.update({run_name: f"evaluation failed: {e}" for run_name, e in errors.items()})
  factors = study_lib.cells_of(configs)
  analysis = study_lib.analyse(result, factors, evals)
  for m in analysis["missing"]:
    if m["run"] in failed:
      m["reason"] = f"{m['reason']}; {failed[m['run']]}"
  paths = study_report.write_report(analysis, report_dir or default_report_dir(root, study),
                                    command=command)
  return analysis, paths, failed


def default_report_dir(root, study) -> Path:
  """ROOT/report for a whole study, ROOT/report_PIECE for one piece (FILE:PIECE)."""
  from lev_jax.ladder.study import split_spec
  piece = split_spec(study)[1]
  return Path(root) / (REPORT if piece is None else f"{REPORT}_{piece}")


def summary(analysis: dict, paths: dict) -> str:
  """What the command prints: the report's path and the final (test) table."""
  from lev_jax.ladder.study_report import interval, pm, slope_text
  done = sum(r["status"] == "finished" and r["evaluated"] for r in analysis["runs"])
  comps = {c["label"]: c for c in analysis["comparisons"]}
  cells = {c["label"]: c for c in analysis["cells"]}
  lines = [f"{PROG}: {done} of {len(analysis['runs'])} runs finished and evaluated; "
           f"report {paths['report']}",
           f"  {'cell (test split)':<44} {'ppl mean ± se (n)':<24} change vs tied [95 % CI]"]
  for label in analysis["final"]:
    comp = comps.get(label)
    change = ("baseline" if comp is None else interval(comp["perplexity"].get("test"))
              if not comp["reason"] else f"n/a ({comp['reason']})")
    lines.append(f"  {label:<44} {pm(cells[label]['test']['perplexity']):<24} {change}")
  for s in analysis["selection"]:
    lines.append(f"  selected on validation at vocab {s['vocab']}: "
                 f"{s['selected'] or 'none (' + str(s['reason']) + ')'}")
  for t in analysis.get("trend", []):
    fit = t["fit"]["test"]
    lines.append(f"  trend {t['corpus']}, vocab {t['vocab']}: {t['variant']}"
                 + ("" if t["options"] == "default" else f" [{t['options']}]")
                 + f" vs {t['baseline']}: {slope_text(fit)} (test)")
  for m in analysis["missing"]:
    lines.append(f"  missing {m['run']}: {m['reason']}")
  return "\n".join(lines)


def folders_error(root: str, *, run: bool, report_dir: str | None,
                  study: str = "") -> str | None:
  """The one line, before any run trains, when the local --root or --report_dir cannot
  be used, --root's checked first: a file, a missing root without --run, a training
  run's folder or an export, or inside one (`common.run_folder_error`), with --run a
  root that cannot be written (`common.folder_output_error`); then a report folder that
  cannot be written or holds a lev-ladder report (`common.report_owner_error`); last,
  with --run, a root that cannot be created (it is created then). The default report
  folder is `default_report_dir(root, study)`. None when both can be used."""
  path = Path(root)
  if path.exists() and not path.is_dir():
    return f"--root={root}: is a file; expected a folder (one workdir per run)"
  dangling = common.dangling_link_error("--root", root)
  if dangling:
    return dangling
  if not run and not path.is_dir():
    return f"--root={root}: no such folder (add --run to train the runs there)"
  report = report_dir or str(default_report_dir(path, study))
  problem = (common.run_folder_error("--root", root)  # a run's own folder: not a root
             or (run and common.folder_output_error("--root", root))  # --root first
             or common.folder_output_error("--report_dir", report)  # before the runs
             or common.report_owner_error("--report_dir", report, STUDY_CSV,
                                              source=str(study)))
  if problem and not report_dir and problem.startswith(f"--report_dir={report}: "):
    # newcomer pass 7: the flag the user never gave was named; the folder is --root's
    problem = f"--root={root}: its default report folder {problem[len('--report_dir='):]}"
  if not problem and run:  # last: nothing is created for a refused command
    problem = common.created_folder_error("--root", root)  # every run writes there
  return problem


def main(argv):
  if len(argv) > 1:
    common.fail_unexpected(PROG, argv[1:])
  common.quiet_library_logs()
  from lev_jax.cli import interrupt
  interrupt.terminate_as_interrupt()  # SIGTERM: the run in training is stopped first
  from lev_jax.ladder import runs
  from lev_jax.cli import ladder as ladder_cli
  from lev_jax.config import ConfigError
  from lev_jax.ladder.study import StudyError
  f = flags.FLAGS
  if "://" in f.root:
    common.fail(PROG, f"--root={f.root}: lev-study trains and evaluates locally; give a "
                   "local folder")
  from lev_jax.ladder.study import split_spec
  try:  # once, before anything (ROOT) is created: not one failed lev-train per run
    loaded = load_study(f.study)  # the file, its piece, every run's config
    train_flags = ladder_cli._split("train_flags", f.train_flags)
    if f.run and train_flags:
      ladder_cli.rung_commands("local", f.study, [], f.root, train_flags=train_flags,
                               prog=PROG)
      problem = ladder_cli.train_flags_error(
          str(Path(split_spec(f.study)[0]).expanduser().resolve()), loaded[0].RUNGS[0],
          train_flags)
      if problem:
        common.fail(PROG, problem)
  except (runs.LadderError, ConfigError, StudyError, ValueError) as e:
    common.fail(PROG, str(e))
  problem = folders_error(f.root, run=f.run, report_dir=f.report_dir, study=f.study)
  if problem:
    common.fail(PROG, problem)
  try:
    analysis, paths, failed = run_study(
        f.study, f.root, run=f.run, train_flags=train_flags,
        eval_batches=f.eval_batches or None, report_dir=f.report_dir,
        command=shlex.join([PROG, *sys.argv[1:]]), loaded=loaded)
  except (runs.LadderError, ConfigError, StudyError, ValueError) as e:
    common.fail(PROG, str(e))
  print(summary(analysis, paths))
  if failed:
    sys.exit(1)


def run():
  from lev_jax.cli.ladder import stopped_line
  _define_flags()
  common.run(PROG, main, __name__,
             interrupted=lambda cause: stopped_line(cause, "run", "unfinished runs"))


if __name__ == "__main__":
  run()
