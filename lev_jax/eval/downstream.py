"""Zero-shot multiple-choice benchmarks read from their released files, scored like
lm-evaluation-harness 0.4 (prompts, preprocessing and metrics of its task configs).

  items = read_task("hellaswag", "hellaswag_val.jsonl")
  evaluate_task(scorer, "hellaswag", "hellaswag_val.jsonl")
      -> {"task", "n", "acc", "acc_stderr", "acc_norm", "acc_norm_stderr", "file"}

Files (downloaded by the user; nothing here touches the network):
  lambada        OpenAI's lambada_test.jsonl ({"text": ...} per line), or the original
                 plain-text release (one passage per line; any name not ending .jsonl)
  hellaswag      rowanz/hellaswag data/hellaswag_val.jsonl (ctx_a, ctx_b, activity_label,
                 endings[4], label)
  piqa           ybisk/piqa valid.jsonl (goal, sol1, sol2) + valid-labels.lst (one 0/1 per
                 line; found beside the data as <stem>-labels.lst, or read_piqa's labels:
                 lev-eval's --config.eval.downstream.piqa_labels=PATH)
  arc_easy,      ARC-V1-Feb2018 ARC-Easy/ARC-Easy-Test.jsonl and ARC-Challenge/...jsonl
  arc_challenge  ({"question": {"stem", "choices": [{"text", "label"}]}, "answerKey"})
  winogrande     winogrande_1.1 dev.jsonl (sentence with one "_", option1, option2,
                 answer "1" / "2")

Prompts (lm_eval/tasks/<task>/*.yaml, utils.py; target delimiter " "):
  lambada     context = text up to its last space, continuation = " " + last word
  hellaswag   activity_label + ": " + ctx_a + " " + ctx_b.capitalize(), preprocessed;
              continuations " " + preprocessed ending
  piqa        "Question: {goal}\\nAnswer:", continuations " " + sol1 / " " + sol2
  arc_*       "Question: {stem}\\nAnswer:", continuations " " + choice text
  winogrande  partial evaluation: contexts sentence[:i] + option (i = index of "_"),
              one shared continuation " " + sentence[i + 1:].strip()

Metrics: acc = mean [argmax_j ll_j == gold]; acc_norm = mean [argmax_j ll_j / len(c_j)
== gold] with len(c_j) the characters of choice j's text without the leading space
(lm-eval's acc_norm, lm_eval/api/task.py ``process_results``); for winogrande the
continuation is shared, so acc_norm = acc (lm-eval reports only acc there). Standard errors are lm-eval's
sample standard error of the mean, sqrt(var(x, ddof=1) / n) (None when n < 2).
lambada reports acc = the share of passages whose last word is the greedy continuation
(lm-eval is_greedy) and perplexity = exp(-mean ll per passage); its stderr is the delta
method on the mean ll, perplexity * stderr(ll) (lm-eval bootstraps it instead).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
from tqdm import tqdm

from lev_jax import progress as progress_logs
from lev_jax.workdir import read_small_text


class DownstreamError(ValueError):
  """A benchmark file that cannot be read; the message names the file, the line and
  what was expected."""


@dataclasses.dataclass(frozen=True)
class Item:
  """One question: choice j is scored as log p(continuation_j | context_j).

  Attributes:
    requests: (context, continuation) per choice.
    choices: the answer text per choice, without the " " delimiter (lm-eval's
      doc_to_choice); acc_norm divides by its length in characters.
    gold: index of the correct choice.
    line: 1-based line of the item in its file (for messages).
  """
  requests: tuple[tuple[str, str], ...]
  choices: tuple[str, ...]
  gold: int
  line: int


def _item(context: str, choices: Sequence[str], gold: int, line: int) -> Item:
  """One context, continuations " " + choice (lm-eval's target delimiter)."""
  return Item(tuple((context, " " + c) for c in choices), tuple(choices), gold, line)


# --- reading ---------------------------------------------------------------------

# Most bytes read from a benchmark file (the released ones are 1 to 12 MB): a mistaken
# huge file is refused, not read whole.
TASK_FILE_LIMIT = 256 << 20


def _open_lines(path) -> list[str]:
  """The lines of the UTF-8 file `path`, at most TASK_FILE_LIMIT bytes.

  Raises:
    DownstreamError: no such file, not a regular file (a device such as /dev/zero, a
      folder), too large, unreadable, not UTF-8 (the file named).
  """
  p = Path(path)
  if not p.exists():
    raise DownstreamError(f"{p}: no such file")
  if not p.is_file():
    raise DownstreamError(f"{p}: not a regular file; expected a benchmark's JSONL file")
  try:
    return read_small_text(p, TASK_FILE_LIMIT).splitlines()
  except (OSError, ValueError) as e:  # too large, not UTF-8
    raise DownstreamError(f"{p}: cannot read as UTF-8 text ({e})") from e


def _jsonl(path) -> Iterator[tuple[int, dict]]:
  """(line number, object) of every non-blank line of a JSON-lines file."""
  for n, line in enumerate(_open_lines(path), 1):
    if not line.strip():
      continue
    try:
      obj = json.loads(line)
    except json.JSONDecodeError as e:
      # e.msg may end in "at" ("Unterminated string starting at"): the column follows.
      raise DownstreamError(f"{path}:{n}: malformed JSON ({e.msg}: column {e.colno}); "
                            "expected one JSON object per line") from e
    if not isinstance(obj, dict):
      raise DownstreamError(f"{path}:{n}: a JSON {type(obj).__name__}; expected an object")
    yield n, obj


def _field(obj: dict, key: str, path, n: int, kind=str):
  if key not in obj:
    raise DownstreamError(f"{path}:{n}: missing field {key!r}; fields present: "
                          f"{sorted(obj)}")
  value = obj[key]
  if not isinstance(value, kind):
    raise DownstreamError(f"{path}:{n}: field {key!r} = {value!r}: expected "
                          f"{getattr(kind, '__name__', kind)}")
  return value


def _nonempty(items: list[Item], path, what: str) -> list[Item]:
  if not items:
    raise DownstreamError(f"{path}: no items; expected {what}")
  return items


def _lambada_split(text: str, path, n: int) -> tuple[str, str]:
  """lm-eval lambada: (text without its last word, the last word)."""
  text = text.rstrip("\n")
  if " " not in text.strip():
    raise DownstreamError(f"{path}:{n}: passage {text[:60]!r} has no space; expected "
                          "a passage whose last space-separated word is the target")
  context, word = text.rsplit(" ", 1)
  if not word:
    raise DownstreamError(f"{path}:{n}: passage ends with a space; expected the target "
                          "word after the last space")
  return context, word


def read_lambada(path) -> list[Item]:
  """LAMBADA passages: OpenAI's *.jsonl ({"text"} per line) or the plain-text release
  (one passage per line). One request each, gold 0."""
  items = []
  if str(path).endswith(".jsonl"):
    for n, obj in _jsonl(path):
      context, word = _lambada_split(_field(obj, "text", path, n), path, n)
      items.append(_item(context, [word], 0, n))
  else:
    for n, line in enumerate(_open_lines(path), 1):
      if line.strip():
        context, word = _lambada_split(line, path, n)
        items.append(_item(context, [word], 0, n))
  return _nonempty(items, path, "one passage per line")


def hellaswag_preprocess(text: str) -> str:
  """lm-eval's hellaswag preprocess: strip, " [title]" -> ". ", drop "[...]" tags (WikiHow
  artifacts), collapse double spaces once."""
  text = text.strip()
  text = text.replace(" [title]", ". ")
  text = re.sub(r"\[.*?\]", "", text)
  return text.replace("  ", " ")


def read_hellaswag(path) -> list[Item]:
  """rowanz HellaSwag *.jsonl with labels (train / val)."""
  items = []
  for n, obj in _jsonl(path):
    ctx = _field(obj, "ctx_a", path, n) + " " + _field(obj, "ctx_b", path, n).capitalize()
    query = hellaswag_preprocess(_field(obj, "activity_label", path, n) + ": " + ctx)
    endings = _field(obj, "endings", path, n, list)
    if len(endings) < 2 or not all(isinstance(e, str) for e in endings):
      raise DownstreamError(f"{path}:{n}: endings = {endings!r}: expected a list of at "
                            "least 2 strings")
    gold = _label(obj, "label", len(endings), path, n)
    items.append(_item(query, [hellaswag_preprocess(e) for e in endings], gold, n))
  return _nonempty(items, path, "HellaSwag JSON lines")


def _label(obj: dict, key: str, n_choices: int, path, n: int) -> int:
  """An int (or int-string) label in [0, n_choices)."""
  value = _field(obj, key, path, n, (int, str))
  try:
    gold = int(value)
  except ValueError:
    gold = -1
  if isinstance(value, bool) or not 0 <= gold < n_choices:
    raise DownstreamError(f"{path}:{n}: {key} = {value!r}: expected an integer in "
                          f"[0, {n_choices})")
  return gold


def read_piqa_labels(labels: Path, n_items: int, data: Path) -> list[int]:
  """PIQA's labels file: one 0 or 1 per line (blank lines skipped), one per data item.

  Raises:
    DownstreamError: a missing file, a label that is not 0 or 1 (file:line), or a count
      that differs from n_items (the items of `data`).
  """
  gold = []
  for n, line in enumerate(_open_lines(labels), 1):
    if not line.strip():
      continue
    if line.strip() not in ("0", "1"):
      raise DownstreamError(f"{labels}:{n}: label {line.strip()!r}: expected 0 or 1")
    gold.append(int(line))
  if len(gold) != n_items:
    raise DownstreamError(f"{labels}: {len(gold)} labels for {n_items} items in {data}; "
                          "expected one label per item, in order")
  return gold


def read_piqa(path, labels=None) -> list[Item]:
  """PIQA goal/sol1/sol2 *.jsonl with its labels file (one 0 or 1 per line; default
  <stem>-labels.lst beside the data, e.g. valid.jsonl -> valid-labels.lst; lev-eval
  passes config.eval.downstream.piqa_labels as `labels`).

  Raises:
    DownstreamError: no data file (named first), no labels file (naming the lev-eval
      flag that gives one), a bad label or item, or labels and items that differ in
      number.
  """
  p = Path(path)
  rows = list(_jsonl(p))  # a missing data file is named as such, not as missing labels
  default = p.with_name(p.name.split(".")[0] + "-labels.lst")
  labels = Path(labels) if labels else default
  if not labels.is_file():
    raise DownstreamError(f"{labels}: no such labels file for {p}; expected one label "
                          f"(0 or 1) per line, beside the data as {default.name} or given "
                          "with --config.eval.downstream.piqa_labels=PATH")
  gold = read_piqa_labels(labels, len(rows), p)
  items = []
  for (n, obj), g in zip(rows, gold):
    context = f"Question: {_field(obj, 'goal', p, n)}\nAnswer:"
    sols = (_field(obj, "sol1", p, n), _field(obj, "sol2", p, n))
    items.append(_item(context, sols, g, n))
  return _nonempty(items, p, "PIQA JSON lines")


def arc_answer_label(key: str, labels: Sequence[str]) -> str | None:
  """The choice label an ARC answerKey names: the key itself, else its digit <-> letter
  twin (1 <-> A, ..., 9 <-> I: ARC mixes the two), else None."""
  if key in labels:
    return key
  alt = ({str(i): chr(64 + i) for i in range(1, 10)} |
         {chr(64 + i): str(i) for i in range(1, 10)}).get(key)
  return alt if alt in labels else None


def read_arc(path) -> list[Item]:
  """ARC-V1-Feb2018 *.jsonl (Easy or Challenge); answerKey is one of the choice labels
  (letters or digits; a digit key against letter labels or the reverse is mapped
  1 <-> A)."""
  items = []
  for n, obj in _jsonl(path):
    q = _field(obj, "question", path, n, dict)
    stem = _field(q, "stem", path, n)
    choices = _field(q, "choices", path, n, list)
    if len(choices) < 2 or not all(isinstance(c, dict) for c in choices):
      raise DownstreamError(f"{path}:{n}: question.choices = {choices!r}: expected a list "
                            "of at least 2 {\"text\", \"label\"} objects")
    texts = [_field(c, "text", path, n) for c in choices]
    labels = [str(_field(c, "label", path, n, (str, int))) for c in choices]
    key = str(_field(obj, "answerKey", path, n, (str, int))).strip()
    label = arc_answer_label(key, labels)
    if label is None:
      raise DownstreamError(f"{path}:{n}: answerKey = {key!r}: expected one of the choice "
                            f"labels {labels}")
    gold = labels.index(label)
    context = f"Question: {stem}\nAnswer:"
    items.append(_item(context, texts, gold, n))
  return _nonempty(items, path, "ARC JSON lines")


def read_winogrande(path) -> list[Item]:
  """WinoGrande *.jsonl with answers (train_* / dev): lm-eval's partial evaluation."""
  items = []
  for n, obj in _jsonl(path):
    sentence = _field(obj, "sentence", path, n)
    if sentence.count("_") != 1:
      raise DownstreamError(f"{path}:{n}: sentence {sentence!r} has "
                            f"{sentence.count('_')} '_'; expected exactly one blank")
    options = (_field(obj, "option1", path, n), _field(obj, "option2", path, n))
    answer = str(_field(obj, "answer", path, n, (str, int))).strip()
    if answer not in ("1", "2"):
      raise DownstreamError(f"{path}:{n}: answer = {obj['answer']!r}: expected \"1\" or "
                            "\"2\"")
    i = sentence.index("_")
    target = sentence[i + 1:].strip()
    items.append(Item(tuple((sentence[:i] + o, " " + target) for o in options),
                      (target, target), int(answer) - 1, n))
  return _nonempty(items, path, "WinoGrande JSON lines")


TASKS: dict[str, Callable[..., list[Item]]] = {
    "lambada": read_lambada,
    "hellaswag": read_hellaswag,
    "piqa": read_piqa,
    "arc_easy": read_arc,
    "arc_challenge": read_arc,
    "winogrande": read_winogrande,
}


def read_task(name: str, path, **opts) -> list[Item]:
  """The items of benchmark `name` read from its released file `path`.

  Args:
    name: a key of TASKS.
    opts: reader options (piqa: labels, the labels file's path).
  Raises:
    DownstreamError: unknown task, or a file that does not hold the task's format
      (the message names file, line and the expected form).
  """
  if name not in TASKS:
    raise DownstreamError(f"unknown task {name!r}; expected one of {sorted(TASKS)}")
  return TASKS[name](path, **opts)


# --- metrics ---------------------------------------------------------------------

def mean_stderr(x: Sequence[float]) -> float | None:
  """Sample standard error of the mean, sqrt(var(x, ddof=1) / n) (lm-eval
  `mean_stderr`); None when n < 2."""
  x = np.asarray(x, np.float64)
  if x.size < 2:
    return None
  return float(np.sqrt(x.var(ddof=1) / x.size))


def choice_metrics(lls: Sequence[Sequence[float]], items: Sequence[Item]) -> dict:
  """acc and acc_norm (ll / characters of the choice text) with standard errors.

  Args:
    lls: log-likelihood (nats) of each item's choices.
  Ties go to the first choice (numpy argmax, as lm-eval).
  """
  correct, correct_norm = [], []
  for ll, item in zip(lls, items):
    ll = np.asarray(ll, np.float64)
    lengths = np.array([float(len(c)) for c in item.choices])
    correct.append(float(np.argmax(ll) == item.gold))
    correct_norm.append(float(np.argmax(ll / np.maximum(lengths, 1.0)) == item.gold))
  return {"acc": float(np.mean(correct)), "acc_stderr": mean_stderr(correct),
          "acc_norm": float(np.mean(correct_norm)),
          "acc_norm_stderr": mean_stderr(correct_norm)}


def lambada_metrics(results: Sequence[tuple[float, bool]]) -> dict:
  """Last-word accuracy (is_greedy) and perplexity exp(-mean ll) with standard errors
  (perplexity: delta method, perplexity * stderr of the mean ll)."""
  ll = np.array([r[0] for r in results], np.float64)
  greedy = np.array([float(r[1]) for r in results])
  ppl = math.exp(-float(ll.mean()))
  se_ll = mean_stderr(ll)
  return {"acc": float(greedy.mean()), "acc_stderr": mean_stderr(greedy),
          "acc_norm": None, "acc_norm_stderr": None, "perplexity": ppl,
          "perplexity_stderr": None if se_ll is None else ppl * se_ll}


# --- evaluation ------------------------------------------------------------------

def evaluate_task(scorer, name: str, path, limit: int | None = None, **opts) -> dict:
  """Scores benchmark `name` from `path` with `scorer.loglikelihood`.

  Args:
    scorer: a `lev_jax.eval.scoring.Scorer` (anything with the same loglikelihood).
    limit: score only the first `limit` items.
    opts: reader options (see read_task).
  Returns:
    {"task", "n", "acc", "acc_stderr", "acc_norm", "acc_norm_stderr", "file"}; lambada
    adds "perplexity" and "perplexity_stderr" (acc_norm None). Standard errors are
    None when n < 2.
  Raises:
    DownstreamError: from read_task; limit < 1.
  """
  return score_items(scorer, name, _limited(read_task(name, path, **opts), limit), path)


def _limited(items: list[Item], limit: int | None) -> list[Item]:
  if limit is None:
    return items
  if limit < 1:
    raise DownstreamError(f"limit = {limit}: expected >= 1 or None")
  return items[:limit]


def score_items(scorer, name: str, items: Sequence[Item], path="",
                progress: bool = False) -> dict:
  """The metrics of `evaluate_task` for items already read (all choices of all items
  are scored in one `scorer.loglikelihood` call).

  progress: a tqdm bar on stderr, one per task ("<name>: k/n item", items/s, ETA),
  advanced as each item's last choice is scored (needs a scorer whose loglikelihood
  takes ``on_done``, as `lev_jax.eval.scoring.Scorer`'s does); drawn only when stderr
  is a terminal (into a file, a redrawn bar would be copied around every log line).
  """
  requests = [req for item in items for req in item.requests]
  if not progress:
    results = scorer.loglikelihood(requests)
  else:
    item_of = [k for k, item in enumerate(items) for _ in item.requests]
    left = [len(item.requests) for item in items]
    logs_restored = progress_logs.logs_above_bars()  # log lines above the bar, not on it
    try:
      with tqdm(total=len(items), desc=name, unit="item", file=sys.stderr,
                disable=None) as bar:  # None: on a terminal only (not a file or pipe)
        def on_done(i: int) -> None:
          left[item_of[i]] -= 1
          if not left[item_of[i]]:
            bar.update(1)
        results = scorer.loglikelihood(requests, on_done=on_done)
    finally:
      logs_restored()
  if name == "lambada":
    metrics = lambada_metrics(results)
  else:
    lls, k = [], 0
    for item in items:
      lls.append([ll for ll, _ in results[k:k + len(item.requests)]])
      k += len(item.requests)
    metrics = choice_metrics(lls, items)
  return {"task": name, "n": len(items), **metrics, "file": str(path)}


def evaluate_tasks(scorer, files: dict, limit: int | None = None,
                   options: dict | None = None, progress: bool = False
                   ) -> dict[str, dict]:
  """evaluate_task for every {task name: file path} pair; results keyed by task name.
  Every file is read before any scoring, so a bad file fails fast. `options` maps a
  task name to its reader's keyword arguments (e.g. {"piqa": {"labels": PATH}});
  progress: a progress bar per task on stderr (see `score_items`).
  Raises:
    DownstreamError: as read_task, for the first bad file.
  """
  options = options or {}
  items = {name: _limited(read_task(name, path, **options.get(name, {})), limit)
           for name, path in files.items()}
  return {name: score_items(scorer, name, items[name], files[name], progress=progress)
          for name in files}
