"""Parameter counts: the ladder's labels and Leviathan - tied = LEV, without allocating."""


import pytest

from lev_jax.config import padded_vocab_size, validate
from lev_jax.lev import lev_param_count
from lev_jax.params import count_params, tied_twin
from lev_jax.experiments import experiments_dir, load_experiment


def load(name):
  return load_experiment(experiments_dir() / f"{name}.py")


LADDER = load("ladder")
SMOKE = load("smoke")


@pytest.mark.parametrize("size", list(LADDER.SHAPES))
def test_ladder_rung_builds_and_matches_its_label(size):
  tied = validate(LADDER.get_config(f"tied_{size}"))
  lev = validate(LADDER.get_config(f"leviathan_{size}"))
  assert padded_vocab_size(tied.model.vocab_size, 128) == 200_064
  assert tied.train.seq_len == 512 and tied.train.global_batch_size == 512
  t, l = count_params(tied), count_params(lev)
  assert abs(t["total"] / tied.label_params - 1) <= 0.05, (size, t["total"])
  lev_count = lev_param_count(200_064, lev.model.d_model, lev.lev)
  assert l["lev"] == lev_count
  assert l["total"] - t["total"] == lev_count
  assert t["backbone"] == l["backbone"] and t["embedding"] == l["head"] and l["embedding"] == 0


def test_lev_share_at_1_2b_is_about_0_2_percent():
  lev = LADDER.get_config("leviathan_1.2b")
  share = count_params(lev)["lev"] / count_params(tied_twin(lev))["total"]
  assert 0.0015 < share < 0.0025


def test_smoke_variants_differ_only_in_the_embedding():
  configs = {v: SMOKE.get_config(v) for v in SMOKE.VARIANTS}
  base = configs["tied"].to_dict()
  for name, c in configs.items():
    d = c.to_dict()
    assert d.pop("name") and d["model"].pop("embedding")
    ref = dict(base, model={k: v for k, v in base["model"].items() if k != "embedding"})
    ref.pop("name")
    assert d == ref, name
  counts = {v: count_params(c) for v, c in configs.items()}
  assert counts["untied"]["total"] == counts["tied"]["total"] + counts["untied"]["head"]


def test_unknown_variants_are_named():
  with pytest.raises(ValueError, match="leviathan_1.2b"):
    LADDER.get_config("leviathan_7b")
  with pytest.raises(ValueError, match="tied, untied, leviathan"):
    SMOKE.get_config("lev")
