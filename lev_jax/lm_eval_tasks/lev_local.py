"""Data for the lm-eval tasks of this folder: the benchmarks' released files, read locally.

`load` is each task's `custom_dataset` (`!function lev_jax.lm_eval_tasks.lev_local.load`
in the YAMLs): lm-eval (0.4) calls it with the task's `dataset_kwargs` (and metadata)
instead of fetching a Hugging Face Hub dataset.

Paths in the YAMLs are relative to the folder named by $LEV_LM_EVAL_DATA (an absolute
path written into a YAML is used as it is). The released formats are those
lev_jax.eval.downstream reads (docs/evaluation.md, "Zero-shot tasks"); the `process_docs`
functions turn a release's rows into the fields lm-eval's own task of the same name reads
from the Hub, so the prompts, choices and metrics are lm-eval's.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import datasets

from lev_jax.eval.downstream import (DownstreamError, _field, _jsonl, arc_answer_label,
                                read_piqa_labels)

DATA_ENV = "LEV_LM_EVAL_DATA"


class _NoMetadataHint(logging.Filter):
  """Drops lm-eval's warning, given for every task with a `custom_dataset`, that custom
  kwargs go in --metadata: these tasks take none (lm_eval/api/task.py, `download`)."""

  def filter(self, record: logging.LogRecord) -> bool:
    message = record.getMessage()
    return not (message.split(":", 1)[0].endswith("_local") and
                "Custom kwargs can be passed to `--metadata`" in message)


logging.getLogger("lm_eval.api.task").addFilter(_NoMetadataHint())


def data_path(name: str) -> Path:
  """`name` under $LEV_LM_EVAL_DATA (or `name` itself when absolute).

  Raises:
    DownstreamError: a relative name with $LEV_LM_EVAL_DATA unset or not a folder (a
      file, or missing), or no such file.
  """
  root = os.environ.get(DATA_ENV, "")
  if not os.path.isabs(name) and not root:
    raise DownstreamError(f"{DATA_ENV} is not set; expected the folder holding {name} "
                          "(the benchmarks' released files; docs/evaluation.md, "
                          "lm-eval tasks)")
  if not os.path.isabs(name) and not os.path.isdir(os.path.expanduser(root)):
    what = "is a file" if os.path.exists(os.path.expanduser(root)) else "does not exist"
    raise DownstreamError(f"{DATA_ENV}={root} {what}; expected the folder holding {name} "
                          "(the benchmarks' released files; docs/evaluation.md)")
  path = Path(os.path.expanduser(root), os.path.expanduser(name))
  if not path.is_file():
    raise DownstreamError(f"{path}: no such file (from {DATA_ENV}={root}); expected the "
                          f"released {Path(name).name}")
  return path


def load(data_file: str, split: str, labels_file: str | None = None,
         fields: list[str] | None = None, **metadata) -> datasets.DatasetDict:
  """{split: the rows of the JSON-lines `data_file`} (lm-eval's `custom_dataset`).

  Args:
    data_file: a JSON-lines file, one object per line (`data_path`).
    split: the split name the task reads (its test_split or validation_split).
    labels_file: PIQA's valid-labels.lst (one 0 or 1 per line;
      lev_jax.eval.downstream.read_piqa_labels), added to the rows as `label`, in order.
    fields: the fields every row must hold (what the task's prompt and process_docs
      read): a row without one is named (file:line), not left to a KeyError or a
      template error deep inside lm-eval.
    metadata: lm-eval's task metadata (version, ...): ignored.
  Raises:
    DownstreamError: a missing file, a malformed line or a row without one of `fields`
      (file:line), or a label count
      that differs from the row count.
  """
  del metadata
  path = data_path(data_file)
  rows = []
  for n, obj in _jsonl(path):
    for key in fields or ():
      _field(obj, key, path, n, object)
    rows.append(obj)
  if labels_file is not None:
    for row, label in zip(rows, read_piqa_labels(data_path(labels_file), len(rows), path)):
      row["label"] = label
  if not rows:
    raise DownstreamError(f"{path}: no rows; expected one JSON object per line")
  return datasets.DatasetDict({split: datasets.Dataset.from_list(rows)})


def arc_docs(dataset: datasets.Dataset) -> datasets.Dataset:
  """ARC-V1-Feb2018 rows ({"question": {"stem", "choices": [{"text", "label"}]},
  "answerKey"}) -> allenai/ai2_arc's fields (question, choices {text, label},
  answerKey). A digit key against letter labels (or the reverse) is mapped 1 <-> A, as
  lev_jax.eval.downstream.read_arc does."""
  def convert(doc):
    choices = doc["question"]["choices"]
    labels = [str(c["label"]) for c in choices]
    key = str(doc["answerKey"]).strip()
    key = arc_answer_label(key, labels) or key
    return {"question": doc["question"]["stem"], "answerKey": key,
            "choices": {"text": [c["text"] for c in choices], "label": labels}}
  return dataset.map(convert, remove_columns=dataset.column_names)
