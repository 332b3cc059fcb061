"""Analytic FLOPs and MFU: hand-computed tiny configs, the LEV mode switch as
embeddings.py decides it, the peak table, and the 6N rule at 1.2B."""


import jax
import jax.numpy as jnp
import ml_collections
import pytest
from flax import nnx

from lev_jax import flops
from lev_jax.config import REMAT_POLICIES, ConfigError, base_config
from lev_jax.embeddings import make_embedding
from lev_jax.lev import LEV
from lev_jax.experiments import experiments_dir, load_experiment


def load_ladder():
  return load_experiment(experiments_dir() / "ladder.py")


def tiny(embedding="lev", mode="auto", batch=4, seq_len=16, accum=1):
  """vocab 300 -> V = 384; D=32, 2 layers, H=4, G=2, K=8, F=64; LEV S=8 Hl=2 J=6 R=4."""
  c = base_config()
  m = c.model
  m.embedding, m.vocab_size, m.d_model, m.n_layers = embedding, 300, 32, 2
  m.n_heads, m.n_kv_heads, m.head_dim, m.d_ff = 4, 2, 8, 64
  c.lev.d_seed, c.lev.n_heads, c.lev.n_knots, c.lev.rank, c.lev.mode = 8, 2, 6, 4, mode
  c.train.global_batch_size, c.train.seq_len, c.train.grad_accum_steps = batch, seq_len, accum
  return c


def with_remat(config, remat):
  """A copy with model.remat = remat (a policy name or a bool, whatever the field type)."""
  d = config.to_dict()
  d["model"]["remat"] = remat
  return ml_collections.ConfigDict(d)


# Hand calculation for tiny() with B=4, L=16: T = 64 tokens.
#   matmul params per layer: wq 32*4*8 = 1024, wk + wv 2*32*2*8 = 1024, wo 4*8*32 = 1024,
#     SwiGLU 3*32*64 = 6144  -> 9216
#   backbone  6 * 64 * 2 * 9216                       = 7,077,888
#   attention forward per layer 2*2*B*L*L*H*K/2 = 2*2*4*16*16*4*8/2 = 65,536;
#     x 2 layers x 3 (fwd + bwd)                      =   393,216
#   head      6 * 64 * 32 * 384                       = 4,718,592
#   LEV per row: seed 2*2*8*8 = 256, phi 2*2*8*6*4 = 768, out 2*2*4*32 = 512 -> 1536
#   LEV auto: V = 384 is not < 64 tokens -> tokens mode: 3 * 64 * 1536 = 294,912
#   LEV table: 3 * 384 * 1536                         = 1,769,472
BACKBONE, ATTENTION, HEAD = 7_077_888, 393_216, 4_718_592
LEV_ROW, LEV_TOKENS, LEV_TABLE = 1_536, 294_912, 1_769_472


def test_tiny_config_by_hand():
  f = flops.train_flops_per_step(tiny("tied"))
  assert f == {"backbone": BACKBONE, "attention": ATTENTION, "head": HEAD, "lev": 0,
               "total": 12_189_696}
  assert flops.tokens_per_step(tiny()) == 64
  assert flops.lev_forward_flops_per_row(tiny()) == LEV_ROW
  lev = flops.train_flops_per_step(tiny("lev"))
  assert lev["lev"] == LEV_TOKENS and lev["total"] == 12_189_696 + 294_912 == 12_484_608
  table = flops.train_flops_per_step(tiny("lev", mode="table"))
  assert table["lev"] == LEV_TABLE


def test_attention_is_causal_half_and_quadratic_in_length():
  # Full square would be 2 * 2*B*L*L*H*K per layer forward; causal counts half of it.
  full_square_train = 3 * 2 * (2 * 2 * 4 * 16 * 16 * 4 * 8)
  assert flops.train_flops_per_step(tiny())["attention"] * 2 == full_square_train
  # Same tokens, twice the length: backbone and head unchanged, attention doubles.
  a = flops.train_flops_per_step(tiny("tied", batch=4, seq_len=16))
  b = flops.train_flops_per_step(tiny("tied", batch=2, seq_len=32))
  assert (a["backbone"], a["head"]) == (b["backbone"], b["head"])
  assert b["attention"] == 2 * a["attention"] == 786_432
  # GQA: kv heads change the K/V projections only, not the score / value products.
  c = tiny("tied")
  c.model.n_kv_heads = 4
  f = flops.train_flops_per_step(c)
  assert f["attention"] == ATTENTION
  assert f["backbone"] == BACKBONE + 6 * 64 * 2 * (2 * 32 * 2 * 8)  # two more kv heads


def test_tied_untied_lev_share_backbone_and_head():
  t, u, l = (flops.train_flops_per_step(tiny(e)) for e in ("tied", "untied", "lev"))
  assert t == u  # the untied input gather is free; the head is D x V either way
  for part in ("backbone", "attention", "head"):
    assert l[part] == t[part]
  assert l["total"] - t["total"] == l["lev"] == LEV_TOKENS


def _uses_table(config):
  """What embeddings.LEVEmbedding.embed does for one micro-batch: table or per token."""
  emb = make_embedding(config.model, config.lev, rngs=nnx.Rngs(0), dtype=jnp.float32,
                       param_dtype=jnp.float32)
  calls = []
  original = LEV.table

  def spy(self):
    calls.append(1)
    return original(self)

  micro = (config.train.global_batch_size // config.train.grad_accum_steps,
           config.train.seq_len)
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(LEV, "table", spy)
    jax.eval_shape(emb.embed, jax.ShapeDtypeStruct(micro, jnp.int32))
  return bool(calls)


@pytest.mark.parametrize("mode,batch,accum,rows,table", [
    ("auto", 4, 1, 64, False),     # 64 tokens per micro-batch, V = 384: per token
    ("auto", 23, 1, 368, False),   # 368 tokens < V: per token
    ("auto", 24, 1, 384, False),   # 384 tokens: V < 384 is false -> per token, 384 rows
    ("auto", 25, 1, 384, True),    # 400 tokens > V: the V-row table
    ("auto", 32, 2, 256, False),   # 512 tokens per step but 256 per micro-batch
    ("table", 4, 1, 384, True),
    ("tokens", 32, 1, 512, False),
])
def test_lev_rows_follow_embeddings_mode_switch(mode, batch, accum, rows, table):
  c = tiny("lev", mode=mode, batch=batch, accum=accum)
  assert flops.lev_rows_per_micro_batch(c) == rows
  assert _uses_table(c) == table  # what embeddings.py actually does for this micro-batch
  assert flops.train_flops_per_step(c)["lev"] == 3 * accum * rows * LEV_ROW


def test_grad_accumulation():
  one, two = (flops.train_flops_per_step(tiny("lev", mode="table", batch=8, accum=a))
              for a in (1, 2))
  for part in ("backbone", "attention", "head"):
    assert one[part] == two[part]  # same tokens per step, however split
  # table mode: the V-row table is evaluated once per micro-batch -> twice the LEV work
  assert one["lev"] == 3 * 384 * LEV_ROW == 1_769_472
  assert two["lev"] == 2 * 3 * 384 * LEV_ROW == 3_538_944
  # tokens mode: rows per micro-batch halve, micro-batches double -> unchanged
  t1, t2 = (flops.train_flops_per_step(tiny("lev", mode="tokens", batch=8, accum=a))
            for a in (1, 2))
  assert t1["lev"] == t2["lev"] == 3 * 128 * LEV_ROW == 589_824
  with pytest.raises(ConfigError, match="grad_accum_steps"):
    flops.train_flops_per_step(tiny(batch=4, accum=3))


def test_remat_is_counted_apart():
  c = tiny("lev")
  model = flops.train_flops_per_step(c)
  # LEV is always under jax.checkpoint: seed projection + phi recomputed, not the output
  # projection: 64 rows * (256 + 768) = 65,536.
  assert flops.remat_flops_per_step(c) == {
      "backbone": 0, "attention": 0, "head": 0, "lev": 65_536, "total": 65_536}
  c = with_remat(c, "full")
  assert flops.train_flops_per_step(c) == model  # model FLOPs do not change
  r = flops.remat_flops_per_step(c)
  assert flops.remat_flops_per_step(with_remat(c, True)) == r
  # every block matmul but w_down, forward once: 2 * 64 * 2 * (9216 - 32*64) = 1,835,008;
  # attention forward: 393,216 / 3 = 131,072
  assert (r["backbone"], r["attention"], r["head"]) == (1_835_008, 131_072, 0)
  assert r["total"] == 1_835_008 + 131_072 + 65_536
  assert flops.remat_flops_per_step(with_remat(c, "dots"))["total"] == 65_536
  assert flops.remat_flops_per_step(with_remat(c, "dots_no_batch"))["total"] == 131_072 + 65_536
  assert flops.remat_flops_per_step(with_remat(c, False))["total"] == 65_536
  assert flops.remat_flops_per_step(tiny("tied"))["total"] == 0
  with pytest.raises(ConfigError, match="model.remat"):
    flops.remat_flops_per_step(with_remat(c, "everything"))
  assert list(flops._REMAT_RECOMPUTES) == list(REMAT_POLICIES)  # every policy counted


@pytest.mark.parametrize("kind,peak", [
    ("TPU v4", 275e12),
    ("TPU v5 lite", 197e12),
    ("TPU v5e", 197e12),
    ("TPU v5", 459e12),
    ("TPU v5p", 459e12),
    ("TPU v6 lite", 918e12),
    ("TPU v6e", 918e12),
    ("NVIDIA A100-SXM4-80GB", 312e12),
    ("NVIDIA A100-SXM4-40GB", 312e12),
    ("NVIDIA A100 80GB PCIe", 312e12),
    ("NVIDIA H100 80GB HBM3", 989.5e12),
    ("NVIDIA H100", 989.5e12),
    ("NVIDIA H100 PCIe", 756.5e12),
    ("NVIDIA H100 NVL", 835.5e12),
    ("NVIDIA H200", 989.5e12),
    ("NVIDIA H200 NVL", 835.5e12),
])
def test_peak_table_lookup(kind, peak):
  assert flops.peak_flops_per_device(kind) == pytest.approx(peak, rel=1e-12)


@pytest.mark.parametrize("kind", [
    "cpu", "TPU v4 lite", "TPU v3", "TPU v2", "TPU7x", "TPU v5 litex", "NVIDIA A10G",
    "NVIDIA A100X", "NVIDIA GH200 480GB", "NVIDIA H800", "NVIDIA B200", "Tesla V100-SXM2-16GB",
    "", None,
])
def test_unknown_devices_have_no_peak(kind):
  assert flops.peak_flops_per_device(kind) is None
  assert flops.mfu(1e12, 1.0, 1, kind) is None


def test_v5_lite_is_v5e_not_v5p():
  assert flops.peak_flops_per_device("TPU v5 lite") == flops.PEAK_BF16_FLOPS["TPU v5e"]
  assert flops.peak_flops_per_device("TPU v5") == flops.PEAK_BF16_FLOPS["TPU v5p"]
  assert flops.PEAK_BF16_FLOPS["TPU v5e"] != flops.PEAK_BF16_FLOPS["TPU v5p"]


def test_mfu_and_throughput_arithmetic():
  # 3.94e14 FLOPs in 1 s on 4 v5e chips (197e12 each = 7.88e14/s): 50 %.
  assert flops.mfu(3.94e14, 1.0, 4, "TPU v5 lite") == pytest.approx(0.5)
  # 3.958e15 FLOPs in 2 s on 8 H100 SXM (989.5e12 each): 3.958e15 / 1.5832e16 = 25 %.
  assert flops.mfu(3.958e15, 2.0, 8, "NVIDIA H100 80GB HBM3") == pytest.approx(0.25)
  f = flops.train_flops_per_step(tiny("tied"))
  assert flops.mfu(f, 1e-6, 1, "TPU v4") == pytest.approx(12_189_696 / 1e-6 / 275e12)
  assert flops.tokens_per_s_per_device(262_144, 0.5, 8) == 65_536.0
  with pytest.raises(ValueError):
    flops.mfu(1.0, 0.0, 1, "TPU v4")
  with pytest.raises(ValueError):
    flops.tokens_per_s_per_device(1, 1.0, 0)


def test_six_n_rule_at_1_2b():
  from lev_jax.params import count_params
  ladder = load_ladder()
  config = ladder.get_config("tied_1.2b")
  # Tied: the one table is the output head; no separate input-embedding parameters.
  n = count_params(config)["total"]
  f = flops.train_flops_per_step(config)
  per_token = (f["backbone"] + f["head"]) / flops.tokens_per_step(config)
  assert per_token == pytest.approx(6 * n, rel=0.02)
  # And Leviathan at 1.2B costs about 0.1 % more per step (LEV table, once per step).
  lev = flops.train_flops_per_step(ladder.get_config("leviathan_1.2b"))
  assert 0 < lev["lev"] / lev["total"] < 0.005


def test_unique_mode_rows_are_its_bound():
  c = tiny("lev", mode="unique", batch=32)
  c.lev.unique_size = 100
  assert flops.lev_rows_per_micro_batch(c) == 100
  c.lev.mode = "auto"  # 100 < min(V = 384, 512 tokens): auto picks unique
  assert flops.lev_rows_per_micro_batch(c) == 100


def test_fused_lev_share_of_a_1_2b_step_is_small_and_below_the_reference():
  ladder = load_ladder()
  c = ladder.get_config("leviathan_1.2b")
  fused = flops.lev_step_share(c, "fused")
  ref = flops.lev_step_share(c, "reference")
  assert fused["rows"] == 262_144  # lev.mode tokens: every token of the 512 x 512 batch
  assert fused["share"] < 0.03 and fused["share"] < ref["share"] / 2
  assert 3.0 < fused["step_s"] < 6.0  # ~1.9e15 FLOPs at half of 989.5 TFLOP/s
  with pytest.raises(ConfigError, match="impl = 'pallas'"):
    flops.lev_step_share(c, "pallas")


def test_lev_plan_line_names_the_core_rows_and_the_fallback():
  c = tiny("lev", mode="unique", batch=32)
  line = flops.lev_plan_line(c)
  assert line.startswith("LEV: fused core, lev.mode=unique -> unique: 192 rows per "
                         "micro-batch of 512 tokens (padded vocab 384)")
  assert "more than 192 distinct ids runs table mode instead" in line
