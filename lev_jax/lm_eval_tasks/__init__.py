"""lm-evaluation-harness task YAMLs over the benchmarks' released files (no Hub).

  LEV_LM_EVAL_DATA=/data/benchmarks lev-lm-eval --model_args checkpoint=runs/x \\
      --include_path "$(python -c 'import lev_jax.lm_eval_tasks as t; print(t.TASKS_DIR)')" \\
      --tasks lev_local                 # all six; or e.g. --tasks hellaswag_local,piqa_local

Each `<task>_local` is lm-eval's task of that name (same prompts, choices and metrics)
reading its data from $LEV_LM_EVAL_DATA (lev_local.py) in the released layout:

  lambada_openai_local  lambada_test.jsonl                  (OpenAI)
  hellaswag_local       hellaswag_val.jsonl                 (rowanz/hellaswag data/)
  piqa_local            piqa/valid.jsonl, piqa/valid-labels.lst   (ybisk/piqa)
  arc_easy_local        ARC-Easy/ARC-Easy-Test.jsonl        (ARC-V1-Feb2018)
  arc_challenge_local   ARC-Challenge/ARC-Challenge-Test.jsonl
  winogrande_local      winogrande_1.1/dev.jsonl            (allenai/winogrande)

the files lev_jax.eval.downstream reads for `lev-eval`. To read a file elsewhere, copy the
YAML and write an absolute path as its `data_file` (the copy keeps working: the
functions it names are imported from lev_jax).
"""

from pathlib import Path

TASKS_DIR = Path(__file__).resolve().parent
TAG = "lev_local"
# lm-eval's task -> its twin here.
LOCAL_TWIN = {name: f"{name}_local" for name in (
    "lambada_openai", "hellaswag", "piqa", "arc_easy", "arc_challenge", "winogrande")}
