"""lm-evaluation-harness (0.4.x) model "lev_jax": any lm-eval task on a lev_jax model.

Run (lm-eval's command line with this model registered; `--model lev_jax` is the
default):

  lev-lm-eval --model_args checkpoint=runs/x,step=3000 \\
      --tasks lambada_openai,hellaswag,piqa,arc_easy --batch_size 16
  python -m lev_jax.cli.lm_eval ...                 # the same

`lm_eval --model lev_jax ...` alone does not work: lm-eval finds models only in its own
registry and never imports this module (0.4.13 has no plug-in entry point;
`--include_path` adds tasks, not models). `lev-lm-eval` is lev_jax/cli/lm_eval.py.
From Python:

  import lm_eval, lev_jax.eval.lm_eval_adapter
  lm_eval.simple_evaluate(model="lev_jax", model_args="checkpoint=runs/x", tasks=[...])
  # or an in-memory model:
  lm = lev_jax.eval.lm_eval_adapter.LevJaxLM(model=model, tokenizer=tok, config=config)
  lm_eval.simple_evaluate(model=lm, tasks=[...])

model_args: checkpoint=PATH (a lev-train workdir or lev-export folder, local or gs://),
step=N (default: latest), dtype=float32|bfloat16|float16 (default: as saved),
batch_size=B (default 8; also lm-eval's --batch_size; "auto" = the default),
max_len=L (default: the config's train.seq_len). model_args win over lm-eval's
--batch_size default, so "batch_size=B" in model_args is never a duplicate argument.

Offline: lev_jax/lm_eval_tasks holds lm-eval's lambada_openai, hellaswag, piqa, arc_easy,
arc_challenge and winogrande over their released files (`--include_path` it; tasks
`<name>_local`, tag `lev_local`; files under $LEV_LM_EVAL_DATA). Before lm-eval starts,
`lev-lm-eval` stops in one line a run whose task needs an uncached Hub dataset while
the Hub is offline or unreachable, or whose local files are missing.

Scoring semantics are `lev_jax.eval.scoring.Scorer`'s (lm-eval's HF model). Single process:
JAX places the model on its default devices; `device` and `max_batch_size` are
accepted and ignored. Library: lm_eval/api/model.py (``LM``), lm_eval/api/registry.py
(``model_registry``), lm_eval/__main__.py (``cli_evaluate``), all of lm-eval 0.4.13.
"""

from __future__ import annotations

import importlib
import logging

try:
  # Fills lm-eval's registry with its own models first: lm-eval only does that itself
  # while the registry is empty, which it no longer is once "lev_jax" is in it.
  importlib.import_module("lm_eval.models")
  from lm_eval.api.model import LM
  from lm_eval.api.registry import model_registry
  from lm_eval.utils import simple_parse_args_string
except ImportError as e:  # pragma: no cover - depends on the environment
  raise ImportError("lev_jax.eval.lm_eval_adapter needs lm-evaluation-harness 0.4: "
                    "pip install lm-eval") from e

from lev_jax.eval.scoring import Scorer

MODEL_NAME = "lev_jax"
DEFAULT_BATCH_SIZE = 8
# The model_args keys the model reads, and those lm-eval's command line passes to every
# model (its --max_batch_size, --device, --trust_remote_code), accepted and ignored.
MODEL_ARGS = ("checkpoint", "step", "dtype", "batch_size", "max_len")
PASSED_BY_LM_EVAL = ("max_batch_size", "device", "trust_remote_code")

log = logging.getLogger(__name__)


def parse_batch_size(value) -> int:
  """lm-eval batch_size (int, "16", "auto", "auto:N", None) -> rows per forward pass.

  Raises:
    ValueError: anything else (0, "big").
  """
  if value is None or (isinstance(value, str) and value.startswith("auto")):
    if value is not None:
      log.info("lev_jax: batch_size=%s: no automatic search; using %d", value,
               DEFAULT_BATCH_SIZE)
    return DEFAULT_BATCH_SIZE
  try:
    size = int(value)
  except (TypeError, ValueError):
    size = 0
  if size < 1:
    raise ValueError(f"lev_jax model_args batch_size = {value!r}: expected an integer "
                     ">= 1 or 'auto'")
  return size


class LevJaxLM(LM):
  """An lm-eval `LM` scoring with a lev_jax Decoder (lev_jax.eval.scoring.Scorer).

  Args:
    checkpoint: a lev-train workdir or lev-export folder (`lev_jax.inference.load`).
    step: checkpoint step (None = latest).
    dtype: parameter dtype for loading (None = as saved).
    batch_size: rows per forward pass (int, numeric str or "auto").
    max_len: tokens per forward pass (None = config.train.seq_len).
    model, tokenizer, config: an in-memory model instead of a checkpoint (config or
      max_len needed for the length).
    max_batch_size, device, other keys: accepted for lm-eval's CLI; ignored.
  Raises:
    ValueError: neither checkpoint nor model+tokenizer (unknown keys named), both, or a
      bad batch_size.
    lev_jax.inference.InferenceError: from loading the checkpoint.
  """

  def __init__(self, checkpoint: str | None = None, step: int | None = None,
               dtype: str | None = None, batch_size=None, max_len: int | None = None, *,
               model=None, tokenizer=None, config=None, max_batch_size=None, device=None,
               **ignored):
    super().__init__()
    if ignored:
      log.warning("lev_jax: ignoring model_args %s", sorted(ignored))
    if checkpoint is None and model is None and ignored:  # a misspelt checkpoint=
      raise ValueError(f"lev_jax model: no checkpoint=PATH in model_args; unknown keys "
                       f"{', '.join(sorted(ignored))} (expected {', '.join(MODEL_ARGS)})")
    if (checkpoint is None) == (model is None) or (model is None) != (tokenizer is None):
      raise ValueError("lev_jax model: give checkpoint=PATH (model_args) or both model= "
                       "and tokenizer= (in memory), not both")
    self.step = None
    if checkpoint is not None:
      from lev_jax import inference  # pylint: disable=import-outside-toplevel
      im = inference.load(checkpoint, step=None if step is None else int(step), dtype=dtype)
      model, tokenizer, config, self.step = im.model, im.tokenizer, im.config, im.step
    del max_batch_size, device  # JAX chooses devices; no batch-size search
    self.checkpoint, self.config = checkpoint, config
    self.scorer = Scorer(model, tokenizer, max_len=max_len, config=config,
                         batch_size=parse_batch_size(batch_size))

  # lm-eval passes its CLI defaults (batch_size=1 ...) as additional_config; values
  # from model_args win instead of raising "multiple values for keyword argument".
  @classmethod
  def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None):
    return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

  @classmethod
  def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None):
    extra = {k: v for k, v in (additional_config or {}).items() if v is not None}
    return cls(**{**extra, **arg_dict})

  @property
  def tokenizer_name(self) -> str:
    return getattr(self.scorer.tokenizer, "name", type(self.scorer.tokenizer).__name__)

  def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
    """Instance.args = (context, continuation) -> (sum log p, is_greedy) per request."""
    args = [tuple(r.args) for r in requests]
    out = self.scorer.loglikelihood(args)
    for a, res in zip(args, out):
      self.cache_hook.add_partial("loglikelihood", a, res)
    return out

  def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
    """Instance.args = (text,) -> total log-likelihood of the text (rolling windows)."""
    texts = [r.args[0] for r in requests]
    out = self.scorer.loglikelihood_rolling(texts)
    for t, res in zip(texts, out):
      self.cache_hook.add_partial("loglikelihood_rolling", (t,), res)
    return out

  def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
    """Instance.args = (context, gen_kwargs) -> generated text cut at `until`."""
    args = [(r.args[0], dict(r.args[1])) for r in requests]
    out = self.scorer.generate_until(args)
    for a, res in zip(args, out):
      self.cache_hook.add_partial("generate_until", a, res)
    return out


# A lazy "module:Class" entry (lm-eval's own models are registered this way): the same
# string from a second import or from `python -m` never collides, and lm-eval imports
# this module (the real one, not __main__) when it first needs the class.
if MODEL_NAME not in model_registry:
  model_registry.register(MODEL_NAME, target="lev_jax.eval.lm_eval_adapter:LevJaxLM")
