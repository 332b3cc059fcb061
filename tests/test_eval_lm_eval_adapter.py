"""The lm-eval model "lev_jax": real lm_eval Instances give the Scorer's numbers, the
model loads from model_args, and one offline simple_evaluate on a local task."""

import json
import os
import random
from pathlib import Path

import pytest

lm_eval = pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.api.registry import get_model  # noqa: E402
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window  # noqa: E402

from conftest import byte_config  # noqa: E402
from lev_jax import inference  # noqa: E402
from lev_jax.cli import lm_eval as lm_eval_cli  # noqa: E402
from lev_jax.eval import lm_eval_adapter  # noqa: E402
from lev_jax.data.tokenizer import ByteTokenizer  # noqa: E402
from lev_jax.eval.lm_eval_adapter import LevJaxLM  # noqa: E402
from lev_jax.eval.scoring import Scorer, windows  # noqa: E402
from lev_jax.train import create_model  # noqa: E402
from test_eval_downstream import Bigram  # noqa: E402

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
  with pytest.raises(ValueError, match="no checkpoint=PATH in model_args; unknown keys "
                     "chekpoint, stepp \\(expected checkpoint, step, dtype, batch_size, "
                     "max_len\\)"):  # issue 26: was "give checkpoint=PATH ... not both"
    LevJaxLM(chekpoint="runs/x", stepp=3)
  with pytest.raises(ValueError, match="give checkpoint=PATH"):
    LevJaxLM(checkpoint="x", model=Bigram(), tokenizer=TOK)
  with pytest.raises(ValueError, match="batch_size = 'big'"):
    LevJaxLM(model=Bigram(), tokenizer=TOK, max_len=8, batch_size="big")
  assert LevJaxLM(model=Bigram(), tokenizer=TOK, max_len=8,
                  batch_size="auto").scorer.batch_size == lm_eval_adapter.DEFAULT_BATCH_SIZE


@pytest.fixture
def workdir(tmp_path):
  """A folder the loader takes for a training workdir (it holds checkpoints/)."""
  (tmp_path / "w" / "checkpoints").mkdir(parents=True)
  return str(tmp_path / "w")


def test_run_adds_the_model_and_calls_lm_evals_cli(monkeypatch, workdir):
  import lm_eval.__main__ as cli
  seen = []
  monkeypatch.setattr(cli, "cli_evaluate", lambda: seen.append(list(os.sys.argv)))
  monkeypatch.setattr(lm_eval_cli, "data_problem", lambda tasks, include_path: None)
  monkeypatch.setattr(os.sys, "argv", ["x"])
  lm_eval_cli.run(["--model_args", f"checkpoint={workdir}", "--tasks", "piqa"])
  lm_eval_cli.run(["ls", "tasks"])
  lm_eval_cli.run(["--model_args", f"checkpoint={workdir},batch_size=3", "--tasks", "piqa"])
  lm_eval_cli.run(["--model_args", f"checkpoint={workdir}", "--tasks", "piqa", "-b", "2"])
  # newcomer pass 4: lm-eval passed (and printed) its own default, 1; --help says 8
  assert seen == [["lm-eval", "--model_args", f"checkpoint={workdir}", "--tasks", "piqa",
                   "--model", "lev_jax", "--batch_size", "8"], ["lm-eval", "ls", "tasks"],
                  ["lm-eval", "--model_args", f"checkpoint={workdir},batch_size=3",
                   "--tasks", "piqa", "--model", "lev_jax", "--batch_size", "3"],
                  ["lm-eval", "--model_args", f"checkpoint={workdir}", "--tasks", "piqa",
                   "-b", "2", "--model", "lev_jax"]]


def test_only_the_pools_fork_warning_is_silenced():
  """Newcomer pass 4: every lev-lm-eval run printed JAX's os.fork() warning (lm-eval's
  bootstrap Pool; why it is safe there: quiet_pool_fork_warning)."""
  import warnings
  said = ("os.fork() was called. os.fork() is incompatible with multithreaded code, and "
          "JAX is multithreaded, so this will likely lead to a deadlock.")
  with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    lm_eval_cli.quiet_pool_fork_warning()
    for module in ("multiprocessing.popen_fork", "mine"):
      warnings.warn_explicit(said, RuntimeWarning, f"{module}.py", 66, module=module)
  assert [w.filename for w in seen] == ["mine.py"]


@pytest.mark.parametrize("flags, said", [
    # newcomer pass 4: an islice error after half a minute of loading
    (["--limit", "-3"], "--limit=-3: expected an integer >= 1 (documents per task) or a "
     "fraction in (0, 1) of each task's documents"),
    (["--limit", "2.5"], "--limit=2.5: expected an integer >= 1"),
    (["--num_fewshot", "-1"], "--num_fewshot=-1: expected an integer >= 0 (examples in the "
     "context)"),
])
def test_a_bad_limit_or_num_fewshot_is_one_line_before_loading(monkeypatch, capsys, workdir,
                                                               flags, said):
  import lm_eval.__main__ as cli
  monkeypatch.setattr(cli, "cli_evaluate", lambda: pytest.fail("lm-eval ran"))
  monkeypatch.setattr(lm_eval_cli, "data_problem", lambda tasks, include_path: None)
  with pytest.raises(SystemExit) as e:
    lm_eval_cli.run(["--model_args", f"checkpoint={workdir}", "--tasks", "piqa", *flags])
  err = capsys.readouterr().err
  assert e.value.code == 2 and err.startswith(f"lev-lm-eval: error: {said}"), err
  assert err.count("\n") == 1


def test_our_loaders_flags_point_at_model_args(capsys):
  """Newcomer pass 21 (M33-M37): --checkpoint= / dtype= were lm-eval's bare refusal."""
  for argv, name, example in ((["--checkpoint=runs/x"], "checkpoint", "checkpoint=DIR"),
                              (["dtype=bfloat16"], "dtype", "checkpoint=DIR,dtype=VALUE")):
    with pytest.raises(SystemExit) as e:
      lm_eval_cli.run(argv)
    assert e.value.code == 2 and capsys.readouterr().err.endswith(
        f"(lev-lm-eval --help lists the flags; lev-lm-eval takes {name} in --model_args, "
        f"e.g. --model_args {example})\n")


def test_an_error_keeps_its_closing_quote(monkeypatch, capsys, workdir):
  """Issue 26: "... or 'auto'" lost its last quote (the message's quotes were stripped);
  only a repr's quotes wrapping the whole message go."""
  import lm_eval.__main__ as cli
  monkeypatch.setattr(lm_eval_cli, "data_problem", lambda tasks, include_path: None)
  for raised, said in [("batch_size = 'big': expected an integer >= 1 or 'auto'",
                        "batch_size = 'big': expected an integer >= 1 or 'auto'"),
                       ("'a repr: no such task'", "a repr: no such task")]:
    def evaluate():
      raise ValueError(raised)
    monkeypatch.setattr(cli, "cli_evaluate", evaluate)
    with pytest.raises(SystemExit):
      lm_eval_cli.run(["--model_args", f"checkpoint={workdir}", "--tasks", "piqa"])
    assert capsys.readouterr().err == f"lev-lm-eval: error: {said}\n"


def test_the_results_go_exactly_to_a_json_output_path(tmp_path, monkeypatch, workdir,
                                                      capsys):
  """Issue 26: `--output_path=/x/lmout.json` wrote lmout_<time>.json (lm-eval's naming),
  not the file `--help` promises."""
  import lm_eval.__main__ as cli
  from lm_eval.loggers import EvaluationTracker
  out = tmp_path / "lmout.json"
  (tmp_path / "lmout_2020-01-01T00-00-00.000001.json").write_text("{}")  # an older run's

  def evaluate():  # lm-eval's own writer, as its `run` calls it
    EvaluationTracker(output_path=str(out)).save_results_aggregated({"results": {"t": 1}})

  monkeypatch.setattr(cli, "cli_evaluate", evaluate)
  monkeypatch.setattr(lm_eval_cli, "data_problem", lambda tasks, include_path: None)
  monkeypatch.setattr(os.sys, "argv", ["x"])
  lm_eval_cli.run(["--model_args", f"checkpoint={workdir}", "--tasks", "piqa",
                   "--output_path", str(out)])
  assert json.loads(out.read_text())["results"] == {"t": 1}
  assert sorted(os.listdir(tmp_path)) == ["lmout.json", "lmout_2020-01-01T00-00-00.000001.json",
                                          "w"]
  assert capsys.readouterr().err.endswith(f"lev-lm-eval: results -> {out}\n")
  # newcomer pass 7: a folder's results file (lm-eval's FOLDER/<id>/results_<time>.json)
  # was written without its path being said
  folder = tmp_path / "lm"
  monkeypatch.setattr(cli, "cli_evaluate", lambda: EvaluationTracker(
      output_path=str(folder)).save_results_aggregated(
          {"results": {"t": 2}, "config": {"model_name": "abc"}}))
  lm_eval_cli.run(["--model_args", f"checkpoint={workdir}", "--tasks", "piqa",
                   "--output_path", str(folder)])
  written = capsys.readouterr().err.splitlines()[-1]
  assert written.startswith(f"lev-lm-eval: results -> {folder}/") and written.endswith(".json")
  assert json.loads(Path(written.split(" -> ")[1]).read_text())["results"] == {"t": 2}


def test_an_output_path_in_a_saved_checkpoint_is_one_line(tmp_path, monkeypatch, capsys):
  """lev_jax.cli.common.checkpoint_tree_error, before lm-eval starts."""
  import lm_eval.__main__ as cli
  monkeypatch.setattr(cli, "cli_evaluate", lambda: pytest.fail("lm-eval ran"))
  (tmp_path / "run" / "checkpoints" / "3").mkdir(parents=True)
  (tmp_path / "run" / "metrics.jsonl").write_text("")  # a run's workdir
  out = tmp_path / "run" / "checkpoints" / "3" / "r.json"
  with pytest.raises(SystemExit) as e:
    lm_eval_cli.run(["--model_args", f"checkpoint={tmp_path / 'run'}", "--tasks", "piqa",
                     "--output_path", str(out)])
  assert e.value.code == 2
  assert capsys.readouterr().err == (
      f"lev-lm-eval: error: --output_path={out}: is inside {tmp_path / 'run' / 'checkpoints'}"
      ", a run's saved checkpoints (only that run's lev-train writes there); expected a "
      "path outside it\n")
  with pytest.raises(SystemExit):  # newcomer pass 7: lm-eval wrote <id>/results_*.json there
    lm_eval_cli.run(["--model_args", f"checkpoint={tmp_path / 'run'}", "--tasks", "piqa",
                     "--output_path", str(tmp_path / "run")])
  assert capsys.readouterr().err == (
      f"lev-lm-eval: error: --output_path={tmp_path / 'run'}: is {tmp_path / 'run'}, a "
      "training run's folder (only its lev-train writes there); expected another path\n")
  (tmp_path / "r.json").symlink_to(tmp_path / "gone")  # newcomer pass 4: link replaced
  for out, said in ((tmp_path / "r.json", f"is a symbolic link to {tmp_path / 'gone'}, "
                     "which does not exist; expected a new path or a regular file"),
                    ("/dev/zero", "is a file; expected a folder")):  # exit 0, nothing
    with pytest.raises(SystemExit):
      lm_eval_cli.run(["--model_args", f"checkpoint={tmp_path / 'run'}", "--tasks", "piqa",
                       "--output_path", str(out)])
    assert capsys.readouterr().err == f"lev-lm-eval: error: --output_path={out}: {said}\n"


@pytest.mark.xdist_group("torch")  # lm-eval's evaluation imports torch: on its worker
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


# --- lev_jax/lm_eval_tasks: the six benchmarks over their released files, offline -----

ARC_ROW = {"id": "a", "question": {"stem": "Which?", "choices": [
    {"text": "one", "label": "A"}, {"text": "two", "label": "B"},
    {"text": "three", "label": "C"}]}, "answerKey": "B"}
# A numeric-label item answered by letter (ARC-Challenge has such rows): gold "3".
ARC_DIGITS = {"id": "b", "question": {"stem": "Why?", "choices": [
    {"text": "x", "label": "1"}, {"text": "y", "label": "2"}, {"text": "z", "label": "3"},
    {"text": "w", "label": "4"}]}, "answerKey": "C"}
RELEASED = {  # file under LEV_LM_EVAL_DATA: rows, as the benchmarks release them
    "lambada_test.jsonl": [{"text": "the cat sat on the mat"},
                           {"text": "she saw her friend"}, {"text": "a b"}],
    "hellaswag_val.jsonl": [{"ind": 1, "activity_label": "Roof", "ctx_a": "A man sits.",
                             "ctx_b": "he", "label": 3, "split": "val",
                             "endings": ["a [title] b.", "c.", "d.", "e."]}],
    "piqa/valid.jsonl": [{"goal": "g1", "sol1": "s1", "sol2": "s2"},
                         {"goal": "g2", "sol1": "t1", "sol2": "t2"}],
    "ARC-Easy/ARC-Easy-Test.jsonl": [ARC_ROW],
    "ARC-Challenge/ARC-Challenge-Test.jsonl": [ARC_ROW, ARC_DIGITS],
    "winogrande_1.1/dev.jsonl": [{"qID": "q", "sentence": "Sarah helped Maria so _ won.",
                                  "option1": "Sarah", "option2": "Maria", "answer": "2"}],
}
# task: (docs, requests, gold of each doc)
EXPECTED = {"lambada_openai_local": (3, 3, None), "hellaswag_local": (1, 4, [3]),
            "piqa_local": (2, 4, [1, 0]), "arc_easy_local": (1, 3, [1]),
            "arc_challenge_local": (2, 7, [1, 2]), "winogrande_local": (1, 2, [1])}


@pytest.fixture
def offline(monkeypatch, tmp_path):
  """HF_DATASETS_OFFLINE / HF_HUB_OFFLINE set (in the environment and in the values
  datasets and huggingface_hub read at import), an empty datasets cache."""
  import datasets.config
  import huggingface_hub.constants
  for var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
    monkeypatch.setenv(var, "1")
  monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
  monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
  monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")
  monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


@pytest.fixture
def released(tmp_path, monkeypatch):
  """LEV_LM_EVAL_DATA: a folder of tiny files in the released formats."""
  root = tmp_path / "benchmarks"
  for name, rows in RELEASED.items():
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    (root / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
  (root / "piqa" / "valid-labels.lst").write_text("1\n0\n")
  monkeypatch.setenv("LEV_LM_EVAL_DATA", str(root))
  return root


def test_shipped_tasks_read_the_released_files_offline(offline, released):
  from lm_eval.tasks import TaskManager
  from lev_jax.lm_eval_tasks import TAG, TASKS_DIR
  tm = TaskManager(include_path=str(TASKS_DIR), include_defaults=False)
  assert set(tm.all_tasks) >= set(EXPECTED) | {TAG}
  tasks = tm.load([TAG])["tasks"]
  assert set(tasks) == set(EXPECTED)
  for name, task in tasks.items():
    docs, requests, gold = EXPECTED[name]
    task.build_all_requests(limit=None, rank=0, world_size=1)
    eval_docs = list(task.eval_docs)
    assert (len(eval_docs), len(task.instances)) == (docs, requests), name
    # lm-eval's winogrande gives the answer's index as doc_to_text (partial evaluation)
    answer = task.doc_to_text if name == "winogrande_local" else task.doc_to_target
    if gold is not None:
      assert [answer(d) for d in eval_docs] == gold, name
  lambada = tasks["lambada_openai_local"]
  lambada.build_all_requests(limit=None, rank=0, world_size=1)
  assert lambada.instances[0].args == ("the cat sat on the", " mat")
  hellaswag = tasks["hellaswag_local"]  # lm-eval's preprocessing: " [title]" -> ". "
  assert hellaswag.doc_to_choice(list(hellaswag.eval_docs)[0])[0] == "a. b."


def test_shipped_tasks_are_package_data():
  import tomllib
  from pathlib import Path
  from lev_jax.lm_eval_tasks import LOCAL_TWIN, TASKS_DIR
  pyproject = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())
  assert "*.yaml" in pyproject["tool"]["setuptools"]["package-data"]["lev_jax.lm_eval_tasks"]
  assert {p.stem for p in TASKS_DIR.glob("*.yaml")} == set(LOCAL_TWIN.values())


def _run_fails_at_once(argv, capsys, monkeypatch):
  """stderr of lm_eval_cli.run(argv), which must stop (status 2) before lm-eval."""
  import time
  import lm_eval.__main__ as cli
  monkeypatch.setattr(cli, "cli_evaluate", lambda: pytest.fail("lm-eval was started"))
  start = time.monotonic()
  with pytest.raises(SystemExit) as exit_info:
    lm_eval_cli.run(argv)
  elapsed = time.monotonic() - start
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert len(err.strip().splitlines()) == 1, err
  assert elapsed < 5, f"{elapsed:.1f} s"
  return err


def test_hub_task_offline_is_one_fast_line_pointing_to_the_local_tasks(offline, capsys,
                                                                       monkeypatch, workdir):
  from lev_jax.lm_eval_tasks import TASKS_DIR
  err = _run_fails_at_once(["--model_args", f"checkpoint={workdir}", "--tasks",
                            "hellaswag,arc_easy"], capsys, monkeypatch)
  assert err.startswith("lev-lm-eval: error: task hellaswag reads Rowan/hellaswag from the "
                        "Hugging Face Hub, which is offline"), err
  assert f"--tasks hellaswag_local,arc_easy_local --include_path {TASKS_DIR}" in err
  assert "LEV_LM_EVAL_DATA" in err


def test_unreachable_hub_is_found_by_a_short_probe(capsys, monkeypatch, tmp_path, workdir):
  import datasets.config
  monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
  monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path)
  probes, probe = [], lm_eval_cli._hub_reachable
  monkeypatch.setattr(lm_eval_cli, "_hub_reachable", lambda url: probes.append(url))
  err = _run_fails_at_once(["--model_args", f"checkpoint={workdir}", "--tasks", "piqa"],
                           capsys, monkeypatch)
  assert len(probes) == 1 and "which is unreachable" in err and "--tasks piqa_local" in err
  (tmp_path / "baber___piqa").mkdir()  # in the datasets cache: lm-eval may go ahead
  assert lm_eval_cli.data_problem(["piqa"], None) is None
  # a refused connection answers at once; the probe never waits longer than its timeout
  assert probe("http://127.0.0.1:9", timeout_s=0.5) is False


def test_local_task_without_its_files_is_one_line_naming_the_file(offline, capsys,
                                                                   monkeypatch, released,
                                                                   workdir):
  from lev_jax.lm_eval_tasks import TASKS_DIR
  (released / "piqa" / "valid-labels.lst").unlink()
  err = _run_fails_at_once(["--model_args", f"checkpoint={workdir}", "--tasks", "lev_local",
                            "--include_path", str(TASKS_DIR)], capsys, monkeypatch)
  assert f"{released / 'piqa' / 'valid-labels.lst'}: no such file" in err
  monkeypatch.delenv("LEV_LM_EVAL_DATA")
  # newcomer pass 6: without --include_path it was "Tasks not found: piqa_local"
  err = _run_fails_at_once(["--model_args", f"checkpoint={workdir}", "--tasks", "piqa_local"],
                           capsys, monkeypatch)
  assert "LEV_LM_EVAL_DATA is not set" in err
  monkeypatch.setenv("LEV_LM_EVAL_DATA", str(released / "piqa" / "valid.jsonl"))
  err = _run_fails_at_once(["--model_args", f"checkpoint={workdir}", "--tasks", "piqa_local"],
                           capsys, monkeypatch)  # newcomer pass 7: "afile/x: no such file"
  assert (f"LEV_LM_EVAL_DATA={released / 'piqa' / 'valid.jsonl'} is a file; expected the "
          "folder holding") in err, err


def test_a_released_file_without_a_tasks_field_is_one_line(released):
  """Newcomer pass 6: a hellaswag or lambada file of other fields was a 56-74 line
  traceback from inside lm-eval (KeyError 'ctx_a', jinja2's 'text' is undefined)."""
  import yaml
  from lev_jax.eval.downstream import DownstreamError
  from lev_jax.lm_eval_tasks import TASKS_DIR, lev_local
  for task in EXPECTED:
    text = (TASKS_DIR / f"{task}.yaml").read_text()
    kwargs = yaml.safe_load(text.split("custom_dataset:")[0] + "dataset_kwargs:"
                            + text.split("dataset_kwargs:")[1].split("\noutput_type")[0])
    kwargs = kwargs["dataset_kwargs"]
    assert lev_local.load(**kwargs)[kwargs["split"]].num_rows >= 1  # the released rows
    (released / kwargs["data_file"]).write_text('{"foo": 1}\n')
    with pytest.raises(DownstreamError, match=rf"^{released / kwargs['data_file']}:1: "
                       rf"missing field '{kwargs['fields'][0]}'; fields present: \['foo'\]$"):
      lev_local.load(**{**kwargs, "labels_file": None})


def test_model_args_and_tasks_are_checked_before_the_hub_probe(capsys, monkeypatch, workdir,
                                                               export):
  """Issue 26: a missing checkpoint, a misspelt key, a bad step, dtype or batch_size, or
  no --tasks read "the Hub is unreachable" (the probe ran first) or came late."""
  import argparse
  monkeypatch.setattr(lm_eval_cli, "data_problem", lambda *a: pytest.fail("probed"))
  w = workdir
  for args, said in [
      ([f"chekpoint={w}"], f"--model_args chekpoint={w}: unknown key (did you mean "
       "checkpoint? the lev_jax model takes checkpoint, step, dtype, batch_size, max_len; "
       "lm-eval's max_batch_size, device, trust_remote_code are accepted and ignored)"),
      (["step=3"], "--model_args: no checkpoint=PATH (a lev-train workdir or lev-export "
       "folder)"),
      (["checkpoint="], "--model_args checkpoint= is empty (an unset shell variable?)"),
      ([f"checkpoint={w}/nowhere"], f"--model_args checkpoint={w}/nowhere: {w}/nowhere: "
       "no such checkpoint folder"),
      ([f"checkpoint={w}/checkpoints"], f"the checkpoints folder; give the run's folder: "
       f"checkpoint={w} (step for a step other than the latest)"),
      ([f"checkpoint={w},step=x"], "--model_args step=x: expected an integer >= 0"),
      ([f"checkpoint={w},dtype=float64"], "--model_args dtype=float64: expected one of "
       "float32, bfloat16, float16"),
      ([f"checkpoint={w},batch_size=0"], "--model_args batch_size=0: expected an integer "
       ">= 1 or 'auto'"),
      ([f"checkpoint={w}", "--batch_size", "big"], "--batch_size=big: expected an integer "
       ">= 1 or 'auto'"),
      # issue 26: an unsaved step, max_len=-1 and a missing --include_path came late
      ([f"checkpoint={w},step=7"], f"--model_args step=7: {w}: a training run with no "
       "complete checkpoint yet (none in checkpoints/;"),
      ([f"checkpoint={export[0]},step=3"], f"--model_args step=3: {export[0]}: the export "
       "holds step 7, not step 3"),
      ([f"checkpoint={w},max_len=-1"], "--model_args max_len=-1: expected an integer >= 1"),
      # newcomer pass 7: lm-eval reads -1 as -1.0, which was echoed as typed
      ([f"checkpoint={w},batch_size=-1"], "--model_args batch_size=-1: expected an integer "
       ">= 1 or 'auto'"),
      ([f"checkpoint={w},step=-1"], "--model_args step=-1: expected an integer >= 0"),
      ([f"checkpoint={w}", "--include_path", f"{w}/nowhere"], f"--include_path={w}/nowhere: "
       "no such folder; expected a folder of lm-eval task YAML files"),
  ]:
    err = _run_fails_at_once(["--tasks", "piqa", "--model_args", *args], capsys, monkeypatch)
    assert said in err, err
  err = _run_fails_at_once(["--model_args", f"checkpoint={w}"], capsys, monkeypatch)
  assert "error: --tasks is required: lm-eval task names" in err, err
  # newcomer pass 5: `--tasks a,` was "Tasks not found: " with no name
  err = _run_fails_at_once(["--tasks", "piqa,", "--model_args", f"checkpoint={w}"], capsys,
                           monkeypatch)
  assert "error: --tasks piqa,: an empty task name (a trailing or doubled comma)" in err, err
  assert lm_eval_cli.model_args_problem(argparse.Namespace(
      model="hf", model_args={"pretrained": "gpt2"})) is None  # another model's own args
