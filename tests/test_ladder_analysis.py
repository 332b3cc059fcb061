"""lev-ladder's analysis (lev_jax/ladder/analysis.py) on synthetic ladders with known
curves (test_ladder_runs.build_ladder: tied final losses exactly on L(N) = E + A N^-alpha,
Leviathan = tied at SHIFT x the tokens): the analysis must give back SHIFT and (E, A,
alpha), and say why whatever it cannot compute is n/a."""

import json
import math

import pytest

from lev_jax.ladder.analysis import analyse
from lev_jax.ladder.report import markdown
from lev_jax.ladder.reporting import provenance
from lev_jax.ladder.runs import collect
from test_ladder_runs import (A, ALPHA, B, BETA, E, EVAL_EVERY, SHIFT, SIZES4, STEPS,
                              TOKENS_PER_STEP, build_ladder, tied_final_loss, write_ladder,
                              write_rung)


@pytest.fixture(scope="module")
def full(tmp_path_factory):
  ladder, root, params = build_ladder(tmp_path_factory.mktemp("full"))
  return ladder, root, params, analyse(collect(ladder, root))


def test_analysis_recovers_the_token_efficiency_and_the_power_law(full):
  ladder, root, params, analysis = full
  assert [r["status"] for r in analysis["rungs"]] == ["finished"] * 8
  assert analysis["missing"] == []
  assert [p["size"] for p in analysis["pairs"]] == list(SIZES4)
  for p in analysis["pairs"]:
    eff = p["efficiency"]
    assert eff["ratio"] == pytest.approx(SHIFT, rel=0.01), p["size"]
    assert eff["reason"] is None and eff["bound"] is None
    assert eff["tied_tokens"] == STEPS * TOKENS_PER_STEP
    assert eff["target"] == pytest.approx(tied_final_loss(params[p["tied"]]), abs=1e-9)
    assert p["ppl_change"] == pytest.approx(math.exp(p["leviathan_loss"] - p["tied_loss"]) - 1)
  fit = analysis["fit"]
  assert fit["ok"] and fit["n_points"] == 4 and fit["reason"] is None
  assert fit["E"] == pytest.approx(E, rel=1e-3)
  assert fit["A"] == pytest.approx(A, rel=1e-2)
  assert fit["alpha"] == pytest.approx(ALPHA, rel=1e-3)
  assert set(fit["stderr"]) == {"E", "A", "alpha"}
  assert [pt["N"] for pt in fit["points"]] == [params[f"tied_{s}"] for s in SIZES4]
  for e in analysis["effective"]:
    expected = (A / (e["loss"] - E)) ** (1 / ALPHA)
    assert e["n_eff"] == pytest.approx(expected, rel=0.01)
    assert e["N"] == params[e["variant"]]
    assert e["ratio"] == pytest.approx(e["n_eff"] / e["N"])
    assert e["lo"] <= e["n_eff"] <= e["hi"]
    assert e["ratio"] > 1  # Leviathan's lower loss is worth more parameters
  by_size = {p["size"]: p for p in analysis["pairs"]}
  changes = [r["change"] for r in by_size["a"]["buckets"]["rows"]]
  # write_rung scales each rung's bucket perplexities by one factor so that they agree
  # with its loss: the twins' changes are LEV_BUCKET_PPL / TIED_BUCKET_PPL times the
  # ratio of their factors
  tied, lev = (json.loads((root / v / "eval.json").read_text())["buckets"]
               for v in ("tied_a", "leviathan_a"))
  factor = (lev[3]["perplexity"] / 20.0) / (tied[3]["perplexity"] / 20.0)
  assert changes[0] is None and changes[1:] == pytest.approx(
      [factor * r - 1 for r in (0.5, 0.95, 1.0)])
  assert by_size["a"]["downstream"]["piqa"]["leviathan"]["acc"] == 0.64
  assert by_size["b"]["downstream"] == {}
  assert analysis["downstream_tasks"] == ["piqa"]
  json.dumps(analysis)  # JSON-ready


def test_curves_take_the_later_row_of_a_resumed_step_and_tokens_from_the_config(full):
  ladder, root, params, analysis = full
  tied_b = next(r for r in analysis["rungs"] if r["variant"] == "tied_b")
  tokens, losses = tied_b["eval_curve"]["tokens"], tied_b["eval_curve"]["loss"]
  assert tokens == [s * TOKENS_PER_STEP for s in range(EVAL_EVERY, STEPS + 1, EVAL_EVERY)]
  assert all(b > a for a, b in zip(losses[1:], losses[:-1]))  # no stale +1 rows left
  assert tied_b["tokens"] == STEPS * TOKENS_PER_STEP and tied_b["config_source"] == "checkpoint"
  assert tied_b["non_embedding_params"] < tied_b["params"]


def test_missing_and_unfinished_rungs_are_reported_and_the_rest_summarised(tmp_path):
  ladder, root, _ = build_ladder(tmp_path, skip=("leviathan_b",), no_metrics=("leviathan_c",),
                                 unfinished=("leviathan_d",))
  analysis = analyse(collect(ladder, root))
  missing = {m["variant"]: m for m in analysis["missing"]}
  assert set(missing) == {"leviathan_b", "leviathan_c", "leviathan_d"}
  assert missing["leviathan_b"]["status"] == "missing"
  assert missing["leviathan_b"]["reason"] == f"no workdir {root / 'leviathan_b'}"
  assert missing["leviathan_c"]["reason"].startswith("no metrics:")
  assert missing["leviathan_d"]["status"] == "unfinished"
  assert missing["leviathan_d"]["reason"] == f"not finished: step 40 of {STEPS}"
  pairs = {p["size"]: p for p in analysis["pairs"]}
  assert pairs["a"]["efficiency"]["ratio"] == pytest.approx(SHIFT, rel=0.01)
  for size in "bcd":
    assert pairs[size]["ppl_change"] is None and pairs[size]["efficiency"] is None
    assert f"leviathan_{size}" in pairs[size]["reason"]
    assert pairs[size]["tied_ppl"] is not None  # the finished twin is still shown
  assert analysis["fit"]["ok"]  # all four tied rungs finished
  assert [e["variant"] for e in analysis["effective"]] == ["leviathan_a"]


def test_too_few_tied_rungs_say_so_and_everything_else_is_produced(tmp_path):
  ladder, root, _ = build_ladder(tmp_path, sizes={"a": 16, "b": 32, "c": 48})
  analysis = analyse(collect(ladder, root))
  fit = analysis["fit"]
  assert not fit["ok"] and "needs at least 4 rungs" in fit["reason"] and "got 3" in fit["reason"]
  assert "E" not in fit
  for e in analysis["effective"]:
    assert e["n_eff"] is None and e["reason"].startswith("no power-law fit: ")
  for p in analysis["pairs"]:
    assert p["efficiency"]["ratio"] == pytest.approx(SHIFT, rel=0.01)


def test_leviathan_that_never_reaches_the_target_has_no_ratio_and_a_reason(tmp_path):
  ladder = write_ladder(tmp_path / "l.py", {"a": 16})
  root = tmp_path / "root"
  write_rung(root, "tied_a", 2.0)
  write_rung(root, "leviathan_a", 2.5, shift=SHIFT)  # worse everywhere
  pair = analyse(collect(ladder, root))["pairs"][0]
  eff = pair["efficiency"]
  assert eff["ratio"] is None and eff["leviathan_tokens"] is None
  assert "never reached" in eff["reason"] and "tied_a" in eff["reason"]
  assert pair["ppl_change"] > 0


def test_a_fit_pinned_at_its_bound_is_flagged_not_trusted(tmp_path):
  """Tied final losses as measured on the smoke ladder (nearly flat, no floor): the fit
  converges with E at its bound 0 and errors larger than the values, and the analysis
  says so instead of presenting its effective parameters as findings."""
  ladder = write_ladder(tmp_path / "l.py")
  root = tmp_path / "root"
  t_final = STEPS * TOKENS_PER_STEP
  for size, final in zip(SIZES4, (6.234, 6.162, 5.970, 5.911)):
    c_n = final - B * t_final ** -BETA
    write_rung(root, f"tied_{size}", c_n)
    write_rung(root, f"leviathan_{size}", c_n, shift=SHIFT)
  analysis = analyse(collect(ladder, root))
  fit = analysis["fit"]
  assert fit["ok"] and fit["E"] == pytest.approx(0.0, abs=1e-5)
  assert any("lower bound 0" in w for w in fit["warnings"])
  assert any(w.startswith("stderr(alpha)") for w in fit["warnings"])
  assert "not meaningful" in fit["warnings"][-1]
  assert all(e["n_eff"] is not None for e in analysis["effective"])  # shown, flagged
  md = markdown(analysis, provenance())
  assert "**Warning: E = " in md and "not meaningful" in md


def test_bucket_changes_of_twins_evaluated_on_other_data_are_refused(tmp_path):
  """Issue 13.8's sibling: eval.json records its data; twins evaluated on other batches
  get no per-bucket change, and a reason naming both."""
  ladder, root, _ = build_ladder(tmp_path, sizes={"a": 16, "b": 32}, downstream=False)
  for variant, sha in (("tied_a", "a" * 64), ("leviathan_a", "b" * 64),
                       ("tied_b", "c" * 64), ("leviathan_b", "c" * 64)):
    path = root / variant / "eval.json"
    result = json.loads(path.read_text())
    result["data"] = {"split": "validation", "files": ["val.jsonl"], "sha256": sha,
                      "tokens_evaluated": 600, "tokens_in_split": 6000}
    path.write_text(json.dumps(result))
  by_size = {p["size"]: p for p in analyse(collect(ladder, root))["pairs"]}
  assert by_size["a"]["buckets"]["rows"] == []
  assert by_size["a"]["buckets"]["reason"] == (
      "evaluated on other data: tied_a: validation of val.jsonl, 600 tokens evaluated, "
      "sha256 aaaaaaaaaaaa; leviathan_a: validation of val.jsonl, 600 tokens evaluated, "
      "sha256 bbbbbbbbbbbb")
  assert by_size["b"]["buckets"]["rows"] and by_size["b"]["buckets"]["reason"] is None
