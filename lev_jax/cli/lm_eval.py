"""`lev-lm-eval`: lm-evaluation-harness's command line with the lev_jax model registered.

  lev-lm-eval --model_args checkpoint=runs/x,step=3000 \\
      --tasks lambada_openai,hellaswag,piqa,arc_easy --batch_size 16
  lev-lm-eval --model_args checkpoint=runs/x \\
      --tasks lev_local      # offline: the released files, $LEV_LM_EVAL_DATA (the tasks of
                             # lev_jax/lm_eval_tasks: their --include_path is added)

The model is lev_jax/eval/lm_eval_adapter.py (`--model lev_jax`, added unless --model is
given). Before lm-eval starts, `model_args_problem` stops in one line a run whose
--model_args the lev_jax model cannot take (an unknown key, no or a wrong checkpoint,
a bad or unsaved step, a bad max_len, dtype or batch_size), `run_flags_problem` a
bad --limit or --num_fewshot, `include_path_problem` a missing --include_path, and `data_problem` one whose task needs an
uncached Hub dataset while the Hub is offline or unreachable, or whose local files are
missing. A local `--output_path=NAME.json` gets the results exactly there (lm-eval names
its file NAME_<time>.json: `place_results` renames it). Library: lm_eval/__main__.py (``cli_evaluate``), lm_eval/tasks/_index.py, lm-eval
0.4.13.
"""

from __future__ import annotations

import difflib
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from lev_jax import lm_eval_tasks
from lev_jax.cli import interrupt
from lev_jax.eval.lm_eval_adapter import MODEL_NAME  # registers the "lev_jax" model

try:  # the dataset builders that read local files (json, csv, parquet, ...)
  from datasets.packaged_modules import _PACKAGED_DATASETS_MODULES as _PACKAGED_BUILDERS
except ImportError:  # pragma: no cover - another datasets layout
  _PACKAGED_BUILDERS = {"json", "csv", "text", "parquet", "arrow", "pandas"}


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
          "files> (docs/evaluation.md, lev_jax/lm_eval_tasks)")


def _parsed(argv: Sequence[str]):
  """lm-eval's own parse (an argparse.Namespace) of an lm-eval `run` command line, or
  None when it is another command or asks for help (lm-eval then prints that; this
  parse prints nothing). Its model_args is the dict lm-eval gives the model.

  A command line lm-eval refuses (`--bogusflag`) ends here with the one line
  `lev-lm-eval: error: <argparse's reason>`, exit 2 (lm-eval's own parse would print
  its usage and the reason again).
  """
  import contextlib  # pylint: disable=import-outside-toplevel
  import io  # pylint: disable=import-outside-toplevel
  from lm_eval._cli.harness import HarnessCLI  # pylint: disable=import-outside-toplevel
  saved, said = sys.argv, io.StringIO()
  sys.argv = ["lm-eval", *argv]
  try:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(said):
      args = HarnessCLI().parse_args()
  except SystemExit as e:
    if e.code in (0, None):  # --help: lm-eval prints it
      return None
    lines = [l for l in said.getvalue().splitlines() if l.strip()] or ["bad arguments"]
    reason = re.sub(r"^[\w .-]*: error: ", "", lines[-1])
    # our loaders' flags, which lm-eval takes in --model_args (newcomer pass 21, M33-M37)
    ours = re.search(r"(?:^|\s)-*(checkpoint|step|dtype)[=\s]", reason)
    hint = ""
    if ours:
      name = ours.group(1)
      example = "checkpoint=DIR" + (f",{name}=VALUE" if name != "checkpoint" else "")
      hint = f"; lev-lm-eval takes {name} in --model_args, e.g. --model_args {example}"
    print(f"lev-lm-eval: error: {reason} (lev-lm-eval --help lists the flags{hint})",
          file=sys.stderr)
    sys.exit(2)
  finally:
    sys.argv = saved
  return args if getattr(args, "command", None) == "run" else None


def _tasks_problem(args) -> str | None:
  """`--tasks is required ...` for a run without tasks (lm-eval finds that only after
  its set-up), unless a --config YAML file may give them; or for an empty name in the
  list (a trailing or doubled comma: lm-eval said `Tasks not found: ` and nothing)."""
  tasks = getattr(args, "tasks", None)
  if tasks and any(not str(t).strip() for t in tasks):
    return (f"--tasks {','.join(map(str, tasks))}: an empty task name (a trailing or "
            "doubled comma); expected lm-eval task names, comma-separated, e.g. --tasks "
            "lambada_openai,hellaswag")
  if tasks or getattr(args, "config", None):
    return None
  return ("--tasks is required: lm-eval task names, comma-separated, e.g. --tasks "
          "lambada_openai,hellaswag (lev-lm-eval ls tasks lists them)")


def _checkpoint_problem(path: str) -> str | None:
  """The loader's own words (inference.source_error) for a local checkpoint= that is no
  folder, or neither a workdir nor an export; its flags said as model_args keys."""
  from lev_jax.inference import source_error  # pylint: disable=import-outside-toplevel
  problem = None if "://" in path else source_error(path)  # remote: the loader's check
  problem = problem and problem.replace(" --step=", ",step=")  # a step folder's hint
  return problem and re.sub(r"--(checkpoint|step)\b", r"\1", problem)


def _step_problem(path: str, step: int) -> str | None:
  """The loader's own words (inference.step_error) for a step the local checkpoint
  `path` does not hold (its steps listed); None for a remote one (the loader's check)."""
  from lev_jax.inference import step_error  # pylint: disable=import-outside-toplevel
  return None if "://" in path else step_error(path, step)


def run_flags_problem(args) -> str | None:
  """The one line for an lm-eval flag lm-eval itself checks only after loading the model
  and the tasks (a `--limit -3` failed in itertools.islice half a minute in): --limit
  not an integer >= 1 or a fraction in (0, 1) (lm-eval reads both as a float), or
  --num_fewshot < 0. None otherwise. `args`: `_parsed`'s Namespace."""
  limit = getattr(args, "limit", None)
  if limit is not None and not (0 < limit < 1 or (limit >= 1 and limit.is_integer())):
    return (f"--limit={limit:g}: expected an integer >= 1 (documents per task) or a "
            "fraction in (0, 1) of each task's documents")
  shots = getattr(args, "num_fewshot", None)
  if shots is not None and shots < 0:
    return f"--num_fewshot={shots}: expected an integer >= 0 (examples in the context)"
  return None


def batch_size_args(args) -> list[str]:
  """["--batch_size", B] for a `--model lev_jax` run given no --batch_size: B is the
  model_args' batch_size, else the model's default (lm_eval_adapter.DEFAULT_BATCH_SIZE,
  8, as --help says). lm-eval would pass the model its own default, 1, and print it.
  [] for a run given --batch_size or a --config YAML file, another model, or None."""
  if (args is None or args.model != MODEL_NAME or getattr(args, "config", None)
      or getattr(args, "batch_size", None) is not None):
    return []
  from lev_jax.eval.lm_eval_adapter import DEFAULT_BATCH_SIZE  # pylint: disable=import-outside-toplevel
  return ["--batch_size", str(dict(args.model_args or {}).get("batch_size",
                                                               DEFAULT_BATCH_SIZE))]


def include_path_problem(args) -> str | None:
  """`--include_path=PATH: no such folder ...` for a local --include_path that does not
  exist (lm-eval only says its tasks are not found); None otherwise."""
  path = getattr(args, "include_path", None)
  if not path or "://" in str(path) or os.path.exists(os.path.expanduser(str(path))):
    return None
  return (f"--include_path={path}: no such folder; expected a folder of lm-eval task YAML "
          "files, e.g. lev_jax/lm_eval_tasks")


def output_path_problem(output_path: str) -> str | None:
  """The one line for a local --output_path lm-eval's results cannot go to, before it
  starts: NAME.json (`place_results` renames the results onto it) a device such as
  /dev/full, a dangling symbolic link, or in a folder where no file can be created
  (common.output_file_error); a folder path that is a file or cannot be created
  (common.folder_output_error). None otherwise, or for a remote one."""
  from lev_jax.cli import common  # pylint: disable=import-outside-toplevel
  if output_path.endswith(".json"):
    return common.output_file_error(f"--output_path={output_path}", output_path)
  # newcomer pass 7: a run's folder got lm-eval's <id>/results_<time>.json inside it
  return (common.run_folder_error("--output_path", output_path)
          or common.folder_output_error("--output_path", output_path))


def model_args_problem(args) -> str | None:
  """The one line for the first mistake in the --model_args of a `--model lev_jax` run,
  before the Hub probe and before lm-eval loads anything; None when there is none, for
  another --model, or when a --config YAML file may give the model_args.

  In order: an unknown key (the adapter's MODEL_ARGS listed; PASSED_BY_LM_EVAL accepted),
  no checkpoint=, a local checkpoint that is no folder or neither a workdir nor an
  export (`inference.source_error`), step not an integer >= 0 or not saved in a local
  checkpoint (`inference.step_error`), max_len not an integer >= 1, dtype not float32,
  bfloat16 or float16, batch_size (model_args, else --batch_size) not an integer >= 1
  or auto. `args`: `_parsed`'s Namespace (model_args: lm-eval's dict, values typed).
  """
  from lev_jax.config import DTYPES  # pylint: disable=import-outside-toplevel
  from lev_jax.eval import lm_eval_adapter as adapter  # pylint: disable=import-outside-toplevel
  given = dict(getattr(args, "model_args", None) or {})
  if args.model != MODEL_NAME or (getattr(args, "config", None) and not given):
    return None
  unknown = [k for k in given if k not in adapter.MODEL_ARGS + adapter.PASSED_BY_LM_EVAL]
  if unknown:
    close = difflib.get_close_matches(unknown[0], adapter.MODEL_ARGS, n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    return (f"--model_args {unknown[0]}={given[unknown[0]]}: unknown key ({hint}the "
            f"lev_jax model takes {', '.join(adapter.MODEL_ARGS)}; lm-eval's "
            f"{', '.join(adapter.PASSED_BY_LM_EVAL)} are accepted and ignored)")
  if "checkpoint" not in given:
    return ("--model_args: no checkpoint=PATH (a lev-train workdir or lev-export folder), "
            "e.g. --model_args checkpoint=runs/smoke_leviathan")
  if not str(given["checkpoint"]).strip():  # newcomer pass 13: taken as the current folder
    return ("--model_args checkpoint= is empty (an unset shell variable?); expected a "
            "lev-train workdir or lev-export folder, e.g. checkpoint=runs/smoke_leviathan")
  problem = _checkpoint_problem(str(given["checkpoint"]))
  if problem:
    return f"--model_args checkpoint={given['checkpoint']}: {problem}"
  step = _integral(given.get("step", 0))
  if isinstance(step, bool) or not isinstance(step, int) or step < 0:
    return (f"--model_args step={step}: expected an integer >= 0 (a saved step; leave it "
            "out for the latest)")
  problem = "step" in given and _step_problem(str(given["checkpoint"]), step)
  if problem:
    return f"--model_args step={step}: {problem}"
  max_len = _integral(given.get("max_len", 1))
  if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
    return (f"--model_args max_len={max_len}: expected an integer >= 1 (tokens per forward "
            "pass; leave it out for the config's train.seq_len)")
  if given.get("dtype", DTYPES[0]) not in DTYPES:
    return (f"--model_args dtype={given['dtype']}: expected one of {', '.join(DTYPES)} "
            "(leave it out for the saved dtype)")
  where = "--model_args batch_size" if "batch_size" in given else "--batch_size"
  size = _integral(given.get("batch_size", getattr(args, "batch_size", None)))
  try:
    adapter.parse_batch_size(size)
  except ValueError:
    return f"{where}={size}: expected an integer >= 1 or 'auto'"
  return None


def _integral(value):
  """`value` as an int when it is a float holding one: lm-eval reads "-1" in model_args
  as -1.0, which the user did not type (echoed in errors; a step of 2.0 is step 2)."""
  if isinstance(value, float) and value.is_integer():
    return int(value)
  return value


HELP_USAGE = """\
`lev-lm-eval`: lm-evaluation-harness tasks on a lev_jax model (lm-eval's `run` command
with `--model lev_jax`, lev_jax/eval/lm_eval_adapter.py).

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
     "hellaswag_local, ...; the files' folder: $LEV_LM_EVAL_DATA (docs/evaluation.md)."),
    ("--batch_size=16", "Rows per forward pass (default 8; 'auto' = 8)."),
    ("--num_fewshot=0", "Examples in the few-shot context."),
    ("--limit=100", "At most this many documents per task (for a quick look)."),
    ("--output_path=results/lm_eval.json", "Write the results there (a .json path: that "
     "file; samples beside it as samples_<task>_<time>.jsonl); a folder (not a run's "
     "own): lm-eval's FOLDER/<model>/results_<time>.json, <model> a random id for "
     "checkpoint= model_args. The path is printed."),
    ("--log_samples", "Also save each document's requests and answers."),
)


# lm-eval writes `--output_path=DIR/NAME.json`'s results to DIR/NAME_<time>.json
# (EvaluationTracker.save_results_aggregated; <time>: isoformat with ":" -> "-").
_STAMP = r"_\d{4}-\d\d-\d\dT\d\d-\d\d-\d\d(\.\d+)?\.json"


def stamped_results(output_path: str) -> set[str]:
  """The names of the files `NAME_<time>.json` beside the local `output_path`
  (DIR/NAME.json) that lm-eval writes for it; an empty set when DIR is missing."""
  folder, name = os.path.split(os.path.abspath(os.path.expanduser(output_path)))
  stamped = re.compile(re.escape(name[:-len(".json")]) + _STAMP + "$")
  if not os.path.isdir(folder):
    return set()
  return {n for n in os.listdir(folder) if stamped.match(n)}


def results_files(output_path: str) -> set[str]:
  """The paths of lm-eval's FOLDER/<model>/results_<time>.json files under the local
  folder `output_path`; an empty set before any was written."""
  path = os.path.abspath(os.path.expanduser(output_path))
  stamped = re.compile("results" + _STAMP + "$")
  if not os.path.isdir(path):
    return set()
  return {os.path.join(path, d, n) for d in os.listdir(path)
          if os.path.isdir(os.path.join(path, d))
          for n in os.listdir(os.path.join(path, d)) if stamped.match(n)}


def place_results(output_path: str, before: set[str]) -> bool:
  """Renames the results file lm-eval just wrote for `--output_path=DIR/NAME.json` (the
  one `NAME_<time>.json` not in `before`, `stamped_results` before the run) to
  DIR/NAME.json itself, as `--help` says (replacing an earlier one); whether it did.
  Nothing when lm-eval wrote none (e.g. nothing evaluated)."""
  path = os.path.abspath(os.path.expanduser(output_path))
  new = sorted(stamped_results(output_path) - before)
  if new:
    os.replace(os.path.join(os.path.dirname(path), new[-1]), path)
  return bool(new)


def quiet_pool_fork_warning() -> None:
  """Silences JAX's "os.fork() was called ... will likely lead to a deadlock" warning
  for the forks of a multiprocessing Pool only (the warning names
  multiprocessing.popen_fork as its caller), not for any other fork.

  lm-eval computes its standard errors in a Pool (lm_eval/api/metrics.py,
  `bootstrap_stderr`), whose workers Linux forks from this process, where JAX's threads
  run. The workers only run lm-eval's pure-Python statistics (`_bootstrap_internal`:
  random.choices, sum, math.exp) and never call into JAX or XLA, so no lock a JAX thread
  may hold is taken in them, and Python re-creates its own locks (the GIL, imports,
  logging) in a forked child: the deadlock JAX warns of cannot happen there. (Turning
  the Pool off, DISABLE_MULTIPROC, would run the bootstrap on one core.)
  """
  import warnings  # pylint: disable=import-outside-toplevel
  warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called",
                          category=RuntimeWarning, module=r"multiprocessing\.popen_fork")


def usage() -> str:
  """`lev-lm-eval --help`: examples and the lm-eval flags that matter here."""
  from lev_jax.cli.common import help_row  # pylint: disable=import-outside-toplevel
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
  Output into a closed pipe (`lev-lm-eval --help | head -1`) ends quietly, exit 141.
  Ctrl-C ends it with one line, exit 130 (lev_jax.cli.interrupt), never a traceback.
  """
  from lev_jax.cli.common import ending_closed_pipe_quietly  # pylint: disable=import-outside-toplevel
  interrupt.started()
  try:
    with ending_closed_pipe_quietly():
      _run(list(sys.argv[1:] if argv is None else argv))
  except KeyboardInterrupt:
    print("lev-lm-eval: interrupted (Ctrl-C); stopped", file=sys.stderr)
    interrupt.exit_now(interrupt.INTERRUPTED_EXIT)


def _unwrapped(text: str) -> str:
  """`text` without the quotes of a repr that wraps it whole ("'msg'" -> "msg"); a
  message that merely starts or ends with a quoted word ("... or 'auto'") is kept."""
  if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"" and text[0] not in text[1:-1]:
    return text[1:-1]
  return text


# lev_jax/lm_eval_tasks' task names and their tag: --include_path is added for them.
_OWN_TASKS = {*lm_eval_tasks.LOCAL_TWIN.values(), lm_eval_tasks.TAG}


def _run(argv: list[str]) -> None:
  from lm_eval.__main__ import cli_evaluate  # pylint: disable=import-outside-toplevel
  from lev_jax.cli.common import backend_error, checkpoint_tree_error  # pylint: disable=import-outside-toplevel

  if not argv or argv[0] in ("-h", "--help"):
    print(usage())
    sys.exit(0)
  has_model = any(a in ("--model", "-M") or a.startswith("--model=") for a in argv)
  if argv[0] not in ("ls", "validate") and not has_model:
    argv += ["--model", MODEL_NAME]
  args = _parsed(argv)
  if args and args.tasks and not args.include_path and set(args.tasks) & _OWN_TASKS:
    # lev_jax's own *_local tasks: their folder, which lm-eval does not index itself
    # (it said "Tasks not found: hellaswag_local" without --include_path)
    argv += ["--include_path", str(lm_eval_tasks.TASKS_DIR)]
    args.include_path = str(lm_eval_tasks.TASKS_DIR)
  requested = args and args.tasks and (list(args.tasks), args.include_path,
                                       getattr(args, "output_path", None))
  problem = args and (model_args_problem(args) or _tasks_problem(args)
                      or run_flags_problem(args) or include_path_problem(args))
  problem = problem or (requested and requested[2] and (checkpoint_tree_error(
      "--output_path", requested[2]) or output_path_problem(requested[2])))
  problem = problem or (requested and (data_problem(*requested[:2]) or backend_error()))
  if problem:  # before lm-eval indexes its tasks and loads the model
    print(f"lev-lm-eval: error: {problem}", file=sys.stderr)
    sys.exit(2)
  output = requested and requested[2]
  local = bool(output) and "://" not in output
  exact = local and output.endswith(".json")
  before = (stamped_results(output) if exact else results_files(output) if local
            else set())
  sys.argv = ["lm-eval", *argv, *batch_size_args(args)]
  quiet_pool_fork_warning()
  try:
    cli_evaluate()
    if exact:
      placed = place_results(output, before)
      written = [os.path.abspath(os.path.expanduser(output))] if placed else []
    else:
      written = sorted(results_files(output) - before) if local else []
    for path in written:  # lm-eval logs "Saving results aggregated" without the path
      print(f"lev-lm-eval: results -> {path}", file=sys.stderr)
  except ValueError as e:  # InferenceError and our other input errors: one line
    lines = _unwrapped(str(e).strip()).splitlines() or [type(e).__name__]
    print(f"lev-lm-eval: error: {lines[0]}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
  run()
