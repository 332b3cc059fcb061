"""The training loop: data -> jitted steps -> metrics, evaluation and checkpoints.

`train_and_evaluate(config, workdir)` resumes from WORKDIR/checkpoints when a
checkpoint exists, so re-running the same command continues the run. Outputs:
  WORKDIR/metrics.jsonl     one JSON object per log / eval step
  WORKDIR/tensorboard/      TensorBoard event files
  WORKDIR/eval.json         the latest validation result (with frequency buckets)
  WORKDIR/data_report.json  the data: source, documents, tokens, skipped lines by reason
  WORKDIR/tokenizer/        the tokenizer (save_tokenizer), for inference and export
  WORKDIR/token_counts.npy  int64 [V] training-split count of each id (frequency buckets)
  WORKDIR/checkpoints/<step>/{state,data,config}
"""

from __future__ import annotations

import json
import logging
import math
import signal
import time

import jax
import ml_collections
import numpy as np
from jax.experimental import multihost_utils
from etils import epath
from tqdm import tqdm

from lev_jax import data as data_lib
from lev_jax.checkpoint import Checkpointer
from lev_jax.config import ConfigError, validate
from lev_jax.data.files import npy_bytes, write_bytes_atomic
from lev_jax.data.tokenizer import save_tokenizer
from lev_jax.evaluate import evaluate
from lev_jax.flops import (lev_plan_line, mfu, tokens_per_s_per_device,
                           train_flops_per_step)
from lev_jax import sharding
from lev_jax.metrics import MetricWriter
from lev_jax.train import abstract_state, init_state, make_eval_step, make_train_step, partition


class _Preemption:
  """Turns SIGTERM (TPU/SLURM preemption notice) into a final checkpoint and clean exit."""

  def __init__(self):
    self.requested = False
    try:
      signal.signal(signal.SIGTERM, self._handle)
    except ValueError:  # not the main thread
      pass

  def _handle(self, signum, frame):
    del signum, frame
    self.requested = True

  def agreed(self) -> bool:
    """True when any process got SIGTERM; every process must stop at the same step, so
    with several processes the flag is combined across hosts (one tiny allgather)."""
    if jax.process_count() == 1:
      return self.requested
    flags = multihost_utils.process_allgather(np.int32(self.requested))
    return bool(np.max(flags))


def _eval_and_log(eval_step, params, bundle, config, step, writer, workdir) -> dict:
  result = evaluate(eval_step, params, bundle.eval_batches(), bundle.token_counts_V,
                    config.eval.freq_bucket_edges)
  result["step"] = step
  scalars = {"eval/loss": result["loss"], "eval/perplexity": result["perplexity"]}
  for b in result["buckets"]:
    if b["perplexity"] is not None:
      lo, hi = b["range"].strip("[)").split(",")
      scalars[f"eval/perplexity_bucket_{lo}-{hi}"] = b["perplexity"]
  writer.write(step, scalars)
  if jax.process_index() == 0:
    path = epath.Path(workdir) / "eval.json"
    tmp = path.parent / (path.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(path)
  return result


def _check_gcs_support(config: ml_collections.ConfigDict, workdir) -> None:
  """gs:// paths need gcsfs (etils.epath's backend) and google-cloud-storage (TensorBoard).

  Raises:
    ConfigError: naming the field with a gs:// path when those packages are missing.
  """
  paths = {"--workdir": [str(workdir)], "data.train_files": list(config.data.train_files),
           "data.validation_files": list(config.data.validation_files),
           "data.tiktoken_file": [config.data.tiktoken_file],
           "data.sentencepiece_file": [config.data.sentencepiece_file],
           "data.prepared_dir": [config.data.prepared_dir]}
  for field, values in paths.items():
    if any(str(v).startswith("gs://") for v in values):
      try:
        import gcsfs  # noqa: F401
        import google.cloud.storage  # noqa: F401
      except ImportError as e:
        raise ConfigError(
            f"{field} is on gs:// but Google Cloud Storage support is not installed "
            f"({e.name} missing): pip install -e '.[gcs]'") from e


def train_and_evaluate(config: ml_collections.ConfigDict, workdir,
                       stop_at_step: int | None = None) -> dict | None:
  """Trains config.train.steps optimizer steps (resuming if possible); returns final eval.

  Args:
    config: a validated-on-entry experiment config.
    workdir: outputs and checkpoints (local or gs://).
    stop_at_step: for time-sliced jobs: stop after this step with a checkpoint (the
      schedule still spans train.steps); returns None. The next call resumes.

  Raises:
    ConfigError, data_lib.DataError, CheckpointMismatchError: with a message naming
      the field, file or checkpoint at fault.
  """
  validate(config)
  _check_gcs_support(config, workdir)
  workdir = epath.Path(workdir).expanduser()
  if "://" not in str(workdir):
    workdir = workdir.absolute()  # Orbax needs absolute paths; `runs/x` is relative
  workdir.mkdir(parents=True, exist_ok=True)
  t = config.train
  bundle = data_lib.load(config)  # checks that tokenizer and model.vocab_size agree
  if jax.process_index() == 0:  # documents, tokens, skipped lines by reason, tokenizer
    (workdir / "data_report.json").write_text(json.dumps(bundle.report, indent=1,
                                                         default=str))
    save_tokenizer(bundle.tokenizer, workdir / "tokenizer", config.model.vocab_multiple)
    write_bytes_atomic(workdir / "token_counts.npy", npy_bytes(bundle.token_counts_V))
  part = partition(config)
  logging.info("mesh %s over %d devices in %d processes", dict(part.mesh.shape),
               jax.device_count(), jax.process_count())
  if config.model.embedding == "lev":
    logging.info("%s", lev_plan_line(config))
  global_stream = config.data.host_batches == "global"
  if global_stream:  # every process: the same global batches; each feeds its rows
    train_iter = iter(bundle.train_dataset(t.global_batch_size))
    feed = lambda b: sharding.full_to_global(b, part.batch_sharding)
  else:  # each process: its documents, its rows
    n_proc = jax.process_count()
    train_iter = iter(bundle.train_dataset(t.global_batch_size // n_proc,
                                           jax.process_index(), n_proc))
    feed = lambda b: sharding.to_global(b, part.batch_sharding)
  ckpt = Checkpointer(workdir / "checkpoints", keep=t.keep_checkpoints,
                      portable_data=global_stream)
  latest = ckpt.latest_step()
  if latest is not None:  # restored straight into its shardings; no fresh init first
    state = ckpt.restore(latest, abstract_state(part, config), train_iter, config)
    logging.info("resumed from step %d", latest)
  else:
    state = init_state(part, config)
  step = int(state["step"])
  eval_path = workdir / "eval.json"
  if step == t.steps and eval_path.exists():
    finished = json.loads(eval_path.read_text())
    if finished.get("step") == step:
      logging.info("the run already finished at step %d; its evaluation is %s", step, eval_path)
      ckpt.close()
      _close(train_iter)
      return finished
  train_step = make_train_step(part, config)
  eval_step = make_eval_step(part)
  writer = MetricWriter(workdir)
  tokens_per_step = t.global_batch_size * t.seq_len
  flops_per_step = train_flops_per_step(config)["total"]
  n_devices, device_kind = jax.device_count(), jax.devices()[0].device_kind
  preemption = _Preemption()
  bar = tqdm(total=t.steps, initial=step, desc=config.name, unit="step",
             disable=jax.process_index() != 0)
  result = None
  window_start, window_steps, compiled = time.perf_counter(), 0, False
  pending = None  # (step, device metrics) fetched after the next step is dispatched

  def flush(pending):
    nonlocal window_start, window_steps, compiled
    s, m = pending
    m = {k: float(v) for k, v in jax.device_get(m).items()}
    now = time.perf_counter()
    step_time = (now - window_start) / max(window_steps, 1)
    scalars = {"train/loss": m["loss"], "train/perplexity": math.exp(min(m["loss"], 50.0)),
               "train/grad_norm": m["grad_norm"], "train/lr": m["lr"],
               "train/tokens_seen": s * tokens_per_step,
               "perf/step_time_s": step_time, "perf/tokens_per_s": tokens_per_step / step_time,
               "perf/tokens_per_s_per_device": tokens_per_s_per_device(
                   tokens_per_step, step_time, n_devices),
               "perf/model_tflops_per_s_per_device":
                   flops_per_step / step_time / n_devices / 1e12}
    # Per parameter group (lev_jax.optimizer.param_group): train/grad_norm/<group>,
    # train/update_ratio/<group>; only the groups the model has.
    scalars.update({f"train/{k}": v for k, v in m.items()
                    if k.startswith(("grad_norm/", "update_ratio/"))})
    utilisation = mfu(flops_per_step, step_time, n_devices, device_kind)
    if utilisation is not None:  # unknown device (e.g. CPU): omitted, not faked
      scalars["perf/mfu"] = utilisation
    if not compiled:
      scalars["perf/includes_compile"] = 1.0
    compiled = True
    writer.write(s, scalars)
    bar.set_postfix(loss=f"{m['loss']:.3f}", tok_s=f"{tokens_per_step / step_time:,.0f}")
    window_start, window_steps = now, 0

  while step < t.steps:
    batch = feed(next(train_iter))
    state, metrics = train_step(state, batch)
    step += 1
    window_steps += 1
    bar.update(1)
    if pending is not None:
      flush(pending)
      pending = None
    if step % t.log_every == 0 or step == t.steps:
      pending = (step, metrics)
    if step % t.eval_every == 0 and step != t.steps:
      if pending is not None:
        flush(pending)
        pending = None
      result = _eval_and_log(eval_step, state["params"], bundle, config, step, writer, workdir)
      window_start, window_steps = time.perf_counter(), 0
    preempted = preemption.agreed()
    stopping = preempted or step == stop_at_step
    if step % t.checkpoint_every == 0 or step == t.steps or stopping:
      ckpt.save(step, state, train_iter, config)
    if stopping:
      logging.warning("stopping at step %d (%s) after saving a checkpoint", step,
                      "SIGTERM" if preempted else "stop_at_step")
      break
  if pending is not None:
    flush(pending)
  if step == t.steps:
    result = _eval_and_log(eval_step, state["params"], bundle, config, step, writer, workdir)
  bar.close()
  ckpt.close()
  writer.close()
  _close(train_iter)
  return result if step == t.steps else None


def _close(iterator) -> None:
  """Stops the data iterator's worker processes (data.worker_processes > 0)."""
  close = getattr(iterator, "close", None)
  if close is not None:
    close()
