"""Data for lev_jax: documents -> token ids -> packed grain batches.

`load(config)` reads ``config.data`` once and returns a `DataBundle`
(`lev_jax.data.sources`, `lev_jax.data.bundle`). Sources
(``config.data.source``):

* ``'embedded'``: a corpus frozen in the package, chosen by ``config.data.corpus``:
  ``python_docs`` (default), CPython 3.11.7's pydoc topics and standard-library
  docstrings (607 documents, 2.3 MB); ``debian_books``, four Debian manuals (2.0 MB of
  prose); ``foldoc``, the Free On-line Dictionary of Computing (3.9 MB)
  (`embedded.CORPORA`, sha256-checked), written once as Pile-format JSONL under
  ``config.data.cache_dir`` and split per document by a hash of its text (a test
  split too with ``data.test_fraction`` > 0, for ``lev-eval --split=test``);
* ``'jsonl'``: Pile-format ``*.jsonl`` / ``*.jsonl.zst`` files or globs (local or
  ``gs://``) in ``config.data.train_files`` read into memory (and ``validation_files``,
  else a hash hold-out of ``validation_fraction``); small corpora;
* ``'jsonl_stream'``: the same files streamed (`stream.JsonlStreamDataset`, file order
  shuffled per epoch, packed sequences shuffled in a ``shuffle_buffer`` window: the
  paper's setting); no preparation step; resume re-reads the current file up to its
  position; documents, tokens and skipped lines are counted as the stream reads them
  (`DataBundle.current_report`: complete once a whole epoch was read);
* ``'prepared'``: the ArrayRecord dataset written by ``lev-prepare-data``
  (`prepared.open_prepared`): random access, a global shuffle by seed, its own
  tokenizer, token counts and data report; The Pile at pod scale.

Tokenizers (``config.data.tokenizer``): SentencePiece BPE trained on the training text
(cached under ``{cache_dir}/tokenizers``) or ``data.sentencepiece_file``; o200k_base
through tiktoken (``data.tiktoken_file``); UTF-8 bytes. Batches are ``{"inputs",
"targets": int32 [B, L], "weights": float32 [B, L]}`` (+ ``segment_ids``,
``positions`` with ``data.segment_masking``), L = ``config.train.seq_len``.

Modules: `sources` (`load`, `evaluation_batches`), `bundle` (`DataBundle`), `errors`
(`DataError`), `corpus` (file lists, Pile-format readers), `reports` (read reports),
`splits` (hash splits), `embedded` (the frozen corpora; `embedded_build` rebuilds the
default one, `corpora_build` the presets from pinned Debian packages), `stream`, `tokenizer`, `tokenizer_files` (a tokenizer saved to and
rebuilt from a folder), `pipeline` (grain), `prepared` / `prepare` (ArrayRecord
datasets), `files` (atomic writes), `vocabularies` (seqio; imports TensorFlow, so it
is never imported here). This module only re-exports.
"""

from lev_jax.data.bundle import DataBundle
from lev_jax.data.corpus import read_documents
from lev_jax.data.embedded import embedded_documents, write_embedded_corpus
from lev_jax.data.errors import DataError
from lev_jax.data.pipeline import make_eval_batches, make_train_dataset, token_counts
from lev_jax.data.sources import evaluation_batches, load
from lev_jax.data.tokenizer import (ByteTokenizer, SentencePieceTokenizer, TiktokenTokenizer,
                                    train_sentencepiece)

__all__ = [
    "ByteTokenizer", "DataBundle", "DataError", "SentencePieceTokenizer", "TiktokenTokenizer",
    "embedded_documents", "evaluation_batches", "load", "make_eval_batches",
    "make_train_dataset", "read_documents", "token_counts", "train_sentencepiece",
    "write_embedded_corpus",
]
