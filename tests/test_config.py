"""Config validation: each bad value is one ConfigError naming the field."""

import ml_collections
import pytest

from conftest import tiny_config
from lev_jax.config import (ConfigError, base_config, lev_base, lev_digit_base,
                            padded_vocab_size, validate)


def test_base_config_is_valid():
  validate(base_config())


def test_a_bad_lev_value_is_refused_on_a_model_without_lev():
  """Issue 26: `--config.lev.basis=foo` on a tied model trained and kept the bad value
  in its config (the lev section was checked only for model.embedding = lev)."""
  c = tiny_config("tied")
  c.lev.basis = "foo"
  with pytest.raises(ConfigError, match=r"^config.lev.basis = 'foo': expected one of"):
    validate(c)


def test_seeds_beyond_what_jax_and_numpy_take_are_refused():
  """Newcomer pass 4: --config.seed=99999999999999999999 was an OverflowError traceback
  (also with --preflight); a negative data.seed failed only once a stream was opened."""
  c = tiny_config()
  for seed in (-2**63, 2**63 - 2):
    c.seed = seed
    validate(c)
  c.seed = 10**20
  with pytest.raises(ConfigError, match=r"^config.seed = 100000000000000000000: expected an "
                     r"integer in \[-2\*\*63, 2\*\*63 - 2\] \(jax.random.key takes a signed "
                     "64-bit seed"):
    validate(c)
  c.seed, c.data.seed = 0, -1
  validate(c)  # grain's shuffles take any integer
  c.data.source, c.data.train_files, c.data.validation_files = "jsonl_stream", ("a",), ("b",)
  with pytest.raises(ConfigError, match=r"^config.data.seed = -1: expected an integer >= 0 "
                     "with data.source = 'jsonl_stream'"):
    validate(c)


@pytest.mark.parametrize("field,value,match", [
    ("train.steps", -5, r"config.train.steps = -5: expected a positive number"),
    # issue 26: 1e20 steps (beyond int64) was accepted and trained until killed
    ("train.steps", 10**20, r"^config.train.steps = 100000000000000000000: expected at most "
     r"2147483647 \(2\*\*31 - 1: the step counter is int32\)$"),
    ("train.checkpoint_every", 2**31, r"^config.train.checkpoint_every = 2147483648: expected "
     r"at most 2147483647"),
    ("train.seq_len", 4096, r"config.train.seq_len = 4096: expected <= model.max_seq_len = 2048"),
    ("model.embedding", "hashed", r"config.model.embedding = 'hashed': expected one of 'tied'"),
    ("model.n_kv_heads", 3, r"config.model.n_kv_heads = 3: expected a divisor of model.n_heads"),
    ("model.dtype", "int8", r"config.model.dtype = 'int8'"),
    ("model.embedding_grad_dtype", "bfloat16", r"^config.model.embedding_grad_dtype = "
     r"'bfloat16': expected 'float32' unless model.dtype = 'bfloat16'"),
    ("lev.sigmoid", "tanh", r"config.lev.sigmoid = 'tanh': expected one of 'half', 'full'"),
    ("lev.basis", "cubic", r"config.lev.basis = 'cubic'"),
    ("lev.n_knots", 2, r"config.lev.n_knots = 2: expected an integer >= 3, the spline "
     r"order \(quadratic B-splines: each input has 3 nonzero basis functions"),
    ("lev.n_knots", True, r"config.lev.n_knots = True: expected an integer >= 3"),
    ("lev.output_norm", "layernorm", r"^config.lev.output_norm = 'layernorm': expected one "
     r"of 'none', 'rmsnorm', 'scale'$"),
    ("lev.permutation_seed", -1, r"^config.lev.permutation_seed = -1: expected an integer "
     r">= 0$"),
    ("lev.permutation_seed", True, r"^config.lev.permutation_seed = True: expected an "
     r"integer >= 0$"),
    ("lev.permutation_seed", 3, r"^config.lev.permutation_seed = 3: expected 0 without "
     r"lev.id_permutation"),
    ("optim.lev_weight_decay", -0.1, r"^config.optim.lev_weight_decay = -0.1: expected -1 "
     r"\(the same as optim.weight_decay\) or a finite number >= 0$"),
    ("optim.lev_warmup_steps", 10, r"^config.optim.lev_warmup_steps = 10: expected -1 \(the "
     r"same as optim.warmup_steps\) or an integer in \[0, train.steps = 10\)$"),
    ("train.grad_accum_steps", 3, r"a divisor of train.global_batch_size = 4"),
    ("optim.warmup_steps", 10, r"^config.optim.warmup_steps = 10: expected in \[0, "
     r"train.steps = 10\); lower it with --config.optim.warmup_steps=N \(or raise "
     r"train.steps\)$"),
    ("optim.decay_mask", "some", r"config.optim.decay_mask = 'some'"),
    ("optim.clip_mode", "layer", r"config.optim.clip_mode = 'layer': expected one of "
     r"'global', 'per_group', 'exclude_lev'"),
    ("optim.lev_lr_multiplier", -0.5, r"config.optim.lev_lr_multiplier = -0.5: expected a "
     r"finite number >= 0"),
    ("optim.lev_lr_multiplier", float("inf"), r"config.optim.lev_lr_multiplier = inf"),
    ("lev.out_proj_init", "xavier", r"config.lev.out_proj_init = 'xavier': expected one of "
     r"'paper', 'match_table'"),
    ("lev.phi_grad_dtype", "bf16", r"^config.lev.phi_grad_dtype = 'bf16': expected one of "
     r"'float32', 'bfloat16'$"),
    ("lev.phi_grad_dtype", "bfloat16", r"^config.lev.phi_grad_dtype = 'bfloat16': expected "
     r"'float32' with lev.impl = 'fused' \(only the vectorized core stores phi's "
     r"gradient\)$"),
    ("data.source", "hub", r"config.data.source = 'hub'"),
    ("data.tokenizer", "gpt2", r"config.data.tokenizer = 'gpt2'"),
    ("data.validation_fraction", 1.5, r"config.data.validation_fraction = 1.5"),
    ("data.test_fraction", 0.96, r"config.data.test_fraction = 0.96: expected a number in "
     r"\[0, 1 - data.validation_fraction = 0.95\)"),
    ("eval.freq_bucket_edges", (10, 1), r"config.eval.freq_bucket_edges = \(10, 1\)"),
    ("eval.freq_bucket_edges", ("n", "o"), r"config.eval.freq_bucket_edges = \('n', 'o'\): "
     r"expected increasing positive counts"),
])
def test_bad_values_name_field_and_expectation(field, value, match):
  c = tiny_config()
  section, name = field.split(".")
  c[section][name] = value
  with pytest.raises(ConfigError, match=match):
    validate(c)


@pytest.mark.parametrize("field,value,match", [
    ("cache_dir", "", r"^config.data.cache_dir = '': expected a folder for the data cache"),
    ("cache_dir", "  ", r"^config.data.cache_dir = '  '"),
    ("sentencepiece_file", " ", r"^config.data.sentencepiece_file = ' ': expected a path, "
     r"or '' \(unset\)$"),
    ("tiktoken_file", "\t", r"^config.data.tiktoken_file = '\\t'"),
    ("prepared_dir", " ", r"^config.data.prepared_dir = ' '"),
    ("test_files", ("",), r"^config.data.test_files = \('',\): expected no empty path$"),
])
def test_an_empty_data_path_is_refused(field, value, match):
  c = tiny_config()
  c.data.source = "prepared"  # where test_files are allowed
  c.data.prepared_dir = "/data/prepared"
  c.data[field] = value
  with pytest.raises(ConfigError, match=match):
    validate(c)


def test_jsonl_source_needs_files():
  c = tiny_config()
  c.data.source = "jsonl"
  with pytest.raises(ConfigError, match="data.train_files"):
    validate(c)


def test_lev_checks_apply_only_to_lev_models():
  c = tiny_config("tied", base=3)  # 27 < 384, irrelevant without LEV
  validate(c)
  c.model.embedding = "lev"
  with pytest.raises(ConfigError, match=r"3\*\*3 = 27 < padded vocab_size = 384"):
    validate(c)


@pytest.mark.parametrize("embedding,field,value,match", [
    ("tied", "id_permutation", True, r"^config.lev.id_permutation = True: expected False "
     r"with model.embedding = 'tied', which has no LEV$"),
    ("untied", "permutation_seed", 4, r"^config.lev.permutation_seed = 4: expected 0 "
     r"without lev.id_permutation"),
    ("untied", "output_norm", "rmsnorm", r"^config.lev.output_norm = 'rmsnorm': expected "
     r"'none' with model.embedding = 'untied', which has no LEV$"),
    ("tied", "output_norm", "norm", r"^config.lev.output_norm = 'norm': expected one of"),
    ("lev", "out_proj_init", "match_table", r"^config.lev.out_proj_init = 'match_table': "
     r"expected 'paper' with lev.output_norm = 'rmsnorm'"),
])
def test_lev_ablation_options_name_the_field_and_what_is_allowed(embedding, field, value,
                                                                 match):
  """LEV's ablation options are refused on a model without LEV and in combinations that
  mean nothing; with LEV (and their partners) they validate."""
  c = tiny_config(embedding, **({"output_norm": "rmsnorm"} if field == "out_proj_init"
                                else {}))
  c.lev[field] = value
  with pytest.raises(ConfigError, match=match):
    validate(c)
  validate(tiny_config(id_permutation=True, permutation_seed=4, output_norm="scale",
                       out_proj_init="match_table"))


def test_vocab_padding_and_base():
  assert padded_vocab_size(200_019, 128) == 200_064
  assert padded_vocab_size(2048, 128) == 2048
  assert padded_vocab_size(300, 128) == 384
  assert lev_base(200_064, 3) == 59 and lev_base(125, 3) == 5 and lev_base(126, 3) == 6


def test_lev_digit_base_is_the_automatic_or_the_configured_base_and_checks_it():
  assert lev_digit_base(0, 3, 200_064) == 59 and lev_digit_base(0, 3, 125) == 5
  assert lev_digit_base(8, 3, 384) == 8
  with pytest.raises(ConfigError, match=r"^config.lev.base \*\* config.lev.n_coords = "
                     r"7\*\*3 = 343 < padded vocab_size = 384: the base-b digits cannot "
                     r"address every token id$"):
    lev_digit_base(7, 3, 384)


def test_a_stream_cannot_be_split_among_worker_processes():
  c = base_config()
  c.data.update(source="jsonl_stream", train_files=("a.jsonl",), validation_files=("b.jsonl",),
                worker_processes=2)
  with pytest.raises(ConfigError, match="data.worker_processes = 2: expected 0 with"):
    validate(c)


def test_data_files_need_a_source_that_reads_them():
  c = base_config()
  c.data.train_files = ("pile/train/*.jsonl.zst",)  # source is still 'embedded'
  with pytest.raises(ConfigError, match=r"data.train_files = .*: expected no files with "
                     r"data.source = 'embedded'"):
    validate(c)


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("field,value,match", [
    ("optim.lr", NAN, r"^config.optim.lr = nan: expected a finite number$"),
    ("optim.lr", INF, r"^config.optim.lr = inf: expected a finite number$"),
    ("optim.lr", -INF, r"^config.optim.lr = -inf: expected a finite number$"),
    ("optim.weight_decay", NAN, r"^config.optim.weight_decay = nan: expected a finite number$"),
    ("optim.b2", 1.0, r"^config.optim.b2 = 1.0: expected a number in \[0, 1\)$"),
    ("optim.b1", 1.5, r"^config.optim.b1 = 1.5: expected a number in \[0, 1\)$"),
    ("optim.b1", -0.1, r"^config.optim.b1 = -0.1: expected a number in \[0, 1\)$"),
    ("optim.b2", NAN, r"^config.optim.b2 = nan: expected a finite number$"),
    ("lev.ln_eps", NAN, r"^config.lev.ln_eps = nan: expected a finite number$"),
    ("model.rope_theta", INF, r"^config.model.rope_theta = inf: expected a finite number$"),
    ("data.validation_fraction", NAN, r"^config.data.validation_fraction = nan"),
    ("eval.freq_bucket_edges", (1, NAN), r"^config.eval.freq_bucket_edges = \(1, nan\): "
     r"expected finite numbers$"),
    # newcomer pass 6: d_model 1e20 passed the checks and failed in MLIR with a traceback
    ("model.d_model", 10**20, r"^config.model.d_model = 100000000000000000000: expected at "
     r"most 2,147,483,647 \(2\*\*31 - 1, an array dimension\)$"),
    ("train.seq_len", 2**31, r"^config.train.seq_len = 2147483648: expected at most"),
])
def test_nan_inf_and_adam_betas_out_of_range_are_refused(field, value, match):
  c = tiny_config()
  section, name = field.split(".")
  c[section][name] = value
  with pytest.raises(ConfigError, match=match):
    validate(c)


def test_a_config_text_that_is_not_utf8_is_refused():
  """Newcomer pass 5: --config.name=$'ab\\xff' was accepted (it names the run's folder
  and is written into every JSON file)."""
  for field in ("name", "data.cache_dir"):
    c = tiny_config()
    *section, name = field.split(".")
    (c[section[0]] if section else c)[name] = "ab\udcff"
    with pytest.raises(ConfigError, match=rf"^config.{field} = 'ab\\udcff': expected UTF-8 "
                       r"text \(a byte that is not UTF-8 was given\)$"):
      validate(c)


def test_a_nan_in_a_nested_section_or_a_section_lev_does_not_use_is_refused():
  c = tiny_config("tied")  # lev.* is otherwise unchecked without LEV
  c.lev.log_eps = NAN
  with pytest.raises(ConfigError, match=r"^config.lev.log_eps = nan: expected a finite"):
    validate(c)
  c = tiny_config()
  c.eval.downstream = ml_collections.ConfigDict({"deep": ml_collections.ConfigDict(
      {"x": INF})})
  with pytest.raises(ConfigError, match=r"^config.eval.downstream.deep.x = inf: expected "
                     r"a finite number$"):
    validate(c, allow_unknown=True)  # a stored config's section of another shape


def test_adam_betas_at_zero_are_allowed():
  c = tiny_config()
  c.optim.b1, c.optim.b2 = 0.0, 0.0
  validate(c)


def test_a_field_the_base_config_lacks_is_refused_naming_the_closest():
  """Issue 26: `c.train.stepz = 3` in an experiment file trained 300 steps silently."""
  c = base_config()
  with c.train.unlocked():
    c.train.stepz = 3
  with pytest.raises(ConfigError, match=r"^config.train.stepz: not a field of the config "
                     r"\(did you mean 'steps'\?\)"):
    validate(c)
  c = base_config()
  c.qqq = ml_collections.ConfigDict({"zzz": 1})
  with pytest.raises(ConfigError, match=r"^config.qqq: not a field of the config "
                     r"\(config's fields: data, "):
    validate(c)
  with pytest.raises(ConfigError, match="the config is a dict; expected an ml_collections"):
    validate(base_config().to_dict())


def test_from_dict_fills_new_fields_and_restores_tuples():
  from lev_jax.config import from_dict
  stored = base_config().to_dict()
  del stored["train"]["nan_policy"]  # a field added after the config was stored
  stored["eval"]["freq_bucket_edges"] = [10, 100]  # JSON stores tuples as lists
  stored["optim"]["lr"] = 1  # an int where the config declares a float
  stored["train"]["retired"] = 3  # a field removed since: kept, not refused
  c = from_dict(stored, "ckpt/2")
  assert c.train.nan_policy == base_config().train.nan_policy
  assert c.eval.freq_bucket_edges == (10, 100) and c.optim.lr == 1.0


def test_from_dict_names_the_source_and_the_field():
  from lev_jax.config import from_dict
  stored = base_config().to_dict()
  stored["model"]["d_model"] = "wide"
  with pytest.raises(ConfigError, match=r"^ckpt/2: stored config.model.d_model = 'wide' "
                     "does not fit this lev_jax"):
    from_dict(stored, "ckpt/2")
  stored = base_config().to_dict()
  stored["model"]["embedding"] = "tabled"
  with pytest.raises(ConfigError, match=r"^ckpt/2: the stored config is not valid: "
                     "config.model.embedding = 'tabled'"):
    from_dict(stored, "ckpt/2")


def test_a_config_lacking_base_config_fields_is_one_line():
  """Newcomer pass 9: get_config returning ConfigDict({"name": "x"}) was a KeyError
  traceback ("'seed'") in lev-train and lev-params."""
  import ml_collections  # noqa: PLC0415
  with pytest.raises(ConfigError, match=r"^the config lacks config.data, config.eval, "
                     r"config.lev, config.mesh, config.model, config.optim and 2 more; "
                     "expected one built from lev_jax.config.base_config"):
    validate(ml_collections.ConfigDict({"name": "x"}))
  c = base_config()
  del c.train["steps"]
  with pytest.raises(ConfigError, match=r"^the config lacks config.train.steps; "):
    validate(c)
