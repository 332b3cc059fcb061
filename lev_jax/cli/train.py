"""`lev-train`: train a Leviathan or tied model from one command.

  lev-train                                   # default: smoke Leviathan on embedded data
  lev-train --config=experiments/smoke.py:tied --workdir=runs/tied --config.train.steps=50

Flags follow ml_collections.config_flags: any field can be overridden with
--config.<section>.<field>=value. Without --workdir the run goes to ./runs/<config.name>
(an empty --workdir= is an error, not that default).
Re-running the same command on the same workdir resumes from its latest checkpoint. On
a finished run it prints one line and exits 0, writing nothing (not even the lock); a
config that differs from the finished run's in a field that decides results is refused
naming the fields (lev_jax.trainer.finished_run).
SIGTERM (preemption) and Ctrl-C save a checkpoint of the step reached and exit 143 and
130; a Ctrl-C after either aborts at once, keeping the checkpoints already complete, with
the first signal's status (143 after SIGTERM, 130 after Ctrl-C); every Ctrl-C counts,
also two that arrive within one compiled step (lev_jax.trainer._StopSignals).

One run per workdir: the run holds WORKDIR/.lock (lev_jax.lock; process 0 of a
multi-host run), and a second lev-train on it stops at once naming the holder. A lock
left by a killed run is taken over; --force_unlock removes one recorded by a run on
another host that is gone (a network filesystem can keep its lock); on a filesystem
without flock (some GPFS / NFS mounts) the run is refused before anything is written,
and --nolock runs without the lock (the user makes sure no other run uses the workdir;
a lock a live process holds, where flock works, is still refused).

`--preflight=PLATFORM:PROCESSESxDEVICES` (e.g. gpu:4x8: 4 nodes of 8 GPUs) checks the
flags, the config and its mesh, parameter splits and batches for such a job, prints one
line and exits 0 (2 with the one-line error), without touching a device or writing
anything: launch/slurm.py and launch/tpu.py run it on the user's machine before they
submit.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys

from absl import flags, logging
from etils import epath
from ml_collections import config_flags

# Only modules without jax at the top: --help and a bad flag, config or workdir answer
# before jax, Orbax and grain are imported (~2 s of CPU); main imports them after its checks.
from lev_jax import distributed
from lev_jax import lock as workdir_lock
from lev_jax.cli import common, interrupt
from lev_jax.config import ConfigError, validate
from lev_jax.experiments import experiments_dir
from lev_jax.workdir import CHECKPOINTS, EVAL_JSON, LOCK, OutputWriteError, default_workdir

# 128 + SIGTERM: the shell's status for a process ended by SIGTERM; schedulers read it
# as "did not finish" and can requeue the job, which then resumes. Ctrl-C (SIGINT) after
# its checkpoint: 128 + SIGINT, common.INTERRUPTED_EXIT.
PREEMPTED_EXIT = 143
STOPPED_EXIT = {"SIGTERM": PREEMPTED_EXIT, "SIGINT": common.INTERRUPTED_EXIT}
DEFAULT_CONFIG = str(experiments_dir() / "smoke.py") + ":leviathan"
# The run's workdir once main has chosen it (interrupted_line reads it).
_WORKDIR: list[str] = []


def _define_flags(fv: flags.FlagValues = flags.FLAGS, argv: list[str] | None = None):
  """Defines lev-train's flags in `fv`; `argv` is the command line ml_collections reads
  the `--config.<field>` overrides from (default sys.argv; lev-ladder and lev-study check
  their --train_flags with a fresh `fv` and their own argv)."""
  config_flags.DEFINE_config_file(
      "config", DEFAULT_CONFIG, "Experiment file and variant, e.g. experiments/smoke.py:tied.",
      flag_values=fv, sys_argv=argv)
  common.define_path("workdir", None, "Output directory (default ./runs/<config.name>).",
                     what="the run's folder, or leave the flag out for ./runs/<config.name>",
                     fv=fv)
  flags.DEFINE_integer("stop_at_step", None, "Stop after this step with a checkpoint (for "
                       "time-sliced jobs; the schedule still spans train.steps); at least 1.",
                       lower_bound=1, flag_values=fv)
  flags.DEFINE_bool("force_unlock", False, f"Remove WORKDIR/{LOCK} when it was left by a run "
                    "on another host that is gone (see lev_jax/lock.py); a lock held on "
                    "this host is never overridden.", flag_values=fv)
  flags.DEFINE_bool("lock", True, workdir_lock.LOCK_FLAG_HELP, flag_values=fv)
  flags.DEFINE_bool("restore_fallback", False, "When the latest checkpoint is corrupt "
                    "(checksum), unreadable or holds NaN/infinite values, resume from the latest "
                    "intact one (step 0 if none is) instead of stopping; a warning names the "
                    "skipped step, moved to checkpoints_quarantine/.", flag_values=fv)
  flags.DEFINE_string("preflight", None, "Check the flags, config and mesh for a job of "
                      "PLATFORM:PROCESSESxDEVICES (cpu|gpu|tpu, devices per process), "
                      "e.g. gpu:4x8, then exit without training or writing anything.",
                      flag_values=fv)
  distributed.define_flags(fv)


_PREFLIGHT = re.compile(r"^(cpu|gpu|tpu):([0-9]+)x([0-9]+)$")


def preflight(spec: str) -> None:
  """Validates flags.FLAGS.config for the job `spec` describes; prints one line.

  Exits with status 2 and one line on a bad spec, config, mesh or batch, an XLA_FLAGS
  flag that XLA does not know (`common.xla_flags_error`), or a JAX_PLATFORMS that would
  stop the job (`jax_platforms_error`).
  """
  from lev_jax import train  # jax and flax; no backend is touched
  from lev_jax.sharding import ShardingError
  m = _PREFLIGHT.match(spec)
  if not m or int(m.group(2)) < 1 or int(m.group(3)) < 1:
    common.fail("lev-train", f"--preflight={spec}: expected PLATFORM:PROCESSESxDEVICES with "
                "PLATFORM cpu, gpu or tpu and counts of at least 1, e.g. gpu:4x8")
  platform, processes, devices = m.group(1), int(m.group(2)), int(m.group(3))
  config = common.config_or_exit("lev-train")
  try:
    validate(config)
    ici, dcn = train.check_job(config, processes, devices, platform)
  except (ConfigError, ShardingError) as e:
    common.fail("lev-train", str(e))
  problem = common.xla_flags_error() or jax_platforms_error(platform)
  if problem:
    common.fail("lev-train", problem)
  finished = _preflight_workdir(config, flags.FLAGS.workdir)
  print(f"lev-train: preflight ok: {config.name} on {processes} x {devices} {platform} "
        f"devices, mesh (data, fsdp, tensor) = {tuple(ici)} x DCN {tuple(dcn)}{finished}")


def _preflight_workdir(config, workdir: str | None) -> str:
  """The preflight's check of --workdir, when given and on this machine: what the job
  would refuse at its start (a path inside another run, export or prepared data; a run
  there with other settings, or unfinished at another train.steps: newcomer pass 11),
  as one line and exit 2. Returns a note for the ok line ("" when there is nothing to
  say): a run already finished there with this config only prints its result."""
  if not workdir:
    return ""
  problem = workdir_error(workdir)
  if problem:
    common.fail("lev-train", problem)
  if "://" in workdir or not os.path.isdir(os.path.expanduser(workdir)):
    return ""
  from lev_jax import trainer  # pylint: disable=import-outside-toplevel
  from lev_jax.checkpoint import CheckpointMismatchError  # pylint: disable=import-outside-toplevel
  from lev_jax.checkpoint_checks import CheckpointCorruptError  # pylint: disable=import-outside-toplevel
  try:
    done = trainer.finished_run(config, os.path.expanduser(workdir), warn=False)
    # prepared data, a folder of other files (newcomer pass 12: L04)
    trainer.check_run_folder(epath.Path(os.path.expanduser(workdir)))
  except (ConfigError, CheckpointMismatchError, CheckpointCorruptError) as e:
    common.fail("lev-train", str(e))
  if done:
    return (f"; {workdir} already holds this run, finished at step {done.step}: the job "
            "will only print its result")
  problem = _resume_problem(config, os.path.expanduser(workdir))
  if problem:
    common.fail("lev-train", problem)
  return ""


def _resume_problem(config, workdir: str) -> str | None:
  """Why the job could not resume the run in `workdir` (its latest checkpoint's model
  shape or data position differs from `config`'s, as Checkpointer.restore would refuse),
  read without writing; None when there is nothing to resume or it would resume."""
  from lev_jax.checkpoint import CheckpointReader  # pylint: disable=import-outside-toplevel
  from lev_jax.checkpoint_checks import resume_mismatch  # pylint: disable=import-outside-toplevel
  checkpoints = os.path.join(workdir, CHECKPOINTS)
  if not os.path.isdir(checkpoints):
    return None
  with CheckpointReader(checkpoints) as reader:
    steps = reader.all_steps()
    if not steps:
      return None
    try:
      saved = reader.saved_config(steps[-1])
    except Exception:  # pylint: disable=broad-except  # the job's restore names it
      return None
  return resume_mismatch(saved, config,
                         f"checkpoint {os.path.join(checkpoints, str(steps[-1]))}",
                         one_line=True)


# JAX_PLATFORMS names jax accepts (jax/_src/xla_bridge.py, jax 0.10: "gpu" tries cuda
# then rocm) and the ones a --preflight platform's job runs on.
JAX_PLATFORM_NAMES = ("cpu", "tpu", "cuda", "rocm", "gpu")
_PREFLIGHT_PLATFORMS = {"cpu": {"cpu"}, "tpu": {"tpu"}, "gpu": {"cuda", "rocm", "gpu"}}


def jax_platforms_error(platform: str) -> str | None:
  """The one line when JAX_PLATFORMS, as set here, would stop a `platform` job (cpu, gpu
  or tpu) at its start: a name jax does not know, or none of `platform`'s backends (jax
  starts only the listed ones and fails on one it cannot start). None when it is unset.
  Checked by --preflight, which starts no backend (a real run meets
  common.backend_error instead)."""
  value = os.environ.get("JAX_PLATFORMS", "")
  names = [n.strip().lower() for n in value.split(",") if n.strip()]
  if not names:
    return None
  unknown = [n for n in names if n not in JAX_PLATFORM_NAMES]
  if unknown:
    return (f"JAX_PLATFORMS={value}: {', '.join(map(repr, unknown))} is not a jax platform; "
            f"expected a comma-separated list of {', '.join(JAX_PLATFORM_NAMES)}, or leave it "
            "unset for jax to choose")
  if not set(names) & _PREFLIGHT_PLATFORMS[platform]:
    return (f"JAX_PLATFORMS={value}: a {platform} job would not use its {platform} devices "
            f"(jax starts only {', '.join(names)}); expected it to name "
            f"{' or '.join(sorted(_PREFLIGHT_PLATFORMS[platform]))}, or leave it unset")
  return None


def finished_line(name: str, workdir, finished) -> str:
  """The one line lev-train prints for a run that had already finished (trainer.Finished)."""
  r = finished.result
  try:
    figures = f"validation loss {float(r['loss']):.4f}, perplexity {float(r['perplexity']):.2f}"
  except (KeyError, TypeError, ValueError):  # an eval.json of another shape: name it only
    figures = "evaluated"
  return (f"lev-train: {name} already finished at step {finished.step} ({figures} in "
          f"{workdir}/{EVAL_JSON}); nothing to do, nothing written")


def workdir_error(workdir: str) -> str | None:
  """The one line when `workdir` is not a folder a run may be trained in: a file or
  folder another run owns, or inside one (its checkpoints/, tokenizer/, ...:
  common.checkpoint_tree_error), or an export or inside one (common.export_folder_error),
  inside another run's folder or prepared data (common.within_owned_folder_error:
  newcomer pass 10, a run trained in RUN/sub), or a dangling symbolic link
  (common.dangling_link_error). None elsewhere (a new folder, or this run's own to
  resume)."""
  return (common.checkpoint_tree_error("--workdir", workdir)
          or common.export_folder_error("--workdir", workdir)
          or common.within_owned_folder_error("--workdir", workdir)
          or common.dangling_link_error("--workdir", workdir))


def stop_at_step_error(stop_at_step: int | None, steps: int) -> str | None:
  """The one line when --stop_at_step is past config.train.steps (`steps`; the run ends
  there, so the flag would be ignored); None when it is not given or within the run."""
  if stop_at_step is None or stop_at_step <= steps:
    return None
  return (f"flag --stop_at_step={stop_at_step}: past the run's end, train.steps = {steps}; "
          f"expected a step in [1, {steps}] (or leave the flag out to train to the end)")


def main(argv):
  if len(argv) > 1:
    common.fail_unexpected("lev-train", argv[1:])
  if flags.FLAGS.preflight is not None:
    common.quiet_library_logs()
    preflight(flags.FLAGS.preflight)
    return
  config = common.config_or_exit("lev-train")
  try:
    validate(config)  # before the workdir or its lock is created
  except ConfigError as e:
    common.fail("lev-train", str(e))
  beyond = stop_at_step_error(flags.FLAGS.stop_at_step, config.train.steps)
  if beyond:
    common.fail("lev-train", beyond)
  workdir = flags.FLAGS.workdir or default_workdir(config.name)
  inside = workdir_error(workdir)
  if inside:
    common.fail("lev-train", inside)
  common.quiet_library_logs()  # imports jax (before any backend starts)
  try:  # multi-host: flags, else LEV_JAX_* env, else JAX's cluster detection, else nothing
    distributed.initialize_from_flags()
  except ValueError as e:
    common.fail("lev-train", str(e))
  common.backend_or_exit("lev-train")  # JAX_PLATFORMS=cuda without a GPU: one line
  # After the checks above: jax, Orbax and grain.
  # pylint: disable=import-outside-toplevel
  from lev_jax import trainer
  from lev_jax.checkpoint import CheckpointMismatchError, CheckpointWriteError
  from lev_jax.data import DataError
  from lev_jax.eval.evaluate import coverage
  from lev_jax.sharding import ShardingError
  # pylint: enable=import-outside-toplevel
  _WORKDIR[:] = [workdir]  # for the line a Ctrl-C before the first step prints
  logging.info("config %s -> workdir %s", config.name, workdir)
  try:
    # A finished run is only read: before the lock, so nothing at all is written.
    lock_problem = flags.FLAGS.lock and workdir_lock.lock_kind_error(workdir)
    if lock_problem:
      common.fail("lev-train", lock_problem)
    result = trainer.finished_run(config, workdir, flags.FLAGS.restore_fallback)
    if result is None:
      lock = (workdir_lock.hold(workdir, prog="lev-train",
                                force_unlock=flags.FLAGS.force_unlock,
                                enabled=flags.FLAGS.lock)
              if distributed.is_primary() else contextlib.nullcontext())
      with lock:  # released on every exit: return, error, KeyboardInterrupt, SystemExit
        result = trainer.train_and_evaluate(config, workdir,
                                            stop_at_step=flags.FLAGS.stop_at_step,
                                            restore_fallback=flags.FLAGS.restore_fallback,
                                            finished_checked=True)
  except (ConfigError, DataError, CheckpointMismatchError, ShardingError,
          FileNotFoundError, workdir_lock.WorkdirLockError) as e:
    common.fail("lev-train", str(e))
  except (trainer.DivergenceError, CheckpointWriteError, OutputWriteError) as e:
    print(f"lev-train: error: {common.first_line(e)}", file=sys.stderr)
    sys.exit(1)
  if isinstance(result, trainer.Finished):
    if distributed.is_primary():
      print(finished_line(config.name, workdir, result))
    return
  if isinstance(result, trainer.Stopped) and result.reason == "stop_at_step":
    print(f"lev-train: {config.name} stopped at step {result.step} as asked; "
          "re-run without --stop_at_step to continue", file=sys.stderr)
    return
  if isinstance(result, trainer.Stopped):  # signalled after saving: not finished, not 0
    print(f"lev-train: {config.name} stopped at step {result.step} ({result.reason}) after "
          "a checkpoint; re-run to resume", file=sys.stderr)
    sys.exit(STOPPED_EXIT[result.reason])
  if distributed.is_primary():
    print(f"lev-train: {config.name} step {result['step']}: validation loss "
          f"{result['loss']:.4f}, perplexity {result['perplexity']:.2f} -> {workdir}/{EVAL_JSON}")
    if result.get("data"):  # eval.json of a run finished before the record was kept
      print(f"  {coverage(result['data'])}")


def interrupted_line(workdir: str | None, cause: str = common.INTERRUPTED) -> str:
  """What Ctrl-C (or SIGTERM: `cause`) before the first step (data, restore, the first
  compile) says: that the checkpoints of `workdir` are unchanged when it has some, else
  that none was written yet (a fresh run; `workdir` None: not yet chosen)."""
  head = f"{cause} before the first step; "
  if workdir is None:
    return head + "nothing was written: re-run to start"
  try:
    checkpoints = epath.Path(workdir) / CHECKPOINTS
    saved = checkpoints.is_dir() and any(p.name.isdigit() for p in checkpoints.iterdir())
  except OSError:  # cannot tell: say only what is sure
    return head + "no checkpoint was written: re-run to continue"
  if saved:
    return head + "the workdir's checkpoints are unchanged: re-run to continue"
  return head + "no checkpoint was written yet: re-run to start"


def run():
  common.define_or_exit("lev-train", _define_flags)
  # Ctrl-C or SIGTERM before the first step (data, restore, compile) ends here, the
  # lock released; from the first step on, the trainer turns either into a checkpoint
  # (a second one aborts at once).
  interrupt.terminate_as_interrupt()
  common.run("lev-train", main, __name__,
             interrupted=lambda cause: interrupted_line(_WORKDIR[0] if _WORKDIR else None,
                                                         cause))


if __name__ == "__main__":
  run()
