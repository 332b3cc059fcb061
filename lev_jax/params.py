"""Parameter counts by part (embedding, LEV, backbone, head), for any config, without
allocating the model (`jax.eval_shape`); the report `lev-params` prints
(lev_jax/cli/params.py). For a `lev` model the report also builds the tied twin (same
config, model.embedding='tied') and shows that Leviathan - tied = LEV's closed-form count;
for configs with a `label_params` it shows the deviation from the label.
"""

from __future__ import annotations

import jax
import ml_collections
from flax import nnx

from lev_jax.config import padded_vocab_size, validate
from lev_jax.lev import lev_param_count
from lev_jax.optimizer import param_group

PARTS = ("embedding", "lev", "backbone", "head")


def _part(name: str) -> str:
  """The PARTS name of a parameter path: optimizer.param_group's, with the input table
  ("embedding_table") reported as "embedding"."""
  group = param_group(name)
  return "embedding" if group == "embedding_table" else group


def count_params(config: ml_collections.ConfigDict) -> dict:
  """{"embedding", "lev", "backbone", "head", "total"}: parameter counts (abstract shapes).

  For `tied`, the one shared table is counted under "embedding" (head = 0).
  """
  from lev_jax.train import abstract_model
  state = nnx.state(abstract_model(config), nnx.Param)
  counts = dict.fromkeys(PARTS, 0)
  for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
    counts[_part(jax.tree_util.keystr(path, simple=True, separator="/"))] += int(leaf.size)
  counts["total"] = sum(counts[p] for p in PARTS)
  return counts


def tied_twin(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  twin = ml_collections.ConfigDict(config.to_dict())
  twin.model.embedding = "tied"
  return twin


def report(config: ml_collections.ConfigDict) -> str:
  """The text `lev-params` prints."""
  validate(config)
  c = count_params(config)
  vp = padded_vocab_size(config.model.vocab_size, config.model.vocab_multiple)
  lines = [f"{config.name}: embedding={config.model.embedding} "
           f"vocab={config.model.vocab_size} (padded {vp}) "
           f"d_model={config.model.d_model} n_layers={config.model.n_layers}"]
  for p in (*PARTS, "total"):
    lines.append(f"  {p:<10} {c[p]:>15,}")
  if config.get("label_params"):
    dev = c["total"] / config.label_params - 1
    basis = c["total"]
    if config.model.embedding == "lev":
      basis = count_params(tied_twin(config))["total"]
      dev = basis / config.label_params - 1
    lines.append(f"  label      {config.label_params:>15,.0f}  (tied-equivalent total "
                 f"{basis:,} is {dev:+.2%} of the label)")
  if config.model.embedding == "lev":
    tied = count_params(tied_twin(config))["total"]
    formula = lev_param_count(vp, config.model.d_model, config.lev)
    lines.append(f"  tied twin  {tied:>15,}")
    lines.append(f"  leviathan - tied = {c['total'] - tied:,} "
                 f"(LEV closed form {formula:,}; {(c['total'] - tied) / tied:.3%} of tied)")
  return "\n".join(lines)
