"""benchmarks/head_attention_compile.py: its rows from lev-compile records, its cells
resumed from their JSON files (nothing compiled when they exist), and its bad flags."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import head_attention_compile as hac  # noqa: E402


def _record(fits=True, step_s=0.02, source="cost model of loop-free compiles"):
  return {"steps": [{"fits": fits, "total_bytes": 3 * 2**30, "temp_bytes": 2 * 2**30,
                     "required_bytes": 120 * 2**30, "step_s": step_s,
                     "time_source": source}]}


def test_rows_say_what_was_estimated_and_what_does_not_fit():
  assert hac.row("pod", "tied_200m", "dense", _record()) == (
      "| pod | tied_200m | dense | 3.00 | 2.00 | 0.0200 |")
  assert "n/a (memory only)" in hac.row("small", "tied_200m", "chunked",
                                        _record(source="cost model"))
  assert "splash kernel not priced" in hac.row("pod", "tied_200m", "splash", _record())
  priced = _record()
  priced["steps"][0]["splash_s"] = 1e-4
  assert "(splash at its FLOPs at the peak rate: a lower bound)" in hac.row(
      "pod", "tied_200m", "ladder", priced)
  assert "does not fit: needs 120.00 GiB" in hac.row("small", "tied_200m", "dense",
                                                      _record(fits=False))


def test_the_rung_table_puts_the_four_pairs_side_by_side_and_names_the_fastest():
  slow, fast = _record(step_s=0.03), _record(step_s=0.02)
  cells = {("pod (v5p-128)", "tied_200m"): {"ladder_dense_xla": slow,
                                            "ladder_chunked_splash": fast,
                                            "ladder_dense_splash": _record(fits=False)},
           ("mid (v5p-32)", "tied_1.2b"): {"ladder_dense_xla": _record(source="cost model")},
           ("pod (v5p-128)", "tied_400m"): {"dense": fast}}  # no pair: no row
  lines = hac.rung_table(cells).splitlines()
  assert lines[0] == ("| setup | rung | dense + xla | dense + splash | chunked + xla | "
                      "chunked + splash | fastest (ESTIMATE) |")
  assert lines[2:] == [
      "| pod (v5p-128) | tied_200m | 0.0300 s, 3.00 GiB | does not fit | - | "
      "0.0200 s, 3.00 GiB | chunked + splash |",
      "| mid (v5p-32) | tied_1.2b | 3.00 GiB | - | - | - | n/a (memory only) |"]


def test_existing_cells_are_read_not_compiled(tmp_path, capsys):
  for variant in ("dense", "chunked"):
    path = tmp_path / "small" / "v5p:2x2x1" / "tied_200m" / f"{variant}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_record(source="cost model")))
  assert hac.main(["--setups", "small", "--variants", "dense,chunked",
                   "--out", str(tmp_path)]) == 0
  table = (tmp_path / "table.md").read_text()
  assert table.count("| small (v5p:2x2x1) | tied_200m |") == 2
  assert ": exit " not in capsys.readouterr().out  # compile_cell ran no lev-compile


@pytest.mark.parametrize("argv, words", [
    (["--variants", "dense,flash"], "--variants=dense,flash: expected some of"),
    (["--setups", "huge"], "--setups=huge: expected some of pod, mid, small"),
    (["--rungs", "tied_9b"], "--rungs=tied_9b: expected some of"),
])
def test_bad_flags_are_one_line(argv, words, capsys):
  with pytest.raises(SystemExit) as e:
    hac.main(argv)
  assert e.value.code == 2 and words in capsys.readouterr().err


def test_every_variant_starts_from_the_program_before_issue_24():
  """Review of issue 24: the variants were overrides of the ladder as it is now (bfloat16
  logits, the platform's attention), so `dense` no longer compiled the published "float32
  logits, XLA attention" row. Every field the ladder has since changed is pinned."""
  from lev_jax.config import base_config
  from lev_jax.experiments import load_experiment
  ladder = load_experiment(hac.REPO / "experiments" / "ladder.py").get_config("tied_200m")
  pinned = {flag.split("=")[0][len("--config."):]: flag.split("=")[1] for flag in hac.BEFORE}
  assert pinned == {"train.loss_impl": "dense", "model.logits_dtype": "float32",
                    "model.attention": "xla", "model.attention_logits_dtype": "float32",
                    "model.embedding_grad_dtype": "float32", "model.remat": "none"}
  base = base_config()
  for field in pinned:  # each differs in the ladder now, or would silently follow it
    section, name = field.split(".")
    assert ladder[section][name] != base[section][name] or field == "model.attention"


def test_chunked_variants_keep_the_published_whole_vocab_and_ladder_variants_are_unpinned():
  """train.loss_vocab_chunk = 0 became automatic (vocab chunks above 65,536 ids): the
  published chunked rows were compiled over the whole vocab, so those variants ask for
  it; `ladder` compiles experiments/ladder.py as it is."""
  for name, flags in hac.VARIANTS.items():
    if "--config.train.loss_impl=chunked" in flags and name != "chunked_vocab":
      assert "--config.train.loss_vocab_chunk=200064" in flags, name
  assert hac.LADDER_VARIANTS["ladder"] == ()
  assert hac.LADDER_VARIANTS["ladder_chunked_xla"] == (
      "--config.train.loss_impl=chunked", "--config.model.attention=xla")
  assert not set(hac.LADDER_VARIANTS) & set(hac.VARIANTS)
