"""Hugging Face LLaMA export: transformers' logits equal ours for every embedding and
layer layout; Leviathan's embed_tokens is LEV's output; tokenizer files give our ids."""

import functools
import json

import numpy as np
import pytest

safetensors_numpy = pytest.importorskip("safetensors.numpy")
# torch and transformers (~4 s of CPU to import): imported when the first test here runs,
# not when each pytest-xdist worker collects this file; the group keeps these tests on
# one worker (pyproject: --dist loadgroup); without them every test here skips.
torch = transformers = None
pytestmark = pytest.mark.xdist_group("torch")
from safetensors import safe_open

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

import conftest

# Two layers here: what these tests check depends on the layer stack.
tiny_config = functools.partial(conftest.tiny_config, n_layers=2)
from lev_jax import hf_export
from lev_jax.data.tokenizer import ByteTokenizer
from lev_jax.data.tokenizer_files import load_tokenizer
from lev_jax.model import Decoder

V = 259  # ByteTokenizer's vocab; padded to 384, so the export must slice
@nnx.jit
def _logits(model, ids_BxL):
  return model(ids_BxL)


def forward(model, ids_BxL):
  return np.asarray(_logits(model, jnp.asarray(ids_BxL)))


IDS_BxL = np.array([[0, 1, 258, 7, 100, 3, 258, 42, 5],
                    [257, 2, 9, 9, 150, 0, 201, 33, 64]])


@pytest.fixture(scope="module", autouse=True)
def quiet_transformers():
  global torch, transformers  # pylint: disable=global-statement
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  transformers.logging.set_verbosity_error()
  transformers.utils.logging.disable_progress_bar()


def scanned_twin(model, config):
  """The same weights in the scan_layers=True layout (every block param stacked)."""
  c = ml_collections.ConfigDict(config.to_dict())
  c.model.scan_layers = True
  graphdef, abstract = nnx.split(nnx.eval_shape(lambda: Decoder(c, rngs=nnx.Rngs(0))),
                                 nnx.Param)
  pure = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  layers = [pure["blocks"][i] for i in range(config.model.n_layers)]
  pure["blocks"] = jax.tree.map(lambda *xs: jnp.stack(xs), *layers)
  nnx.replace_by_pure_dict(abstract, pure)
  return nnx.merge(graphdef, abstract), c


@pytest.fixture(scope="module")
def models():
  """{(embedding, scan_layers): (model, config)}; the scanned twin shares the weights."""
  out = {}
  for kind in ("tied", "untied", "lev"):
    config = tiny_config(kind)
    config.model.vocab_size = V
    model = Decoder(config, rngs=nnx.Rngs(0))  # eager: quicker than compiling each init
    out[kind, False] = (model, config)
    out[kind, True] = scanned_twin(model, config)
  return out


@pytest.fixture(scope="module")
def exported(models, tmp_path_factory):
  """{(embedding, scan_layers): export folder} (float32, byte tokenizer)."""
  root = tmp_path_factory.mktemp("hf")
  folders = {}
  for (kind, scan), (model, config) in models.items():
    folders[kind, scan] = root / f"{kind}_{scan}"
    hf_export.save_hf(model, config, folders[kind, scan], tokenizer=ByteTokenizer())
  return folders


@pytest.mark.parametrize("kind", ["tied", "untied", "lev"])
def test_hf_logits_equal_ours(models, exported, kind):
  model, _ = models[kind, False]
  ours = forward(model, IDS_BxL)
  theirs = hf_export.hf_logits(exported[kind, False], IDS_BxL)
  assert theirs.shape == (*IDS_BxL.shape, V)
  np.testing.assert_allclose(theirs, ours[..., :V], atol=1e-4, rtol=1e-4)
  assert (ours[..., V:] == -1e9).all()  # the padded ids, sliced away in the export


def test_scanned_model_through_hf(models, exported):
  """One scanned model end to end (the others: identical tensors, next test)."""
  model, _ = models["lev", True]
  assert model.scan_layers and model.blocks.attn.wq.shape[0] == 2
  ours = forward(model, IDS_BxL)
  theirs = hf_export.hf_logits(exported["lev", True], IDS_BxL)
  np.testing.assert_allclose(theirs, ours[..., :V], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kind", ["tied", "untied", "lev"])
def test_config_and_tensor_names(exported, kind):
  folder = exported[kind, False]
  cfg = json.loads((folder / "config.json").read_text())
  assert cfg["tie_word_embeddings"] is (kind == "tied")
  assert cfg["model_type"] == "llama" and cfg["architectures"] == ["LlamaForCausalLM"]
  assert (cfg["vocab_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
          cfg["head_dim"]) == (V, 4, 2, 8)
  assert cfg["eos_token_id"] == 1 and cfg["pad_token_id"] == 0
  tensors = safetensors_numpy.load_file(str(folder / "model.safetensors"))
  assert ("lm_head.weight" in tensors) is (kind != "tied")
  assert tensors["model.embed_tokens.weight"].shape == (V, 32)
  assert tensors["model.layers.1.self_attn.k_proj.weight"].shape == (2 * 8, 32)
  assert tensors["model.layers.0.self_attn.o_proj.weight"].shape == (32, 4 * 8)


@pytest.mark.parametrize("kind", ["tied", "untied", "lev"])
def test_scanned_and_unscanned_layouts_export_the_same_tensors(exported, kind):
  a = safetensors_numpy.load_file(str(exported[kind, False] / "model.safetensors"))
  b = safetensors_numpy.load_file(str(exported[kind, True] / "model.safetensors"))
  assert sorted(a) == sorted(b)
  for name in a:
    np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_lev_embed_tokens_is_levs_output_for_every_id(models, exported):
  model, _ = models["lev", False]
  tensors = safetensors_numpy.load_file(str(exported["lev", False] / "model.safetensors"))
  per_token_VxD = np.asarray(nnx.jit(lambda lev: lev(jnp.arange(V)))(model.embedding.lev))
  np.testing.assert_allclose(tensors["model.embed_tokens.weight"], per_token_VxD,
                             atol=1e-6, rtol=1e-6)
  head_DxV = np.asarray(model.embedding.head[...])[:, :V]
  np.testing.assert_array_equal(tensors["lm_head.weight"], head_DxV.T)


def test_bfloat16_export(models, tmp_path):
  model, config = models["untied", False]
  info = hf_export.save_hf(model, config, tmp_path, dtype="bfloat16")
  assert info["dtype"] == "bfloat16" and json.loads(
      (tmp_path / "config.json").read_text())["dtype"] == "bfloat16"
  with safe_open(tmp_path / "model.safetensors", framework="numpy") as f:
    assert {f.get_slice(name).get_dtype() for name in f.keys()} == {"BF16"}
  theirs = hf_export.hf_logits(tmp_path, IDS_BxL)
  ours = forward(model, IDS_BxL)[..., :V]
  np.testing.assert_allclose(theirs, ours, atol=0.05)


# Every special token's surface form inside plain text: our tokenizers encode it as
# text (never as the special id), so the exported HF tokenizer must too
# (split_special_tokens in tokenizer_config.json).
SPECIALS_TEXT = "I <s>like</s> it <pad> and <unk>, <|endoftext|>."


def test_byte_tokenizer_files_give_our_ids(exported):
  folder = exported["tied", False]
  assert load_tokenizer(folder / "lev_tokenizer") == ByteTokenizer()
  hf_tok = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
  for text in ("héllo wörld ✓\n\tend", SPECIALS_TEXT):
    assert hf_tok(text, add_special_tokens=False)["input_ids"] == ByteTokenizer().encode(text)
  assert hf_tok.eos_token_id == ByteTokenizer().eos_id and len(hf_tok) == V


def test_sentencepiece_tokenizer_files_give_our_ids(tmp_path):
  pytest.importorskip("sentencepiece")
  from lev_jax.data.tokenizer import train_sentencepiece
  docs = [f"def f{i}(x):\n    return x * {i}  # café ✓ 日本\n" * 3 for i in range(40)]
  docs += ["  leading spaces, and\ttabs.\n\nNew paragraph: naïve façade."] * 20
  tok = train_sentencepiece(docs, 320, tmp_path / "cache")
  hf_export.save_hf_tokenizer(tok, tmp_path / "hf")
  hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf", local_files_only=True)
  texts = [docs[0], docs[-1], " x", "unseen 𝔘 ∮ symbols", "a  b   c\n\n\n", SPECIALS_TEXT]
  for text in texts:
    ids = tok.encode(text)
    assert hf_tok(text, add_special_tokens=False)["input_ids"] == ids, text
    assert hf_tok.decode(ids) == text
  assert len(hf_tok) == tok.vocab_size and hf_tok.eos_token_id == tok.eos_id


def test_configs_hf_llama_cannot_express_are_refused():
  c = tiny_config("tied")
  c.model.n_heads, c.model.n_kv_heads = 3, 1  # d_model 32 is not a multiple of 3
  with pytest.raises(hf_export.HFExportError, match=r"config.model.d_model = 32 .*n_heads = 3"):
    hf_export.check_exportable(c)


def test_mismatched_tokenizer_and_dtype_are_refused(models, tmp_path):
  model, config = models["tied", False]
  with pytest.raises(hf_export.HFExportError, match="dtype = 'int8'"):
    hf_export.save_hf(model, config, tmp_path / "a", dtype="int8")
  c = ml_collections.ConfigDict(config.to_dict())
  c.model.vocab_size = 300
  with pytest.raises(hf_export.HFExportError, match="config.model.vocab_size = 300 but the "
                     "bytes tokenizer has 259 ids: model and data must agree"):
    hf_export.save_hf(model, c, tmp_path / "b", tokenizer=ByteTokenizer())
  assert not (tmp_path / "b").exists()
