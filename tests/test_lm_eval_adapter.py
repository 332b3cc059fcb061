"""The lm-eval model "lev_jax": real lm_eval Instances give the Scorer's numbers, the
model loads from model_args, and one offline simple_evaluate on a local task."""

import json
import os
import random

import pytest

lm_eval = pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.api.registry import get_model  # noqa: E402
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window  # noqa: E402

from conftest import byte_config  # noqa: E402
from lev_jax import inference  # noqa: E402
from lev_jax import lm_eval_adapter  # noqa: E402
from lev_jax.data.tokenizer import ByteTokenizer  # noqa: E402
from lev_jax.lm_eval_adapter import LevJaxLM  # noqa: E402
from lev_jax.scoring import Scorer, windows  # noqa: E402
from lev_jax.train import create_model  # noqa: E402
from test_downstream import Bigram  # noqa: E402

TOK = ByteTokenizer()


def instances(kind, args):
  return [Instance(kind, {}, a, i) for i, a in enumerate(args)]


@pytest.fixture(scope="module")
def export(tmp_path_factory):
  """A tiny Decoder over bytes, written as a lev-export folder at step 7."""
  config = byte_config("tied")
  model = create_model(config)
  path = tmp_path_factory.mktemp("lm_eval") / "export"
  inference.save(inference.InferenceModel(model, config, TOK, 7), path)
  return path, model, config


def test_windows_equal_lm_eval_rolling_windows():
  rng = random.Random(0)
  for n in [1, 3, 4, 5, 9, 16, 17, 40]:
    for max_len in [1, 2, 4, 7, 16]:
      ids = [rng.randrange(3, 259) for _ in range(n)]
      want = [make_disjoint_window(w) for w in
              get_rolling_token_windows(ids, prefix_token=1, max_seq_len=max_len,
                                        context_len=1)]
      assert windows([1], ids, max_len) == [tuple(w) for w in want], (n, max_len)


def test_instances_give_the_scorers_numbers():
  lm = LevJaxLM(model=Bigram(), tokenizer=TOK, max_len=16, batch_size=3)
  scorer = Scorer(Bigram(), TOK, max_len=16, batch_size=2)
  pairs = [("the aq", " zzz"), ("", "abc"), ("x ", "y"), ("q" * 30, " zz")]
  got = lm.loglikelihood(instances("loglikelihood", pairs))
  want = scorer.loglikelihood(pairs)
  assert [g for _, g in got] == [w for _, w in want] == [True, False, False, True]
  assert [ll for ll, _ in got] == pytest.approx([ll for ll, _ in want], abs=1e-5)
  texts = ["zzzz " * 9, "a"]
  got = lm.loglikelihood_rolling(instances("loglikelihood_rolling", [(t,) for t in texts]))
  assert got == pytest.approx(scorer.loglikelihood_rolling(texts), abs=1e-4)


def test_model_args_load_the_checkpoint_and_generate(export):
  path, model, config = export
  # lm-eval's CLI always adds batch_size=1; model_args' batch_size wins, no TypeError.
  lm = get_model("lev_jax").create_from_arg_string(
      f"checkpoint={path},batch_size=2,dtype=float32",
      {"batch_size": 1, "max_batch_size": None, "device": "cpu"})
  assert isinstance(lm, LevJaxLM) and lm.step == 7 and lm.scorer.batch_size == 2
  assert lm.scorer.max_len == config.train.seq_len
  pytest.importorskip("lev_jax.decode")
  reqs = [("Once", {"until": ["\n"], "max_gen_toks": 4}), ("ab", {"max_gen_toks": 4})]
  got = lm.generate_until(instances("generate_until", reqs))
  assert got == lm.scorer.generate_until(reqs)  # Scorer.generate_until: test_scoring.py
  assert all(isinstance(g, str) and "\n" not in g for g in got)


def test_construction_errors():
  with pytest.raises(ValueError, match="give checkpoint=PATH"):
    LevJaxLM()
  with pytest.raises(ValueError, match="give checkpoint=PATH"):
    LevJaxLM(checkpoint="x", model=Bigram(), tokenizer=TOK)
  with pytest.raises(ValueError, match="batch_size = 'big'"):
    LevJaxLM(model=Bigram(), tokenizer=TOK, max_len=8, batch_size="big")
  assert LevJaxLM(model=Bigram(), tokenizer=TOK, max_len=8,
                  batch_size="auto").scorer.batch_size == lm_eval_adapter.DEFAULT_BATCH_SIZE


def test_run_adds_the_model_and_calls_lm_evals_cli(monkeypatch):
  import lm_eval.__main__ as cli
  seen = []
  monkeypatch.setattr(cli, "cli_evaluate", lambda: seen.append(list(os.sys.argv)))
  monkeypatch.setattr(os.sys, "argv", ["x"])
  lm_eval_adapter.run(["--model_args", "checkpoint=runs/a", "--tasks", "piqa"])
  lm_eval_adapter.run(["ls", "tasks"])
  assert seen == [["lm-eval", "--model_args", "checkpoint=runs/a", "--tasks", "piqa",
                   "--model", "lev_jax"], ["lm-eval", "ls", "tasks"]]


def test_simple_evaluate_on_a_local_task_offline(export, tmp_path, monkeypatch):
  """Registry name + model_args string + a task read from a local JSON file: no network
  (datasets / hub offline; the datasets cache in tmp_path; only this task is indexed)."""
  import datasets.config
  import huggingface_hub.constants
  from lm_eval.tasks import TaskManager
  # datasets reads its environment at import (lm_eval has imported it): patch the values.
  monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
  monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
  monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
  path, model, config = export
  rows = [{"q": "Question: one\nAnswer:", "choices": ["yes", "no way"], "gold": 0},
          {"q": "Question: two\nAnswer:", "choices": ["abc", "b"], "gold": 1},
          {"q": "Question: three\nAnswer:", "choices": ["x", "yz", "w"], "gold": 2}]
  data = tmp_path / "mini.jsonl"
  data.write_text("".join(json.dumps(r) + "\n" for r in rows))
  (tmp_path / "tasks").mkdir()
  (tmp_path / "tasks" / "mini.yaml").write_text(f"""task: lev_mini
dataset_path: json
dataset_kwargs:
  cache_dir: {tmp_path / "hf"}
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{q}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{gold}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
""")
  tm = TaskManager(include_path=str(tmp_path / "tasks"), include_defaults=False)
  out = lm_eval.simple_evaluate(model="lev_jax", model_args=f"checkpoint={path}",
                                tasks=["lev_mini"], batch_size=2, task_manager=tm,
                                log_samples=True, bootstrap_iters=0)
  # lm-eval's per-choice log-likelihoods are the Scorer's on the in-memory model, and
  # its acc / acc_norm follow from them.
  scorer = Scorer(model, TOK, config=config)
  acc, acc_norm = [], []
  for sample in sorted(out["samples"]["lev_mini"], key=lambda s: s["doc_id"]):
    r = rows[sample["doc_id"]]
    lls = [ll for ll, _ in scorer.loglikelihood([(r["q"], " " + c) for c in r["choices"]])]
    assert [float(resp[0][0]) for resp in sample["resps"]] == pytest.approx(lls, abs=1e-5)
    norm = [ll / len(c) for ll, c in zip(lls, r["choices"])]
    acc.append(lls.index(max(lls)) == r["gold"])
    acc_norm.append(norm.index(max(norm)) == r["gold"])
  res = out["results"]["lev_mini"]
  assert res["acc,none"] == pytest.approx(sum(acc) / 3)
  assert res["acc_norm,none"] == pytest.approx(sum(acc_norm) / 3)
