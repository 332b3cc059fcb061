"""`LevText`: the prepared-dataset layout as a TFDS dataset builder (manual download).

For users who drive TFDS themselves (``download_and_prepare`` with a manual directory
holding The Pile); ``lev-prepare-data`` (`lev_jax.data.prepare`) writes the same layout
in parallel and resumably. Both are read by `lev_jax.data.prepared.open_prepared`.
Library: TensorFlow Datasets, https://www.tensorflow.org/datasets/add_dataset
(``GeneratorBasedBuilder``, ``MANUAL_DOWNLOAD_INSTRUCTIONS``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

from absl import logging
from etils import epath
import ml_collections
import tensorflow_datasets as tfds

from lev_jax.data import corpus
from lev_jax.data import tokenizer as tokenizer_lib
from lev_jax.data import tokenizer_files
from lev_jax.data.errors import DataError
from lev_jax.data.files import npy_bytes, write_bytes_atomic
from lev_jax.data.prepared import (COUNTS_FILE, DATASET_VERSION, FORMAT_VERSION, REPORT_FILE,
                                   TOKENIZER_DIR, TokenCounter, dataset_report,
                                   describe_files, features, file_examples, run_id,
                                   run_identity, split_report, training_sample)
from lev_jax.data.reports import new_report



@dataclasses.dataclass(eq=False, kw_only=True)
class LevTextConfig(tfds.core.BuilderConfig):
  """What a `LevText` dataset holds; the fields mirror ``config.data``.

  Attributes:
    format: "tokens" or "text" (config.data.prepare_format).
    tokenizer: "bytes", "o200k_base" or "sentencepiece" (config.data.tokenizer).
    vocab_size: the tokenizer's number of ids (config.model.vocab_size).
    tiktoken_file, sentencepiece_file: as in config.data; sentencepiece without a file
      trains one on a sample of the train split (`training_sample`).
    pile_set_names, strict: as in config.data.
    cache_dir: folder for trained SentencePiece models (``{cache_dir}/tokenizers``).
  """

  format: str = "tokens"
  tokenizer: str = "bytes"
  vocab_size: int = 0
  tiktoken_file: str = ""
  sentencepiece_file: str = ""
  pile_set_names: tuple[str, ...] = ()
  strict: bool = False
  cache_dir: str = "~/.cache/lev_jax"

  def data_config(self) -> ml_collections.ConfigDict:
    """The config.data fields `tokenizer.make_tokenizer` reads."""
    return ml_collections.ConfigDict({
        "tokenizer": self.tokenizer, "tiktoken_file": self.tiktoken_file,
        "sentencepiece_file": self.sentencepiece_file, "cache_dir": self.cache_dir})


def manual_files(manual_dir, *, report: dict | None = None) -> dict[str, list[epath.Path]]:
  """The Pile files in a manual directory: ``train/*.jsonl[.zst]`` (or ``train.jsonl
  [.zst]``), ``val.jsonl[.zst]`` -> "validation", ``test.jsonl[.zst]`` -> "test".

  Raises:
    DataError: no training file.
  """
  root = epath.Path(manual_dir)
  found = {}
  for split, stem in (("train", "train"), ("validation", "val"), ("test", "test")):
    names = [root / f"{stem}{s}" for s in corpus.SUFFIXES]
    if split == "train" and (root / "train").is_dir():
      names.insert(0, root / "train")
    names = [n for n in names if n.exists()]
    if names:
      found[split] = corpus.expand_files(names, report=report)
  if "train" not in found:
    raise DataError(f"{root}: no training data; expected The Pile's train/*.jsonl.zst "
                    "(and val.jsonl.zst, test.jsonl.zst) in the manual directory")
  return found


class LevText(tfds.core.GeneratorBasedBuilder):
  """The Pile (or any Pile-format JSONL) as lev_text ArrayRecord shards, via TFDS.

  For users who drive TFDS themselves::

    builder = LevText(config="bytes_tokens", data_dir=..., file_format="array_record")
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
        manual_dir="/data/pile"))
    dataset = open_prepared(builder.data_path)

  Records and metadata are those of ``lev-prepare-data`` (`features`, `file_examples`),
  plus ``tokenizer/``, ``token_counts.npy`` and ``report.json`` written as the
  examples are generated. TFDS orders records by a hash of their keys (not file then
  line order), chooses its own shard count, and writes no per-shard run ids. Custom
  tokenizers: ``LevText(config=LevTextConfig(name=..., tokenizer="sentencepiece",
  vocab_size=32000, sentencepiece_file=...), ...)``.
  """

  VERSION = tfds.core.Version(DATASET_VERSION)
  RELEASE_NOTES = {DATASET_VERSION: "ArrayRecord shards of tokens or text, with tokenizer, "
                            "token counts and report."}
  BUILDER_CONFIGS = [
      LevTextConfig(name="bytes_tokens", format="tokens", tokenizer="bytes",
                    vocab_size=259, description="UTF-8 byte ids (259)."),
      LevTextConfig(name="bytes_text", format="text", tokenizer="bytes", vocab_size=259,
                    description="Raw text; byte token counts."),
      LevTextConfig(name="o200k_base_tokens", format="tokens", tokenizer="o200k_base",
                    vocab_size=200_019, description="o200k_base ids (tiktoken)."),
      LevTextConfig(name="o200k_base_text", format="text", tokenizer="o200k_base",
                    vocab_size=200_019, description="Raw text; o200k_base token counts."),
  ]
  MANUAL_DOWNLOAD_INSTRUCTIONS = """\
  Put The Pile (https://pile.eleuther.ai/; Gao et al. 2020) in the manual directory:
    {manual_dir}/train/00.jsonl.zst ... 29.jsonl.zst   (or any train/*.jsonl[.zst])
    {manual_dir}/val.jsonl.zst
    {manual_dir}/test.jsonl.zst                        (optional)
  Any Pile-format JSONL works: one {"text": str, "meta": {"pile_set_name": str}} per line.
  """

  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls) -> epath.Path:
    """This file. (TFDS 4.9's own lookup imports the ``importlib_resources`` backport,
    which TFDS does not install, for builders defined inside a package.)"""
    return epath.Path(__file__)

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self, description=__doc__.splitlines()[0],
        features=features(self.builder_config.format), homepage="https://pile.eleuther.ai/",
        metadata=tfds.core.MetadataDict())

  def _make_tokenizer(self, files: dict[str, list[epath.Path]]):
    c = self.builder_config
    if c.vocab_size <= 0:
      raise DataError(f"LevTextConfig({c.name!r}).vocab_size = {c.vocab_size}: expected "
                      "the tokenizer's number of ids")
    train_texts = None
    if c.tokenizer == "sentencepiece" and not c.sentencepiece_file:
      train_texts = training_sample(files["train"], strict=c.strict,
                                    pile_set_names=c.pile_set_names)
    return tokenizer_lib.make_tokenizer(c.data_config(), c.vocab_size, train_texts)

  def _split_generators(self, dl_manager):
    c = self.builder_config
    files = manual_files(dl_manager.manual_dir)
    self._files = files
    self._tokenizer = self._make_tokenizer(files)
    tokenizer_files.save_tokenizer(self._tokenizer, self.data_path / TOKENIZER_DIR)
    self._reports = {split: new_report() for split in files}
    self._tokens = dict.fromkeys(files, 0)
    self._counter = TokenCounter(self._tokenizer.vocab_size, self._tokenizer.eos_id)
    logging.info("LevText(%s): %s", c.name,
                 {s: len(f) for s, f in files.items()})
    return {split: self._generate_examples(split=split, files=split_files)
            for split, split_files in files.items()}

  def _generate_examples(self, split: str, files: Sequence[epath.Path]):
    c = self.builder_config
    report = self._reports[split]
    for i, path in enumerate(files):
      report["files"] += 1
      for lineno, record, ids_N in file_examples(
          path, self._tokenizer, fmt=c.format, strict=c.strict,
          pile_set_names=c.pile_set_names, report=report):
        self._tokens[split] += ids_N.size
        if split == "train":
          self._counter.add(ids_N)
        yield f"{i:05d}:{lineno:012d}", record

  def _download_and_prepare(self, dl_manager, download_config):
    super()._download_and_prepare(dl_manager, download_config)
    c = self.builder_config
    tok_info = tokenizer_files.tokenizer_info(self._tokenizer)
    sources = {split: describe_files(f) for split, f in self._files.items()}
    identity = run_identity(fmt=c.format, strict=c.strict,
                            pile_set_names=c.pile_set_names,
                            tokenizer={"name": tok_info["name"],
                                       "fingerprint": tok_info["fingerprint"]},
                            sources=sources)
    rid = run_id(identity)
    splits = {split: split_report(self._reports[split], self._tokens[split],
                                  self.info.splits[split].num_examples)
              for split in self._files}
    report = dataset_report(rid, c.format, tok_info, splits)
    # The data_path is TFDS's temporary folder here; it is renamed when done.
    write_bytes_atomic(self.data_path / COUNTS_FILE, npy_bytes(self._counter.counts_V))
    write_bytes_atomic(self.data_path / REPORT_FILE,
                       (json.dumps(report, indent=2) + "\n").encode())
    self.info.metadata.update(
        format_version=FORMAT_VERSION, run_id=rid, format=c.format, tokenizer=tok_info,
        sources=sources, pile_set_names=list(c.pile_set_names), strict=bool(c.strict),
        report=report, writer="tfds:LevText")
