"""lev-sample: completions equal generate's on an exported model; stop strings; errors."""

import pytest
from absl import flags
from flax import nnx

from conftest import byte_config
from lev_jax import inference
from lev_jax.cli import sample
from lev_jax.data.tokenizer import ByteTokenizer
from lev_jax.decode import generate
from lev_jax.model import Decoder

N = 6


def lev_sample(*args):
  """Runs lev-sample's main in this process on fresh flags."""
  fv = flags.FlagValues()
  sample.define_flags(fv)
  fv(["lev-sample", *args])
  sample.main(["lev-sample"], fv)


@pytest.fixture(scope="module")
def export(tmp_path_factory):
  """A tied byte-level model (weights std 0.5: varied greedy text) saved as an export."""
  c = byte_config("tied")
  c.model.init_std = 0.5
  model = Decoder(c, rngs=nnx.Rngs(0))
  im = inference.InferenceModel(model, c, ByteTokenizer(), step=7)
  path = tmp_path_factory.mktemp("sample") / "export"
  inference.save(im, path)
  return path, im


def _greedy_ids(im, texts):
  tok = im.tokenizer
  return generate(im.model, [tok.encode(t) for t in texts], max_new_tokens=N,
                  stop_ids=[tok.eos_id])


def _expected(im, texts):
  tok = im.tokenizer
  return [tok.decode([i for i in ids if i != tok.eos_id]) for ids in _greedy_ids(im, texts)]


def test_prompts_from_flags_and_file_are_completed_in_order(export, tmp_path, capsys):
  path, im = export
  prompts_file = tmp_path / "prompts.txt"
  prompts_file.write_text("Hello world\n")
  lev_sample(f"--checkpoint={path}", "--prompt=Hi", f"--prompts_file={prompts_file}",
             f"--max_new_tokens={N}")
  out, err = capsys.readouterr()
  assert f"tiny_tied (tied, float32) step 7 from {path}; greedy" in err
  want = _expected(im, ["Hi", "Hello world"])
  assert out == (f"--- prompt 1/2 (--prompt 1) ---\nHi\n"
                 f"--- completion 1/2 ({N} tokens generated, ended: max_new_tokens) ---\n{want[0]}\n\n"
                 f"--- prompt 2/2 ({prompts_file}:1) ---\nHello world\n"
                 f"--- completion 2/2 ({N} tokens generated, ended: max_new_tokens) ---\n{want[1]}\n")


def test_stop_string_cuts_the_completion(export, capsys):
  path, im = export
  full = _expected(im, ["Hi", "Hello world"])[0]
  stop = next(ch for ch in full[1:] if full.index(ch) > 0)  # not the first character
  lev_sample(f"--checkpoint={path}", "--prompt=Hi", "--prompt=Hello world",
             f"--max_new_tokens={N}", f"--stop={stop}", "--stop=never appears")
  out = capsys.readouterr().out
  cut = full[:full.index(stop)]
  assert f"ended: stop {stop!r}) ---\n{cut}\n\n--- prompt 2/2" in out


@pytest.mark.parametrize("args,message", [
    (["--prompt="], "--prompt 1 is empty"),
    ([], "no prompt: give --prompt=TEXT"),
    (["--prompt=a", "--top_p=0"], "--top_p=0.0: expected a number in (0, 1]"),
    (["--prompt=a", "--temperature=-1"], "--temperature=-1.0: expected a finite number"),
    (["--prompt=a", "--temperature=1e-38"], "--temperature=1e-38: expected 0 (greedy) or a "
     "normal float32 number, 1.1754944e-38 to 3.4028235e+38"),
    (["--prompt=a", "--max_new_tokens=0"], "--max_new_tokens=0: expected an integer >= 1"),
    (["--prompt=a", "--stop="], "--stop is empty"),
    (["--prompt=a", "--max_new_tokens=2048"],
     "--prompt 1 has 1 tokens; + --max_new_tokens=2048 is 2049 > "
     "config.model.max_seq_len = 2048"),
    (["--prompt=a", "--step=3"], "holds step 7, not step 3"),
    (["--prompt=a", "--temperature=1", "--top_k=100000"],  # issue 26: was accepted
     "--top_k=100000: above the model's vocabulary of 259 ids"),
])
def test_errors_are_one_line(export, capsys, args, message):
  path, _ = export
  with pytest.raises(SystemExit) as e:
    lev_sample(f"--checkpoint={path}", *args)
  err = capsys.readouterr().err
  assert e.value.code == 2 and err.count("\n") == 1 and err.startswith("lev-sample: error: ")
  assert message in err


def test_missing_checkpoint_or_prompts_file_is_named(tmp_path, capsys):
  blank = tmp_path / "p.txt"
  blank.write_text("one\n\nthree\n")
  (tmp_path / "empty.txt").write_text("")
  (tmp_path / "nl.txt").write_text("\n")
  (tmp_path / "sp.txt").write_text(" \n\n")
  for args, message in [
      ([f"--checkpoint={tmp_path}", f"--prompts_file={tmp_path / 'empty.txt'}"],
       "empty.txt: holds no prompt (empty file); expected one prompt per line"),
      ([f"--checkpoint={tmp_path}", f"--prompts_file={tmp_path / 'nl.txt'}"],
       "nl.txt: holds no prompt (empty file)"),
      ([f"--checkpoint={tmp_path}", f"--prompts_file={tmp_path / 'sp.txt'}"],
       "sp.txt: holds no prompt (only blank lines)"),
      ([f"--checkpoint={tmp_path / 'nowhere'}", "--prompt=a"], "no such checkpoint folder"),
      ([f"--checkpoint={tmp_path}", f"--prompts_file={blank}"], f"{blank}:2 is blank"),
      ([f"--checkpoint={tmp_path}", f"--prompts_file={tmp_path / 'x.txt'}"],
       "x.txt: cannot read it"),
      (["--prompt=a"], "--checkpoint is required")]:
    with pytest.raises(SystemExit) as e:
      lev_sample(*args)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and message in err, err


def test_a_prompts_file_is_read_up_to_a_limit(tmp_path, capsys, monkeypatch):
  """Newcomer pass 4: --prompts_file=/dev/zero was read until a MemoryError."""
  monkeypatch.setattr(sample, "PROMPTS_FILE_LIMIT", 8)
  (tmp_path / "p.txt").write_text("one\ntwo\nthree\n")
  for path in ("/dev/zero", tmp_path / "p.txt"):
    with pytest.raises(SystemExit) as e:
      lev_sample(f"--checkpoint={tmp_path / 'not_loaded'}", f"--prompts_file={path}")
    assert e.value.code == 2 and capsys.readouterr().err == (
        f"lev-sample: error: --prompts_file={path}: holds more than 8 bytes; expected a "
        "UTF-8 text file, one prompt per line\n")


def test_bytes_that_are_not_utf8_are_named_by_file_and_line(tmp_path, capsys):
  """Invalid UTF-8 in --prompts_file (or in a --prompt: Python keeps such argv bytes
  as lone surrogates) is one line naming where, before any loading; not the text
  "\\xff\\xfe"."""
  bad = tmp_path / "p.txt"
  bad.write_bytes(b"one\r\ntwo\n\xff\xfe three\n")
  for args, message in [
      ([f"--prompts_file={bad}"], f"{bad}:3 is not valid UTF-8 (byte 0xff); expected a "
       "UTF-8 text file"),
      (["--prompt=ok", "--prompt=a\udcff\udcfe"], "--prompt 2 is not valid UTF-8 "
       "(character 2)"),
      (["--prompt=ok", "--stop=x", "--stop=\udcff"], "--stop 2 is not valid UTF-8 "
       "(character 1)")]:
    with pytest.raises(SystemExit) as e:
      lev_sample(f"--checkpoint={tmp_path / 'not_loaded'}", *args)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and message in err, err


def test_generation_ends_at_eos_which_is_not_printed(export):
  """With eos = the first greedy token of "Hi", that row ends there with no text."""
  _, im = export
  first = _greedy_ids(im, ["Hi", "Hello world"])[0][0]  # the program lev-sample ran

  class EosAtFirst(ByteTokenizer):
    eos_id = first

  fake = inference.InferenceModel(im.model, im.config, EosAtFirst(), step=7)
  hi, hello = sample.complete(fake, [("a", "Hi"), ("b", "Hello world")], max_new_tokens=N)
  assert (hi["completion"], hi["tokens"], hi["ended"]) == ("", 1, "eos")
  assert hello["ended"] in ("eos", "max_new_tokens") and hello["tokens"] >= 1
