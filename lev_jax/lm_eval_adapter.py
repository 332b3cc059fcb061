"""lm-evaluation-harness (0.4.x) model "lev_jax": any lm-eval task on a lev_jax model.

Run (lm-eval's command line with this model registered; `--model lev_jax` is the
default):

  lev-lm-eval --model_args checkpoint=runs/x,step=3000 \\
      --tasks lambada_openai,hellaswag,piqa,arc_easy --batch_size 16
  python -m lev_jax.lm_eval_adapter ...        # the same

`lm_eval --model lev_jax ...` alone does not work: lm-eval finds models only in its own
registry and never imports this module (0.4.13 has no plug-in entry point;
`--include_path` adds tasks, not models). `run()` is the `lev-lm-eval` console script.
From Python:

  import lm_eval, lev_jax.lm_eval_adapter
  lm_eval.simple_evaluate(model="lev_jax", model_args="checkpoint=runs/x", tasks=[...])
  # or an in-memory model:
  lm = lev_jax.lm_eval_adapter.LevJaxLM(model=model, tokenizer=tok, config=config)
  lm_eval.simple_evaluate(model=lm, tasks=[...])

model_args: checkpoint=PATH (a lev-train workdir or lev-export folder, local or gs://),
step=N (default: latest), dtype=float32|bfloat16|float16 (default: as saved),
batch_size=B (default 8; also lm-eval's --batch_size; "auto" = the default),
max_len=L (default: the config's train.seq_len). model_args win over lm-eval's
--batch_size default, so "batch_size=B" in model_args is never a duplicate argument.

Offline: lev_jax/lm_eval_tasks holds lm-eval's lambada_openai, hellaswag, piqa, arc_easy,
arc_challenge and winogrande over their released files (`--include_path` it; tasks
`<name>_local`, tag `lev_local`; files under $LEV_LM_EVAL_DATA). Before lm-eval starts,
`data_problem` stops in one line a run whose task needs an uncached Hub dataset while
the Hub is offline or unreachable, or whose local files are missing.

Scoring semantics are `lev_jax.scoring.Scorer`'s (lm-eval's HF model). Single process:
JAX places the model on its default devices; `device` and `max_batch_size` are
accepted and ignored. Library: lm_eval/api/model.py (``LM``), lm_eval/api/registry.py
(``model_registry``), lm_eval/__main__.py (``cli_evaluate``), all of lm-eval 0.4.13.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

try:
  # Fills lm-eval's registry with its own models first: lm-eval only does that itself
  # while the registry is empty, which it no longer is once "lev_jax" is in it.
  importlib.import_module("lm_eval.models")
  from lm_eval.api.model import LM
  from lm_eval.api.registry import model_registry
  from lm_eval.utils import simple_parse_args_string
except ImportError as e:  # pragma: no cover - depends on the environment
  raise ImportError("lev_jax.lm_eval_adapter needs lm-evaluation-harness 0.4: "
                    "pip install lm-eval") from e

from lev_jax.scoring import Scorer

try:  # the dataset builders that read local files (json, csv, parquet, ...)
  from datasets.packaged_modules import _PACKAGED_DATASETS_MODULES as _PACKAGED_BUILDERS
except ImportError:  # pragma: no cover - another datasets layout
  _PACKAGED_BUILDERS = {"json", "csv", "text", "parquet", "arrow", "pandas"}

MODEL_NAME = "lev_jax"
DEFAULT_BATCH_SIZE = 8

log = logging.getLogger(__name__)


def _batch_size(value) -> int:
  """lm-eval batch_size (int, "16", "auto", "auto:N", None) -> rows per forward pass."""
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
  """An lm-eval `LM` scoring with a lev_jax Decoder (lev_jax.scoring.Scorer).

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
    ValueError: neither checkpoint nor model+tokenizer, both, or a bad batch_size.
    lev_jax.inference.InferenceError: from loading the checkpoint.
  """

  def __init__(self, checkpoint: str | None = None, step: int | None = None,
               dtype: str | None = None, batch_size=None, max_len: int | None = None, *,
               model=None, tokenizer=None, config=None, max_batch_size=None, device=None,
               **ignored):
    super().__init__()
    if ignored:
      log.warning("lev_jax: ignoring model_args %s", sorted(ignored))
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
                         batch_size=_batch_size(batch_size))

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
  model_registry.register(MODEL_NAME, target="lev_jax.lm_eval_adapter:LevJaxLM")


# --- before lm-eval runs: can every requested task get its data? -----------------------

HUB_PROBE_TIMEOUT_S = 3.0


def _task_configs(names: Sequence[str], include_path: str | None) -> dict[str, dict]:
  """{requested task: its YAML config (functions unresolved)} for the tasks found; a tag
  of --include_path stands for its tasks. Names found nowhere are left to lm-eval.

  Reads only --include_path and, for the other names, the one lm-eval task folder
  whose name starts the task's (hellaswag/, arc/ for arc_easy, ...): lm-eval's own
  index of every task takes half a minute.
  Library: lm_eval/tasks/_index.py (`TaskIndex.build`), lm-eval 0.4.13.
  """
  from lm_eval.tasks._index import Kind, TaskIndex  # pylint: disable=import-outside-toplevel
  found, todo = {}, list(names)
  if include_path:
    index = TaskIndex.build([Path(include_path)])
    for name in list(todo):
      entry = index.get(name)
      if entry is None:
        continue
      todo.remove(name)
      members = sorted(entry.tags) if entry.kind == Kind.TAG else [name]
      found.update({m: index[m].cfg for m in members if index.get(m) and index[m].cfg})
  if not todo:
    return found
  import lm_eval.tasks  # pylint: disable=import-outside-toplevel
  root = Path(lm_eval.tasks.__file__).parent
  folders = sorted((d for d in root.iterdir() if d.is_dir()), key=lambda d: -len(d.name))
  for name in todo:
    for folder in [d for d in folders if name.startswith(d.name)][:1]:
      entry = TaskIndex.build([folder]).get(name)
      if entry is not None and entry.kind != Kind.TAG and entry.cfg is not None:
        found[name] = entry.cfg
  return found


def _hub_reachable(endpoint: str, timeout_s: float = HUB_PROBE_TIMEOUT_S) -> bool:
  """Whether `endpoint` answers an HTTP HEAD within `timeout_s` (any status counts; a
  name that does not resolve in time does not)."""
  import threading  # pylint: disable=import-outside-toplevel
  import urllib.error  # pylint: disable=import-outside-toplevel
  import urllib.request  # pylint: disable=import-outside-toplevel
  answered = threading.Event()

  def probe():
    try:
      urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"),
                             timeout=timeout_s).close()
      answered.set()
    except urllib.error.HTTPError:
      answered.set()
    except (OSError, ValueError):
      pass

  thread = threading.Thread(target=probe, daemon=True)  # DNS ignores the timeout
  thread.start()
  thread.join(timeout_s)
  return answered.is_set()


def data_problem(tasks: Sequence[str], include_path: str | None) -> str | None:
  """Why a requested task cannot get its data, in one line, or None.

  A task of lev_jax/lm_eval_tasks whose files are missing (or $LEV_LM_EVAL_DATA
  unset) is named with the file. A task reading a Hugging Face Hub dataset that is not
  in the datasets cache, while the Hub is offline (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE,
  as `datasets.config` reads them) or does not answer within HUB_PROBE_TIMEOUT_S, is
  named with the dataset and pointed at the local twin of lev_jax.lm_eval_tasks
  (lm-eval would otherwise retry the Hub for most of a minute, then print a traceback).
  """
  import datasets.config  # pylint: disable=import-outside-toplevel
  import huggingface_hub.constants  # pylint: disable=import-outside-toplevel
  from lev_jax import lm_eval_tasks  # pylint: disable=import-outside-toplevel
  from lev_jax.lm_eval_tasks import lev_local  # pylint: disable=import-outside-toplevel
  configs = _task_configs(tasks, include_path)
  hub = {}
  for name, cfg in configs.items():
    kwargs = cfg.get("dataset_kwargs") or {}
    if str(cfg.get("custom_dataset", "")).endswith("lev_local.load"):
      try:
        for key in ("data_file", "labels_file"):
          if kwargs.get(key):
            lev_local.data_path(kwargs[key])
      except ValueError as e:
        return f"task {name}: {e}"
      continue
    path = cfg.get("dataset_path")
    if (cfg.get("custom_dataset") or not path or path in _PACKAGED_BUILDERS
        or os.path.exists(path)):
      continue
    if not (Path(datasets.config.HF_DATASETS_CACHE) / path.replace("/", "___")).exists():
      hub[name] = path
  if not hub:
    return None
  if datasets.config.HF_HUB_OFFLINE:
    why = "offline (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE is set)"
  elif not _hub_reachable(huggingface_hub.constants.ENDPOINT):
    why = (f"unreachable ({huggingface_hub.constants.ENDPOINT} did not answer in "
           f"{HUB_PROBE_TIMEOUT_S:g} s)")
  else:
    return None
  name, path = next(iter(hub.items()))
  twins = [lm_eval_tasks.LOCAL_TWIN[t] for t in hub if t in lm_eval_tasks.LOCAL_TWIN]
  local = (f"--tasks {','.join(twins)}" if len(twins) == len(hub) else
           f"task YAMLs over local files (examples: {lm_eval_tasks.TASKS_DIR})")
  return (f"task {name} reads {path} from the Hugging Face Hub, which is {why}, and it is "
          f"not in the datasets cache; run {local} --include_path "
          f"{lm_eval_tasks.TASKS_DIR} with {lev_local.DATA_ENV}=<folder of the released "
          "files> (README, lev_jax/lm_eval_tasks)")


def _requested(argv: Sequence[str]):
  """(tasks, include_path) of an lm-eval `run` command line, or None when it does not
  parse (lm-eval then says why)."""
  from lm_eval._cli.harness import HarnessCLI  # pylint: disable=import-outside-toplevel
  saved = sys.argv
  sys.argv = ["lm-eval", *argv]
  try:
    args = HarnessCLI().parse_args()
  except SystemExit:
    return None
  finally:
    sys.argv = saved
  if getattr(args, "command", None) != "run" or not getattr(args, "tasks", None):
    return None
  return list(args.tasks), args.include_path


HELP_USAGE = """\
`lev-lm-eval`: lm-evaluation-harness tasks on a lev_jax model (lm-eval's `run` command
with `--model lev_jax`, lev_jax/lm_eval_adapter.py).

  lev-lm-eval --model_args checkpoint=runs/smoke_leviathan --tasks lambada_openai,hellaswag
  lev-lm-eval --model_args checkpoint=exports/leviathan,step=200 --tasks piqa --limit 100

Flags (lm-eval's; a value may follow `=` or a space; all of them: lev-lm-eval run --help):"""
HELP_FLAGS = (
    ("--model_args=checkpoint=runs/smoke_leviathan,step=200",
     "checkpoint=PATH (a lev-train workdir or lev-export folder), step=N (default: "
     "latest), dtype=float32|bfloat16|float16, batch_size=B, max_len=L."),
    ("--tasks=lambada_openai,hellaswag", "lm-eval task names, comma-separated "
     "(lev-lm-eval ls tasks lists them)."),
    ("--include_path=TASKS_DIR", "A folder of more task YAML files; TASKS_DIR holds "
     "lm-eval's lambada_openai, hellaswag, piqa, arc_easy, arc_challenge and winogrande "
     "over their released files (no Hub): --tasks lev_local (all six) or "
     "hellaswag_local, ...; the files' folder: $LEV_LM_EVAL_DATA (README)."),
    ("--batch_size=16", "Rows per forward pass (default 8; 'auto' = 8)."),
    ("--num_fewshot=0", "Examples in the few-shot context."),
    ("--limit=100", "At most this many documents per task (for a quick look)."),
    ("--output_path=results/lm_eval.json", "Write the results (and samples) there."),
    ("--log_samples", "Also save each document's requests and answers."),
)


def usage() -> str:
  """`lev-lm-eval --help`: examples and the lm-eval flags that matter here."""
  from lev_jax.cli import help_row  # pylint: disable=import-outside-toplevel
  from lev_jax.lm_eval_tasks import TASKS_DIR  # pylint: disable=import-outside-toplevel
  rows = [(f.replace("TASKS_DIR", str(TASKS_DIR)), t) for f, t in HELP_FLAGS]
  return "\n".join([HELP_USAGE, *(l for f, t in rows for l in help_row(f, t))])


def run(argv: Sequence[str] | None = None) -> None:
  """lm-eval's command line with the lev_jax model registered (console script).

  Args:
    argv: the arguments after the program name (default sys.argv[1:]); lm-eval's
      `run` options (--model_args, --tasks, --batch_size, --output_path, ...).
      `--model lev_jax` is added unless --model is given; `ls` / `validate`
      subcommands pass through; no arguments, -h or --help print `usage()`
      (lm-eval's own: `run --help`).
  """
  from lm_eval.__main__ import cli_evaluate  # pylint: disable=import-outside-toplevel

  argv = list(sys.argv[1:] if argv is None else argv)
  if not argv or argv[0] in ("-h", "--help"):
    print(usage())
    sys.exit(0)
  has_model = any(a in ("--model", "-M") or a.startswith("--model=") for a in argv)
  if argv[0] not in ("ls", "validate") and not has_model:
    argv += ["--model", MODEL_NAME]
  requested = _requested(argv)
  problem = requested and data_problem(*requested)
  if problem:  # before lm-eval indexes its tasks and loads the model
    print(f"lev-lm-eval: error: {problem}", file=sys.stderr)
    sys.exit(2)
  sys.argv = ["lm-eval", *argv]
  try:
    cli_evaluate()
  except ValueError as e:  # InferenceError and our other input errors: one line
    lines = str(e).strip().strip("'\"").splitlines() or [type(e).__name__]
    print(f"lev-lm-eval: error: {lines[0]}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
  run()
