"""Hugging Face LLaMA export: our decoder as a `LlamaForCausalLM` checkpoint folder.

The decoder (lev_jax.model) is LLaMA's architecture exactly: pre-norm RMSNorm, half-split
RoPE (HF `rotate_half`, inverse frequencies theta^(-2i/K)), grouped-query attention
scaled by K^-0.5, SwiGLU, no biases. Only the parameter layout differs, and the vocab:
our tables are padded to `vocab_multiple` rows (padded logits masked to -1e9), HF's
have exactly `config.model.vocab_size`, so the padded rows are sliced away and the HF
logits equal ours on every id < vocab_size.

Parameter map (ours -> HF `model.safetensors`, per layer i; `x @ W.T` in HF):
  attn_norm.scale [D]        -> model.layers.i.input_layernorm.weight
  attn.wq [D, H, K]          -> model.layers.i.self_attn.q_proj.weight [H*K, D]
  attn.wk / wv [D, G, K]     -> ....k_proj.weight / v_proj.weight [G*K, D]
  attn.wo [H, K, D]          -> ....o_proj.weight [D, H*K]
  mlp_norm.scale [D]         -> model.layers.i.post_attention_layernorm.weight
  mlp.w_gate / w_up [D, F]   -> model.layers.i.mlp.gate_proj / up_proj.weight [F, D]
  mlp.w_down [F, D]          -> model.layers.i.mlp.down_proj.weight [D, F]
  final_norm.scale [D]       -> model.norm.weight
  tied   table [Vp, D]       -> model.embed_tokens.weight [V, D] (tie_word_embeddings)
  untied table, head [D, Vp] -> model.embed_tokens.weight, lm_head.weight [V, D]
  lev    LEV(i) for every id -> model.embed_tokens.weight (the materialised table:
         Leviathan arXiv 2601.22040 Sec. 3: LEV is a function of the id only, so at
         inference it is exactly a V x D table), head -> lm_head.weight
With config.model.scan_layers every block parameter is stacked [n_layers, ...].

Sources: transformers `models/llama/configuration_llama.py` and `modeling_llama.py`
(5.x: `rope_parameters`, `dtype`; `rope_theta` / `torch_dtype` are also written for
4.x readers); safetensors `safetensors.numpy.save_file`.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import jax.numpy as jnp
import ml_collections
import numpy as np

from lev_jax.config import DTYPES
from lev_jax.embeddings import (LEVEmbedding, TiedEmbedding, UntiedEmbedding,
                                input_table)

WEIGHTS = "model.safetensors"
CONFIG = "config.json"
GENERATION_CONFIG = "generation_config.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
LEV_TOKENIZER_DIR = "lev_tokenizer"
SPM_MODEL = "tokenizer.model"


class HFExportError(ValueError):
  """The model or config cannot be written as (or read back from) a HF LLaMA folder."""


def _np_dtype(dtype: str):
  if dtype not in DTYPES:
    raise HFExportError(f"dtype = {dtype!r}: expected one of {', '.join(DTYPES)}")
  return np.dtype(jnp.dtype(dtype))  # bfloat16 -> ml_dtypes.bfloat16 (safetensors BF16)


def _embedding_kind(model) -> str:
  emb = model.embedding
  if isinstance(emb, TiedEmbedding):
    return "tied"
  if isinstance(emb, LEVEmbedding):
    return "lev"
  if isinstance(emb, UntiedEmbedding):
    return "untied"
  raise HFExportError(f"model.embedding is a {type(emb).__name__}: expected a "
                      "TiedEmbedding, UntiedEmbedding or LEVEmbedding (lev_jax.embeddings)")


def check_exportable(config: ml_collections.ConfigDict) -> None:
  """Refuses decoders HF `LlamaConfig` cannot express.

  Raises:
    HFExportError: d_model not a multiple of n_heads (LlamaConfig.validate_architecture
      rejects it even though head_dim is explicit), n_heads not a multiple of
      n_kv_heads, or an odd head_dim. The message names the config field.
  """
  m = config.model
  if m.d_model % m.n_heads:
    raise HFExportError(
        f"config.model.d_model = {m.d_model} is not a multiple of config.model.n_heads = "
        f"{m.n_heads}: transformers' LlamaConfig refuses hidden_size % "
        "num_attention_heads != 0, so this model has no HF LLaMA equivalent")
  if m.n_heads % m.n_kv_heads:
    raise HFExportError(f"config.model.n_kv_heads = {m.n_kv_heads}: expected a divisor of "
                        f"config.model.n_heads = {m.n_heads}")
  if m.head_dim % 2:
    raise HFExportError(f"config.model.head_dim = {m.head_dim}: expected an even number")


def _blocks(model, n_layers: int) -> list[dict]:
  """Per-layer numpy parameters (float32 or the param dtype), unstacked if scanned."""
  def arrays(block):
    return {"attn_norm": block.attn_norm.scale[...], "wq": block.attn.wq[...],
            "wk": block.attn.wk[...], "wv": block.attn.wv[...], "wo": block.attn.wo[...],
            "mlp_norm": block.mlp_norm.scale[...], "w_gate": block.mlp.w_gate[...],
            "w_up": block.mlp.w_up[...], "w_down": block.mlp.w_down[...]}
  if model.scan_layers:
    stacked = {k: np.asarray(v) for k, v in arrays(model.blocks).items()}
    got = stacked["wq"].shape[0]
    if got != n_layers:
      raise HFExportError(f"the model has {got} stacked layers but config.model.n_layers "
                          f"= {n_layers}")
    return [{k: v[i] for k, v in stacked.items()} for i in range(n_layers)]
  if len(model.blocks) != n_layers:
    raise HFExportError(f"the model has {len(model.blocks)} layers but "
                        f"config.model.n_layers = {n_layers}")
  return [{k: np.asarray(v) for k, v in arrays(b).items()} for b in model.blocks]


def lev_table(model) -> np.ndarray:
  """float32 [V_padded, D]: the model's input embedding of every id (LEV's output for
  a `lev` model, the table itself otherwise; `embeddings.input_table`)."""
  return np.asarray(input_table(model.embedding), np.float32)


def hf_state_dict(model, config: ml_collections.ConfigDict, dtype: str = "float32") -> dict:
  """{HF parameter name: numpy array in `dtype`} for `LlamaForCausalLM` (map above).

  Tied models hold only `model.embed_tokens.weight` (HF ties lm_head to it).

  Raises:
    HFExportError: unknown dtype; a parameter's shape differs from what `config.model`
      describes (the model and config do not belong together).
  """
  m = config.model
  out_dtype = _np_dtype(dtype)
  d, h, g, k, f, v = m.d_model, m.n_heads, m.n_kv_heads, m.head_dim, m.d_ff, m.vocab_size
  expected = {"attn_norm": (d,), "wq": (d, h, k), "wk": (d, g, k), "wv": (d, g, k),
              "wo": (h, k, d), "mlp_norm": (d,), "w_gate": (d, f), "w_up": (d, f),
              "w_down": (f, d)}
  state = {}
  for i, p in enumerate(_blocks(model, m.n_layers)):
    for name, shape in expected.items():
      if p[name].shape != shape:
        raise HFExportError(f"layer {i} {name} has shape {p[name].shape}; config.model "
                            f"describes {shape}: the model does not match its config")
    pre = f"model.layers.{i}."
    state[pre + "input_layernorm.weight"] = p["attn_norm"]
    state[pre + "self_attn.q_proj.weight"] = p["wq"].reshape(d, h * k).T
    state[pre + "self_attn.k_proj.weight"] = p["wk"].reshape(d, g * k).T
    state[pre + "self_attn.v_proj.weight"] = p["wv"].reshape(d, g * k).T
    state[pre + "self_attn.o_proj.weight"] = p["wo"].reshape(h * k, d).T
    state[pre + "post_attention_layernorm.weight"] = p["mlp_norm"]
    state[pre + "mlp.gate_proj.weight"] = p["w_gate"].T
    state[pre + "mlp.up_proj.weight"] = p["w_up"].T
    state[pre + "mlp.down_proj.weight"] = p["w_down"].T
  state["model.norm.weight"] = np.asarray(model.final_norm.scale[...])
  table_VpxD = lev_table(model)
  if table_VpxD.shape[0] < v or table_VpxD.shape[1] != d:
    raise HFExportError(f"the input embedding has shape {table_VpxD.shape}; expected at "
                        f"least config.model.vocab_size = {v} rows of d_model = {d}")
  state["model.embed_tokens.weight"] = table_VpxD[:v]
  if _embedding_kind(model) != "tied":
    head_DxVp = np.asarray(model.embedding.head[...])
    if head_DxVp.shape[0] != d or head_DxVp.shape[1] < v:
      raise HFExportError(f"the output head has shape {head_DxVp.shape}; expected "
                          f"[d_model = {d}, >= vocab_size = {v}]")
    state["lm_head.weight"] = head_DxVp[:, :v].T
  return {name: np.ascontiguousarray(a.astype(out_dtype)) for name, a in state.items()}


def hf_config(config: ml_collections.ConfigDict, *, tied: bool, dtype: str = "float32",
              tokenizer=None) -> dict:
  """The `config.json` dict of a `LlamaForCausalLM` equal to our decoder.

  Token ids come from `tokenizer` (eos_id, pad_id; our tokenizers have no bos), or are
  null without one.
  """
  m = config.model
  _np_dtype(dtype)
  theta = float(m.rope_theta)
  eos = None if tokenizer is None else int(tokenizer.eos_id)
  pad = None if tokenizer is None or tokenizer.pad_id is None else int(tokenizer.pad_id)
  return {
      "architectures": ["LlamaForCausalLM"],
      "model_type": "llama",
      "vocab_size": int(m.vocab_size),
      "hidden_size": int(m.d_model),
      "intermediate_size": int(m.d_ff),
      "num_hidden_layers": int(m.n_layers),
      "num_attention_heads": int(m.n_heads),
      "num_key_value_heads": int(m.n_kv_heads),
      "head_dim": int(m.head_dim),
      "hidden_act": "silu",
      "max_position_embeddings": int(m.max_seq_len),
      "initializer_range": float(m.init_std),
      "rms_norm_eps": float(m.norm_eps),
      "rope_parameters": {"rope_type": "default", "rope_theta": theta},
      "rope_theta": theta,
      "attention_bias": False,
      "attention_dropout": 0.0,
      "mlp_bias": False,
      "pretraining_tp": 1,
      "tie_word_embeddings": bool(tied),
      "use_cache": True,
      "bos_token_id": None,
      "eos_token_id": eos,
      "pad_token_id": pad,
      "dtype": dtype,
      "torch_dtype": dtype,
  }


def _write_json(path: Path, obj: dict) -> None:
  tmp = path.with_name(path.name + ".tmp")
  tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
  os.replace(tmp, path)


def _save_safetensors(state: dict, path: Path) -> None:
  """safetensors' `save_file` through PATH.tmp, with the mode `open` would give the file.

  safetensors (0.8) writes through a temporary file of its own, created 0600 whatever
  the umask; the file is given the mode a file created here gets (0666 less the umask).
  """
  from safetensors.numpy import save_file
  tmp = path.with_name(path.name + ".tmp")
  tmp.unlink(missing_ok=True)
  tmp.touch()  # created as every other file of the folder: 0666 & ~umask
  mode = stat.S_IMODE(tmp.stat().st_mode)
  save_file(state, str(tmp), metadata={"format": "pt"})
  os.chmod(tmp, mode)
  os.replace(tmp, path)


def save_hf_tokenizer(tokenizer, out_dir, *, vocab_multiple: int = 128,
                      model_max_length: int | None = None) -> list[Path]:
  """Writes `tokenizer` into a HF folder: `lev_tokenizer/` always, plus the files
  transformers' `AutoTokenizer.from_pretrained(out_dir)` reads where an exact HF
  equivalent exists (same ids for every text).

    bytes          tokenizer_config.json: ByT5Tokenizer with extra_ids = 0 (ids pad 0,
                   eos 1, unk 2, byte b -> b + 3, as ours).
    sentencepiece  tokenizer.model (our model proto) + tokenizer_config.json:
                   LlamaTokenizer with legacy = False and add_prefix_space = False (our
                   model has no dummy prefix and identity normalisation; HF's default
                   Llama settings prepend a space and would change the ids), no bos/eos
                   added by encode.
    o200k_base     only lev_tokenizer/ (no HF tokenizer files).

  Args:
    tokenizer: a lev_jax tokenizer (lev_jax.data.tokenizer).
    out_dir: the folder (created).
    vocab_multiple: recorded in lev_tokenizer/tokenizer.json (padded vocab).
    model_max_length: recorded in tokenizer_config.json (None: not recorded).
  Returns:
    The paths written.
  Source: transformers models/byt5/tokenization_byt5.py, models/llama/tokenization_llama.py.
  """
  from lev_jax.data.tokenizer import UNK_ID, ByteTokenizer, SentencePieceTokenizer
  from lev_jax.data.tokenizer_files import save_tokenizer
  out = Path(os.path.expanduser(os.fspath(out_dir)))
  out.mkdir(parents=True, exist_ok=True)
  save_tokenizer(tokenizer, out / LEV_TOKENIZER_DIR, vocab_multiple)
  written = [out / LEV_TOKENIZER_DIR]
  extra = {} if model_max_length is None else {"model_max_length": int(model_max_length)}
  if isinstance(tokenizer, ByteTokenizer):
    _write_json(out / TOKENIZER_CONFIG, {
        "tokenizer_class": "ByT5Tokenizer", "extra_ids": 0, "pad_token": "<pad>",
        "eos_token": "</s>", "unk_token": "<unk>", "split_special_tokens": True, **extra})
    written.append(out / TOKENIZER_CONFIG)
  elif isinstance(tokenizer, SentencePieceTokenizer):
    tmp = out / (SPM_MODEL + ".tmp")
    tmp.write_bytes(tokenizer.model_proto)
    os.replace(tmp, out / SPM_MODEL)
    piece = tokenizer.id_to_piece
    _write_json(out / TOKENIZER_CONFIG, {
        "tokenizer_class": "LlamaTokenizer", "legacy": False, "add_prefix_space": False,
        "add_bos_token": False, "add_eos_token": False, "bos_token": None,
        "eos_token": piece(tokenizer.eos_id), "unk_token": piece(UNK_ID),
        "pad_token": None if tokenizer.pad_id is None else piece(tokenizer.pad_id),
        "split_special_tokens": True, **extra})
    written += [out / SPM_MODEL, out / TOKENIZER_CONFIG]
  return written


def _size(path: Path) -> int:
  if path.is_dir():
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
  return path.stat().st_size


def save_hf(model, config: ml_collections.ConfigDict, out_dir, *, dtype: str = "float32",
            tokenizer=None) -> dict:
  """Writes `model` as a Hugging Face LLaMA checkpoint folder (loads with
  `AutoModelForCausalLM.from_pretrained(out_dir)`; no torch needed to write).

  Files: `model.safetensors` (metadata format "pt"), `config.json` (`hf_config`),
  and with a tokenizer: `generation_config.json` (eos / pad ids) and the tokenizer
  files of `save_hf_tokenizer` (HF tokenizer files for bytes and SentencePiece;
  `lev_tokenizer/` for every tokenizer, rebuilt by `lev_jax.data.tokenizer_files.load_tokenizer`).

  Args:
    model: an nnx `Decoder` (lev_jax.model) with tied, untied or lev embedding.
    config: its experiment config (`model` section read).
    out_dir: folder, created if missing; existing files of the same names are replaced.
    dtype: "float32" | "bfloat16" | "float16": the stored tensors' dtype.
    tokenizer: a lev_jax tokenizer (vocab_size must equal config.model.vocab_size).

  Returns:
    {"dir": str, "files": {name: bytes}, "n_params": int (stored elements),
     "dtype": str, "tie_word_embeddings": bool, "embedding": "tied"|"untied"|"lev"}.

  Raises:
    HFExportError: `check_exportable`, a bad dtype, shapes that do not match `config`,
      or a tokenizer whose vocab differs from the model's.
  """
  import safetensors.numpy  # noqa: F401  (missing: fail before any work)
  check_exportable(config)
  kind = _embedding_kind(model)
  if tokenizer is not None:
    from lev_jax.data.tokenizer import DataError, check_vocab_agreement
    try:
      check_vocab_agreement(config.model.vocab_size, tokenizer.name, tokenizer.vocab_size)
    except DataError as e:
      raise HFExportError(str(e)) from e
  state = hf_state_dict(model, config, dtype)
  out = Path(os.path.expanduser(os.fspath(out_dir)))
  out.mkdir(parents=True, exist_ok=True)
  written = []
  if tokenizer is not None:
    written += save_hf_tokenizer(tokenizer, out, vocab_multiple=config.model.vocab_multiple,
                                 model_max_length=config.model.max_seq_len)
    _write_json(out / GENERATION_CONFIG, {
        "_from_model_config": True, "eos_token_id": int(tokenizer.eos_id),
        "pad_token_id": None if tokenizer.pad_id is None else int(tokenizer.pad_id)})
    written.append(out / GENERATION_CONFIG)
  _save_safetensors(state, out / WEIGHTS)
  _write_json(out / CONFIG, hf_config(config, tied=kind == "tied", dtype=dtype,
                                      tokenizer=tokenizer))
  written += [out / WEIGHTS, out / CONFIG]
  return {"dir": str(out), "files": {p.name: _size(p) for p in written},
          "n_params": int(sum(a.size for a in state.values())), "dtype": dtype,
          "tie_word_embeddings": kind == "tied", "embedding": kind}


def hf_logits(out_dir, ids_BxL) -> np.ndarray:
  """Logits of the exported model run by transformers (CPU torch, float32).

  Args:
    out_dir: a folder written by `save_hf`.
    ids_BxL: int [B, L] token ids < vocab_size.
  Returns:
    float32 [B, L, V] with V = config.model.vocab_size (no padding).
  Raises:
    HFExportError: torch or transformers is not installed.
  """
  try:
    import torch
    import transformers
  except ImportError as e:
    raise HFExportError(f"hf_logits needs torch and transformers ({e}); install them, "
                        "e.g. pip install torch transformers") from e
  hf = transformers.AutoModelForCausalLM.from_pretrained(
      os.fspath(out_dir), dtype=torch.float32, local_files_only=True)
  hf.eval()
  with torch.no_grad():
    ids = torch.as_tensor(np.asarray(ids_BxL, np.int64))
    logits = hf(input_ids=ids).logits
  return logits.float().numpy()
