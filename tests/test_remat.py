"""lev_jax/remat.py: model.remat = "auto" from the activations' estimate, the choice in
the traced program, and where an unresolved auto is refused."""

import jax
import numpy as np
import pytest
from flax import nnx

from conftest import tiny_config
from lev_jax import flops, remat, topology
from lev_jax.config import ConfigError, validate
from lev_jax.experiments import load_experiment
from lev_jax.model import Decoder

GiB = 2**30
V5P = 95 * GiB


def _ladder(rung):
  from pathlib import Path  # noqa: PLC0415
  return load_experiment(Path(__file__).resolve().parent.parent
                         / "experiments" / "ladder.py").get_config(rung)


def test_kept_bytes_follow_the_calibrated_rows():
  m = _ladder("tied_200m").model  # d 768, d_ff 2048, 12 heads
  assert remat.saved_bytes_per_token_layer(m, "none", 512, False) == 32 * 768 + 16 * 2048
  assert remat.saved_bytes_per_token_layer(m, "none", 512, True) == (
      32 * 768 + 16 * 2048 + 4 * 12 * 512)  # XLA attention keeps its scores
  assert remat.saved_bytes_per_token_layer(m, "dots_no_batch", 512, True) == 16 * 768 + 8 * 2048
  assert remat.saved_bytes_per_token_layer(m, "full", 512, True) == 4 * 768
  with pytest.raises(ValueError, match="model.remat = 'some'"):
    remat.saved_bytes_per_token_layer(m, "some", 512, True)


@pytest.mark.parametrize("rung,chips,expected", [
    ("tied_200m", 64, "none"),           # the ladder's v5p-128 slice: 4,096 tokens a chip
    ("tied_1.2b", 64, "none"),
    ("tied_200m", 4, "dots_no_batch"),   # 65,536 tokens a chip: 21.0 GiB kept without
    ("leviathan_800m", 16, "dots_no_batch"),
    ("tied_1.2b", 4, "full"),            # even dots_no_batch would keep 76 GiB
])
def test_the_ladder_remats_only_where_a_chip_holds_many_tokens(rung, chips, expected):
  c = _ladder(rung)
  assert c.model.remat == "auto"
  policy, why = remat.resolve(c, chips, V5P, "splash")
  assert policy == expected, why
  assert why.startswith("auto; activations kept per device (estimate): none ")


def test_auto_boundaries_and_explicit_choices():
  c = tiny_config("tied")  # 64 tokens a micro-batch, d 32, d_ff 64, 1 layer
  c.model.remat = "auto"
  none = (32 * 32 + 16 * 64) * 64  # splash-like: no scores
  assert remat.resolve(c, 1, None, "xla") == ("none", "auto; device memory unknown (CPU)")
  assert remat.resolve(c, 1, 5 * none, "splash")[0] == "none"  # exactly a fifth
  assert remat.resolve(c, 1, 5 * none - 1, "splash")[0] == "dots_no_batch"
  assert remat.resolve(c, 2, 5 * none - 1, "splash")[0] == "none"  # half the tokens each
  assert remat.resolve(c, 1, 5 * none, "xla")[0] == "dots_no_batch"  # + the scores
  policy, why = remat.resolve(c, 1, 1, "splash")
  assert policy == "full" and why.endswith("none is, so full")
  c.train.grad_accum_steps, c.train.global_batch_size = 2, 4  # a micro-batch: 32 tokens
  assert remat.resolve(c, 1, 5 * none - 1, "splash")[0] == "none"
  c.model.remat = "dots"
  assert remat.resolve(c, 1, 1, "xla") == ("dots", "model.remat")


def _has_checkpoint(c, monkeypatch, memory):
  """Whether the jitted loss-and-gradient program of `c` rematerialises, with every
  device reporting `memory` bytes."""
  monkeypatch.setattr(topology, "device_memory_bytes", lambda device: memory)
  model = Decoder(c, rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model, nnx.Param)
  ids = np.zeros((4, 16), np.int32)
  f = lambda p: nnx.merge(graphdef, p)(ids).mean()
  text = str(jax.make_jaxpr(jax.value_and_grad(f))(params))
  return "remat2[" in text  # jax.checkpoint's primitive (jax 0.10)


def test_auto_is_resolved_when_the_model_is_traced(monkeypatch):
  c = tiny_config("tied")
  c.model.remat = "auto"
  validate(c)
  assert not _has_checkpoint(c, monkeypatch, None)  # a CPU: none
  assert not _has_checkpoint(c, monkeypatch, 2**40)
  assert _has_checkpoint(c, monkeypatch, 1)  # memory short: full
  c.model.remat = "full"
  assert _has_checkpoint(c, monkeypatch, None)  # an explicit policy, whatever the memory


def test_unknown_remat_names_auto_and_flops_need_it_resolved():
  c = tiny_config("tied")
  c.model.remat = "sometimes"
  with pytest.raises(ConfigError, match="one of 'auto', 'none', 'full', 'dots', "
                     "'dots_no_batch'"):
    validate(c)
  c.model.remat = "auto"
  with pytest.raises(ConfigError, match="resolve it for the devices first"):
    flops.remat_flops_per_step(c)
  assert flops.remat_flops_per_step(c, "none")["total"] == 0
  assert flops.remat_flops_per_step(c, "full")["total"] > 0
