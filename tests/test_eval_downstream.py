"""Benchmark readers and metrics on hand-made items in each released file format,
scored by a bigram model whose preferences make every answer known by construction."""

import json
import math
import sys

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lev_jax.eval import downstream
from lev_jax.data.tokenizer import ByteTokenizer
from lev_jax.eval.downstream import DownstreamError, evaluate_task, evaluate_tasks, read_task
from lev_jax.eval.scoring import Scorer

TOK = ByteTokenizer()
STRENGTH = 10.0
# log p of the favoured next byte (hit) and of any other byte (miss) under `Bigram`.
LP_HIT = STRENGTH - math.log(math.exp(STRENGTH) + TOK.vocab_size - 1)
LP_MISS = -math.log(math.exp(STRENGTH) + TOK.vocab_size - 1)


class Bigram(nnx.Module):
  """Next byte: ' ' after 'q', else 'z' (logit STRENGTH, all others 0)."""

  def __init__(self):
    v = TOK.vocab_size
    table = np.zeros((v, v), np.float32)
    table[:, TOK.encode("z")[0]] = STRENGTH
    q = TOK.encode("q")[0]
    table[q] = 0.0
    table[q, TOK.encode(" ")[0]] = STRENGTH
    self.table = nnx.Param(jnp.asarray(table))

  def __call__(self, ids_BxL):
    return self.table[...][ids_BxL]


@pytest.fixture(scope="module")
def scorer():
  return Scorer(Bigram(), TOK, max_len=32, batch_size=4)


def write_jsonl(path, rows):
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return path


def hella(label, endings, ctx_a="Making tea", ctx_b="then he"):
  return {"ind": 1, "activity_label": "Cooking", "ctx_a": ctx_a, "ctx_b": ctx_b,
          "ctx": ctx_a + " " + ctx_b, "endings": endings, "split": "val",
          "split_type": "indomain", "label": label, "source_id": "x"}


def test_hellaswag_acc_and_acc_norm_by_construction(scorer, tmp_path):
  # " zz" costs one miss (the space) + 2 hits; "ab" three misses: ending 0 wins.
  zz = ["zz", "ab", "cd", "ef"]
  # acc: "z" (1 miss + 1 hit) beats "zzzzzzzz" (1 miss + 8 hits); per character the
  # long one wins: acc_norm picks ending 1.
  short_long = ["z", "zzzzzzzz", "ab", "cd"]
  f = write_jsonl(tmp_path / "hellaswag_val.jsonl",
                  [hella(0, zz), hella(1, zz), hella(0, short_long), hella(1, short_long)])
  r = evaluate_task(scorer, "hellaswag", f)
  assert r["n"] == 4 and r["task"] == "hellaswag" and r["file"] == str(f)
  assert r["acc"] == 0.5            # items 0 and 2 right
  assert r["acc_norm"] == 0.5       # items 0 and 3 right
  assert r["acc_stderr"] == pytest.approx(math.sqrt(1 / 3 / 4))  # var([1,0,1,0]) = 1/3
  assert evaluate_task(scorer, "hellaswag", f, limit=1)["acc"] == 1.0


def test_hellaswag_preprocessing_matches_lm_eval():
  # lm_eval/tasks/hellaswag/utils.py preprocess, worked by hand: strip; " [title]" ->
  # ". "; drop "[step]" / "[header]"; then each double space -> one.
  text = " Removing ice [title] Use a scraper. [step] Scrape  hard [header] now "
  assert downstream.hellaswag_preprocess(text) == "Removing ice. Use a scraper. Scrape hard now"


def test_hellaswag_query_and_continuations(tmp_path):
  f = write_jsonl(tmp_path / "h.jsonl", [hella("2", ["a [title] b", "x", "y", "w"],
                                               ctx_a="He pours water.", ctx_b="the kettle")])
  item = read_task("hellaswag", f)[0]
  query = "Cooking: He pours water. The kettle"
  assert item.requests[0] == (query, " a. b") and item.gold == 2 and item.line == 1
  assert item.choices == ("a. b", "x", "y", "w")


def test_lambada_accuracy_and_perplexity(scorer, tmp_path):
  # "...q zzz": ' ' after 'q' and 'z' after ' ' / 'z' are the argmax -> greedy.
  rows = [{"text": "the aq zzz"}, {"text": "the aq zaz"}, {"text": "it is zzz"}]
  f = write_jsonl(tmp_path / "lambada_test.jsonl", rows)
  r = evaluate_task(scorer, "lambada", f)
  lls = [4 * LP_HIT, 3 * LP_HIT + LP_MISS, LP_MISS + 3 * LP_HIT]  # ' zzz' after 'q' / 's'
  assert r["acc"] == pytest.approx(1 / 3)
  assert r["perplexity"] == pytest.approx(math.exp(-np.mean(lls)), rel=1e-5)
  se_ll = np.std(lls, ddof=1) / math.sqrt(3)
  assert r["perplexity_stderr"] == pytest.approx(r["perplexity"] * se_ll, rel=1e-4)
  assert r["acc_norm"] is None
  # The plain-text release: one passage per line, same numbers.
  t = tmp_path / "lambada_test_plain_text.txt"
  t.write_text("the aq zzz\n\nthe aq zaz\nit is zzz\n")
  items = read_task("lambada", t)
  assert [i.requests[0] for i in items] == [("the aq", " zzz"), ("the aq", " zaz"),
                                            ("it is", " zzz")]
  assert evaluate_task(scorer, "lambada", t)["perplexity"] == pytest.approx(r["perplexity"])


def test_piqa_with_labels_file_beside_or_given(scorer, tmp_path):
  rows = [{"goal": "Make tea", "sol1": "zzzz", "sol2": "abcd"},
          {"goal": "Boil", "sol1": "zz", "sol2": "ab"}]
  f = write_jsonl(tmp_path / "valid.jsonl", rows)
  (tmp_path / "valid-labels.lst").write_text("0\n1\n")
  items = read_task("piqa", f)
  assert items[0].requests == (("Question: Make tea\nAnswer:", " zzzz"),
                               ("Question: Make tea\nAnswer:", " abcd"))
  r = evaluate_task(scorer, "piqa", f)
  assert (r["acc"], r["n"]) == (0.5, 2)
  other = tmp_path / "gold.lst"
  other.write_text("0\n0\n")
  assert evaluate_task(scorer, "piqa", f, labels=other)["acc"] == 1.0


def test_arc_letter_and_digit_keys(scorer, tmp_path):
  def arc(key, labels, texts):
    return {"id": "q", "question": {"stem": "Which?", "choices": [
        {"text": t, "label": l} for t, l in zip(texts, labels)]}, "answerKey": key}
  rows = [arc("B", "ABCD", ["ab", "zz", "cd", "ef"]),      # right
          arc("1", "1234", ["zz", "ab", "cd", "ef"]),      # right
          arc("2", "ABC", ["ab", "cd", "zz"]),             # 2 -> B, model picks C
          arc("A", "ABC", ["ab", "zz", "cd"])]             # wrong
  f = write_jsonl(tmp_path / "ARC-Easy-Test.jsonl", rows)
  items = read_task("arc_easy", f)
  assert [i.gold for i in items] == [1, 0, 1, 0]
  assert items[0].requests[1] == ("Question: Which?\nAnswer:", " zz")
  for name in ("arc_easy", "arc_challenge"):
    assert evaluate_task(scorer, name, f)["acc"] == 0.5


def test_winogrande_partial_evaluation(scorer, tmp_path):
  # Continuation " zzz." after option "q" (' ' is then the argmax) beats after "b".
  rows = [{"qID": "1", "sentence": "He said _ zzz.", "option1": "aq", "option2": "ab",
           "answer": "1"},
          {"qID": "2", "sentence": "He said _ zzz.", "option1": "ab", "option2": "aq",
           "answer": "1"}]
  f = write_jsonl(tmp_path / "dev.jsonl", rows)
  item = read_task("winogrande", f)[0]
  assert item.requests == (("He said aq", " zzz."), ("He said ab", " zzz."))
  r = evaluate_task(scorer, "winogrande", f)
  assert r["acc"] == 0.5 and r["acc_norm"] == r["acc"]


def test_acc_norm_divides_by_the_choice_text_without_the_space():
  # lm-eval: len(choice) = 2 and 4 (not len(" " + choice) = 3 and 5): -1.5 < -1.3.
  item = downstream.Item((("c", " ab"), ("c", " abcd")), ("ab", "abcd"), 1, 1)
  m = downstream.choice_metrics([[-3.0, -5.2]], [item])
  assert m["acc"] == 0.0 and m["acc_norm"] == 1.0 and m["acc_stderr"] is None


def test_evaluate_tasks_and_stderr(scorer, tmp_path):
  f = write_jsonl(tmp_path / "dev.jsonl", [{"sentence": "a _ z", "option1": "q",
                                            "option2": "b", "answer": "1"}])
  out = evaluate_tasks(scorer, {"winogrande": f})
  assert out["winogrande"]["acc"] == 1.0 and out["winogrande"]["acc_stderr"] is None
  assert downstream.mean_stderr([1, 0, 1, 1]) == pytest.approx(0.25)


@pytest.mark.parametrize("name,content,pattern", [
    ("hellaswag", "", r"h\.jsonl: no items"),
    ("hellaswag", json.dumps(hella(0, ["a", "b"])) + '\n{not json\n',
     r"h\.jsonl:2: malformed JSON"),
    ("hellaswag", '[1, 2]\n', r"h\.jsonl:1: a JSON list; expected an object"),
    ("hellaswag", json.dumps({"ctx_a": "a", "ctx_b": "b", "endings": ["x", "y"],
                              "label": 0}) + "\n", r"h\.jsonl:1: missing field 'activity_label'"),
    ("hellaswag", json.dumps(hella(4, ["a", "b", "c", "d"])) + "\n",
     r"h\.jsonl:1: label = 4: expected an integer in \[0, 4\)"),
    ("winogrande", "\n" + json.dumps({"sentence": "a _ b _", "option1": "x", "option2": "y",
                                      "answer": "1"}) + "\n",
     r"h\.jsonl:2: sentence .* has 2 '_'; expected exactly one"),
    ("winogrande", json.dumps({"sentence": "a _", "option1": "x", "option2": "y",
                               "answer": "3"}) + "\n", r"h\.jsonl:1: answer = '3'"),
    ("arc_easy", json.dumps({"question": {"stem": "s", "choices": [
        {"text": "a", "label": "A"}, {"text": "b", "label": "B"}]}, "answerKey": "E"}) + "\n",
     r"h\.jsonl:1: answerKey = 'E': expected one of the choice labels"),
    ("lambada", json.dumps({"text": "oneword"}) + "\n", r"h\.jsonl:1: passage .* no space"),
])
def test_bad_files_name_file_and_line(tmp_path, name, content, pattern):
  f = tmp_path / "h.jsonl"
  f.write_text(content)
  with pytest.raises(DownstreamError, match=pattern):
    read_task(name, f)


def test_missing_files_and_piqa_label_errors(tmp_path):
  with pytest.raises(DownstreamError, match=r"nope\.jsonl: no such file"):
    read_task("arc_easy", tmp_path / "nope.jsonl")
  with pytest.raises(DownstreamError, match=r"^/dev/zero: not a regular file; expected a "
                     "benchmark's JSONL file$"):  # newcomer pass 4: "no such file"
    read_task("arc_easy", "/dev/zero")
  with pytest.raises(DownstreamError, match="unknown task 'mmlu'"):
    read_task("mmlu", tmp_path / "x")
  f = write_jsonl(tmp_path / "valid.jsonl", [{"goal": "g", "sol1": "a", "sol2": "b"}] * 2)
  with pytest.raises(DownstreamError, match=r"valid-labels\.lst: no such labels file"):
    read_task("piqa", f)
  (tmp_path / "valid-labels.lst").write_text("0\n")
  with pytest.raises(DownstreamError, match=r"valid-labels\.lst: 1 labels for 2 items"):
    read_task("piqa", f)
  (tmp_path / "valid-labels.lst").write_text("0\n2\n")
  with pytest.raises(DownstreamError, match=r"valid-labels\.lst:2: label '2': expected 0 or 1"):
    read_task("piqa", f)


def test_a_missing_piqa_data_file_is_named_before_its_labels(tmp_path):
  """Issue 14.3: the data file is missing, not (only) its labels: say so, with or
  without a labels file."""
  missing = tmp_path / "valid.jsonl"
  with pytest.raises(DownstreamError) as e:
    read_task("piqa", missing)
  assert str(e.value) == f"{missing}: no such file"
  (tmp_path / "valid-labels.lst").write_text("0\n")
  with pytest.raises(DownstreamError) as e:
    read_task("piqa", missing, labels=tmp_path / "valid-labels.lst")
  assert str(e.value) == f"{missing}: no such file"


def test_a_malformed_json_message_reads_as_english(tmp_path):
  """Issue 13.9a: json's message ends in "at"; no "starting at at column"."""
  f = tmp_path / "h.jsonl"
  f.write_text('{"ctx_a": "unterminated\n')
  with pytest.raises(DownstreamError) as e:
    read_task("hellaswag", f)
  assert str(e.value) == (f"{f}:1: malformed JSON (Unterminated string starting at: "
                          "column 11); expected one JSON object per line")


def test_a_missing_piqa_labels_file_names_the_real_flag(tmp_path):
  """Issue 13.9b: the message names lev-eval's --config.eval.downstream.piqa_labels,
  the config field that exists, and the default file name it looked for."""
  from lev_jax.config import base_config
  assert "piqa_labels" in base_config().eval.downstream
  f = write_jsonl(tmp_path / "valid.jsonl", [{"goal": "g", "sol1": "a", "sol2": "b"}])
  with pytest.raises(DownstreamError) as e:
    read_task("piqa", f)
  assert str(e.value).endswith(
      "beside the data as valid-labels.lst or given with "
      "--config.eval.downstream.piqa_labels=PATH")


def test_scoring_shows_a_progress_bar_per_task_on_stderr(scorer, tmp_path, capsys,
                                                        monkeypatch):
  """Issue 13.9e: lev-eval scores for minutes; a tqdm bar per task (items, items/s,
  ETA) on stderr when it is a terminal, nothing on stdout; the results are those
  without the bar. Into a file (not a terminal) no bar is drawn."""
  f = write_jsonl(tmp_path / "dev.jsonl", [{"sentence": f"a{i} _ z", "option1": "q",
                                            "option2": "b", "answer": "1"}
                                           for i in range(5)])
  quiet = evaluate_tasks(scorer, {"winogrande": f})
  assert evaluate_tasks(scorer, {"winogrande": f}, progress=True) == quiet
  assert capsys.readouterr().err == ""  # capsys's stderr is not a terminal
  monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
  shown = evaluate_tasks(scorer, {"winogrande": f}, progress=True)
  assert shown == quiet
  out, err = capsys.readouterr()
  assert out == "" and "winogrande: 100%" in err and "5/5" in err and "item/s" in err
