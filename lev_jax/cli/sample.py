"""`lev-sample`: continue text prompts with a trained model (KV-cached decoding).

  lev-sample --checkpoint=runs/smoke_leviathan --prompt="The history of"
  lev-sample --checkpoint=exports/leviathan --prompts_file=prompts.txt \\
             --temperature=0.8 --top_p=0.95 --max_new_tokens=128 --stop=$'\\n\\n'

--checkpoint is a `lev-train` workdir (latest complete step unless --step) or a
`lev-export` folder. Prompts come from --prompt (repeatable) and then --prompts_file
(one prompt per line; a blank line is an error). For each prompt it prints a block:
the prompt, then the completion with its token count and why it ended (eos, a stop
string, or --max_new_tokens).

Decoding (lev_jax.decode.generate): --temperature=0 (the default) is greedy; above 0
it samples, after top-k (--top_k, Fan et al. 2018) and nucleus (--top_p, Holtzman et
al. 2019) filtering, seeded by --seed (batch i of --batch_size prompts uses seed + i, so
the output also depends on --batch_size). Generation always ends at the tokenizer's
eos; each --stop string cuts the completion at its first occurrence (a stop string
that is one token also ends generation there).
"""

from __future__ import annotations

import sys

from absl import flags

from lev_jax.cli import common
from lev_jax.config import DTYPES
from lev_jax.workdir import SMALL_FILE_LIMIT, FileTooLargeError, read_small

PROG = "lev-sample"
# Most bytes read from --prompts_file (workdir.read_small): far more prompts than one
# run decodes; a device such as /dev/zero is refused, not read until memory runs out.
PROMPTS_FILE_LIMIT = SMALL_FILE_LIMIT


def define_flags(fv: flags.FlagValues = flags.FLAGS) -> None:
  """Defines the command's flags on `fv` (tests pass a fresh FlagValues)."""
  common.define_path("checkpoint", None, "A lev-train workdir or a lev-export folder.",
                     what="a lev-train workdir or a lev-export folder", fv=fv)
  flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).",
                       flag_values=fv)
  flags.DEFINE_enum("dtype", None, list(DTYPES),
                    "Parameter dtype for decoding (default: as stored).", flag_values=fv)
  flags.DEFINE_multi_string("prompt", None, "A prompt (repeatable).", flag_values=fv)
  common.define_path("prompts_file", None, "A UTF-8 text file, one prompt per line.",
                     what="a UTF-8 text file, one prompt per line", fv=fv)
  flags.DEFINE_integer("max_new_tokens", 64, "Most tokens generated per prompt.",
                       flag_values=fv)
  flags.DEFINE_float("temperature", 0.0, "Sampling temperature; 0 = greedy.",
                     flag_values=fv)
  flags.DEFINE_integer("top_k", 0, "Sample among the k most likely tokens; 0 = all.",
                       flag_values=fv)
  flags.DEFINE_float("top_p", 1.0, "Nucleus sampling mass in (0, 1]; 1 = off.",
                     flag_values=fv)
  flags.DEFINE_integer("seed", 0, "Sampling seed (jax.random.key: signed 64-bit; batch i uses "
                       "seed + i, wrapped to signed 64 bits).", lower_bound=-2**63,
                       upper_bound=2**63 - 1, flag_values=fv)
  flags.DEFINE_multi_string("stop", None, "Cut each completion at this string "
                            "(repeatable); generation always ends at eos.", flag_values=fv)
  flags.DEFINE_integer("batch_size", 8, "Prompts decoded together.", flag_values=fv)


def read_prompts(prompts, prompts_file: str | None) -> list[tuple[str, str]]:
  """[(label, text)]: the --prompt values, then the lines of `prompts_file`.

  Labels name the source for messages: "--prompt 2", "FILE:3" (1-based).
  Raises:
    ValueError: no prompt at all, an empty --prompt, a blank line, an unreadable, empty
      or too long file (more than PROMPTS_FILE_LIMIT bytes), or bytes that are not UTF-8 (the file and line, or the --prompt, named: never
      passed on as the text "\\xff\\xfe").
  """
  out = [(f"--prompt {i}", p) for i, p in enumerate(prompts or (), 1)]
  for label, text in out:
    if not text:
      raise ValueError(f"{label} is empty; expected some text to continue")
    problem = common.not_utf8_error(label, text)
    if problem:
      raise ValueError(problem)
  if prompts_file:
    try:  # a pipe (<(...), /dev/stdin) is read too, up to the limit: /dev/zero ends
      data = read_small(prompts_file, PROMPTS_FILE_LIMIT)
    except FileTooLargeError as e:
      raise ValueError(f"--prompts_file={prompts_file}: {e}; expected a UTF-8 text file, "
                       "one prompt per line") from None
    except OSError as e:
      raise ValueError(f"--prompts_file={prompts_file}: cannot read it ({e})") from e
    if not data.strip():
      what = "only blank lines" if data.strip(b"\r\n") else "empty file"
      raise ValueError(f"--prompts_file={prompts_file}: holds no prompt ({what}); expected "
                       "one prompt per line")
    try:
      lines = data.decode("utf-8").splitlines()
    except UnicodeDecodeError as e:  # the line as splitlines numbers it (e.start: valid before)
      n = len((data[:e.start].decode("utf-8") + "x").splitlines())
      raise ValueError(f"{prompts_file}:{n} is not valid UTF-8 (byte 0x{data[e.start]:02x}); "
                       "expected a UTF-8 text file, one prompt per line") from None
    for n, line in enumerate(lines, 1):
      if not line.strip():
        raise ValueError(f"{prompts_file}:{n} is blank; expected one prompt per line")
      out.append((f"{prompts_file}:{n}", line))
  if not out:
    raise ValueError("no prompt: give --prompt=TEXT (repeatable) or --prompts_file=FILE")
  return out


def check_decoding(max_new_tokens, temperature, top_k, top_p, batch_size, stops=()) -> None:
  """Raises ValueError naming the first out-of-range decoding flag (or a --stop that is
  empty or not UTF-8)."""
  if max_new_tokens < 1:
    raise ValueError(f"--max_new_tokens={max_new_tokens}: expected an integer >= 1")
  if not temperature >= 0 or temperature == float("inf"):
    raise ValueError(f"--temperature={temperature}: expected a finite number >= 0 "
                     "(0 = greedy)")
  if temperature != 0:  # sampling: jax is imported for it anyway
    from lev_jax.decode import MAX_TEMPERATURE, MIN_TEMPERATURE
    if not MIN_TEMPERATURE <= temperature <= MAX_TEMPERATURE:
      raise ValueError(f"--temperature={temperature}: expected 0 (greedy) or a normal "
                       f"float32 number, {MIN_TEMPERATURE:.8g} to {MAX_TEMPERATURE:.8g}")
  if top_k < 0:
    raise ValueError(f"--top_k={top_k}: expected an integer >= 0 (0 = off)")
  if not 0 < top_p <= 1:
    raise ValueError(f"--top_p={top_p}: expected a number in (0, 1] (1 = off)")
  if batch_size < 1:
    raise ValueError(f"--batch_size={batch_size}: expected an integer >= 1")
  if any(not s for s in stops):
    raise ValueError("--stop is empty; expected a non-empty string")
  problem = next(filter(None, (common.not_utf8_error(f"--stop {i}", s)
                               for i, s in enumerate(stops, 1))), None)
  if problem:  # sentencepiece's encode would fail on it with a traceback
    raise ValueError(problem)


def _cut(text: str, stops) -> tuple[str, str | None]:
  """(text before the earliest stop string, that string or None)."""
  found = [(text.find(s), s) for s in stops if s in text]
  if not found:
    return text, None
  at, s = min(found)
  return text[:at], s


def _batch_seed(seed: int, batch: int) -> int:
  """Batch `batch`'s sampling seed: seed + batch, wrapped into jax.random.key's signed
  64-bit range (so --seed takes every int64, 2**63 - 1 included)."""
  return (seed + batch + 2**63) % 2**64 - 2**63


def complete(im, labelled, *, max_new_tokens: int = 64, temperature: float = 0.0,
             top_k: int = 0, top_p: float = 1.0, seed: int = 0, stops=(),
             batch_size: int = 8) -> list[dict]:
  """Continues each prompt; one dict per prompt, in order.

  Args:
    im: a `lev_jax.inference.InferenceModel` (model, config, tokenizer).
    labelled: [(label, prompt text)] as from `read_prompts`.
    stops: strings that end a completion (cut before the first occurrence).
    The other arguments are `lev_jax.decode.generate`'s (batch i uses seed + i, wrapped
    to signed 64 bits: `_batch_seed`).
  Returns:
    [{"label", "prompt", "completion" (str), "tokens" (ids generated, int),
      "ended": "eos" | "stop <string repr>" | "max_new_tokens"}].
  Raises:
    ValueError: `check_decoding`'s, a top_k above config.model.vocab_size, a prompt
      that encodes to no token, or a prompt +
      max_new_tokens longer than config.model.max_seq_len (naming the prompt's label).
  """
  from lev_jax.decode import generate
  tok = im.tokenizer
  vocab = im.config.model.vocab_size
  limit = im.config.model.max_seq_len
  check_decoding(max_new_tokens, temperature, top_k, top_p, batch_size, stops)
  if top_k > vocab:
    raise ValueError(f"--top_k={top_k}: above the model's vocabulary of {vocab} ids "
                     f"(config.model.vocab_size); expected 0 (off) to {vocab}")
  eos = tok.eos_id
  eos = int(eos) if eos is not None and 0 <= int(eos) < vocab else None
  stop_ids = {eos} - {None}
  for s in stops:  # a one-token stop string also ends generation on the device
    ids = tok.encode(s)
    if len(ids) == 1 and 0 <= ids[0] < vocab and tok.decode(ids) == s:
      stop_ids.add(ids[0])
  encoded = []
  for label, text in labelled:
    ids = list(tok.encode(text))
    if not ids:
      raise ValueError(f"{label} encodes to no token; expected some text to continue")
    if len(ids) + max_new_tokens > limit:
      raise ValueError(f"{label} has {len(ids)} tokens; + --max_new_tokens="
                       f"{max_new_tokens} is {len(ids) + max_new_tokens} > "
                       f"config.model.max_seq_len = {limit}")
    encoded.append(ids)
  results = []
  for i, start in enumerate(range(0, len(encoded), batch_size)):
    batch = encoded[start:start + batch_size]
    outs = generate(im.model, batch, max_new_tokens=max_new_tokens,
                    temperature=temperature, top_k=top_k, top_p=top_p,
                    stop_ids=sorted(stop_ids), seed=_batch_seed(seed, i))
    for (label, text), ids in zip(labelled[start:start + batch_size], outs):
      at_eos = eos is not None and bool(ids) and ids[-1] == eos
      completion, stop = _cut(tok.decode(ids[:-1] if at_eos else ids), stops)
      ended = (f"stop {stop!r}" if stop is not None else "eos" if at_eos
               else "max_new_tokens")
      results.append({"label": label, "prompt": text, "completion": completion,
                      "tokens": len(ids), "ended": ended})
  return results


def report(results: list[dict]) -> str:
  """The blocks `lev-sample` prints: per prompt, its text, then its completion."""
  blocks = []
  for i, r in enumerate(results, 1):
    blocks.append(f"--- prompt {i}/{len(results)} ({r['label']}) ---\n{r['prompt']}\n"
                  f"--- completion {i}/{len(results)} ({r['tokens']} tokens generated, ended: "
                  f"{r['ended']}) ---\n{r['completion']}")
  return "\n\n".join(blocks)


def main(argv, fv: flags.FlagValues | None = None):
  fv = flags.FLAGS if fv is None else fv
  if len(argv) > 1:
    common.fail_unexpected(PROG, argv[1:])
  common.quiet_library_logs()
  if not fv.checkpoint:
    common.fail(PROG, "--checkpoint is required (a lev-train workdir or a lev-export folder)")
  try:  # everything the flags alone decide, before the (slow) load
    labelled = read_prompts(fv.prompt, fv.prompts_file)
    check_decoding(fv.max_new_tokens, fv.temperature, fv.top_k, fv.top_p, fv.batch_size,
                   fv.stop or ())
  except ValueError as e:
    common.fail(PROG, str(e))
  common.backend_or_exit(PROG)  # JAX_PLATFORMS naming a backend this machine lacks
  from lev_jax import inference  # after the flags: keeps errors and --help fast
  try:
    im = inference.load(fv.checkpoint, step=fv.step, dtype=fv.dtype)
    results = complete(im, labelled, max_new_tokens=fv.max_new_tokens,
                       temperature=fv.temperature, top_k=fv.top_k, top_p=fv.top_p,
                       seed=fv.seed, stops=fv.stop or (), batch_size=fv.batch_size)
  except (ValueError, OSError) as e:  # InferenceError, DataError, generate's checks
    common.fail(PROG, common.first_line(e))
  mode = ("greedy" if fv.temperature == 0 else
          f"temperature {fv.temperature:g}, top_k {fv.top_k}, top_p {fv.top_p:g}, "
          f"seed {fv.seed}")
  print(f"{PROG}: {im.config.name} ({im.config.model.embedding}, {im.dtype}) step "
        f"{im.step} from {im.source}; {mode}", file=sys.stderr)
  print(report(results))


def run():
  define_flags()
  common.run(PROG, main, __name__)


if __name__ == "__main__":
  run()
