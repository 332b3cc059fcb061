"""Builds the embedded corpus's frozen file from this Python's own texts (run on purpose).

The default data of every lev_jax job is `lev_jax/data/embedded_corpus.jsonl.zst`
(`lev_jax.data.embedded`), frozen once so that the same commands give the same
tokenizer, splits and figures on every machine. It was built by this module:

    python -m lev_jax.data.embedded_build --output lev_jax/data/embedded_corpus.jsonl.zst

which walks the running CPython's ``pydoc_data.topics`` and standard-library
docstrings (`stdlib_documents`), writes them as Pile-format JSONL compressed with
Zstandard (level 19, one frame, deterministic), and prints the sha256, document count
and bytes to record in `lev_jax.data.embedded` (EMBEDDED_SHA256, EMBEDDED_DOCUMENTS).
Regenerating it changes the default data, hence every measured figure in the docs:
bump EMBEDDED_VERSION and rerun benchmarks/readme_figures.py.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import inspect
import io
import json
import pkgutil
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import zstandard

ZSTD_LEVEL = 19


# Top-level standard-library modules never imported for the embedded corpus: they act on
# import (open a browser, print, need a display or a terminal, write caches), only exist
# on other platforms, or are test suites (so is any module with "test" in its name).
_SKIP_MODULES = frozenset({
    "__main__", "antigravity", "this", "tkinter", "turtle", "turtledemo", "idlelib",
    "lib2to3", "test", "ensurepip", "distutils", "readline", "rlcompleter", "curses",
    "pydoc_data", "msilib", "msvcrt", "winreg", "winsound", "nt", "site", "sitecustomize",
    "usercustomize", "xxsubtype", "xxlimited", "__hello__", "__phello__", "_tkinter",
    "_curses", "_curses_panel", "_msi", "_winapi", "_overlapped", "_scproxy",
})
_SKIP_SUBMODULE_NAMES = frozenset({"test", "tests", "__main__", "idle_test"})

def _clean(doc) -> str:
  return inspect.cleandoc(doc) if isinstance(doc, str) and doc.strip() else ""


def _module_text(module) -> str:
  """The module docstring, then its own classes' and functions' docstrings, by name."""
  parts, seen = [], set()

  def add(header: str, doc) -> None:
    text = _clean(doc)
    if text and text not in seen:  # identical boilerplate ("Return self==value.") once
      seen.add(text)
      parts.append(f"{header}\n{text}" if header else text)

  add("", module.__doc__)
  for name, obj in sorted(vars(module).items()):
    if getattr(obj, "__module__", None) != module.__name__:
      continue
    if inspect.isclass(obj):
      add(f"{module.__name__}.{name}", obj.__doc__)
      for attr, member in sorted(vars(obj).items()):
        if isinstance(member, (staticmethod, classmethod)):
          member = member.__func__
        if (isinstance(member, property) or inspect.isfunction(member)
            or inspect.isbuiltin(member) or inspect.ismethoddescriptor(member)):
          add(f"{module.__name__}.{name}.{attr}", getattr(member, "__doc__", None))
    elif inspect.isfunction(obj) or inspect.isbuiltin(obj):
      add(f"{module.__name__}.{name}", obj.__doc__)
  return "\n\n".join(parts)


def _import_quietly(name: str):
  """The module, or None when it cannot be imported here; warnings and output muted."""
  sink = io.StringIO()
  try:
    with warnings.catch_warnings(), contextlib.redirect_stdout(sink), \
        contextlib.redirect_stderr(sink):
      warnings.simplefilter("ignore")
      return importlib.import_module(name)
  except Exception:  # pylint: disable=broad-except  # platform-only or broken module
    return None


def _walk_package(module) -> Iterator:
  """The module and (recursively, sorted by name) its non-test submodules."""
  yield module
  for info in sorted(pkgutil.iter_modules(getattr(module, "__path__", None) or []),
                     key=lambda i: i.name):
    if info.name in _SKIP_SUBMODULE_NAMES:
      continue
    sub = _import_quietly(f"{module.__name__}.{info.name}")
    if sub is not None:
      yield from _walk_package(sub)


def stdlib_documents() -> list[dict]:
  """Real text that ships with every Python: pydoc help topics and stdlib docstrings.

  Returns:
    Pile-format records ``{"text": str, "meta": {"pile_set_name": str}}``: one per
    ``pydoc_data.topics`` entry (``"pydoc_topics"``, sorted by topic), then one per
    importable standard-library module and submodule (``"stdlib_docstrings"``, sorted
    by name, `sys.stdlib_module_names` walked with `pkgutil.iter_modules`): the module,
    class, method and function docstrings (`inspect.cleandoc`), each headed by its
    qualified name. Order and content are fixed for a given Python build but differ
    between patch releases (2.3 MB of UTF-8 text in 607 documents on CPython 3.11.7,
    Linux; 604 on 3.11.2): hence the frozen copy in `embedded`. Modules with import side
    effects (``antigravity``, ``this``, ``tkinter``, ``turtle``, ``idlelib``,
    ``lib2to3``, ``readline``, ...) and test packages are never imported; modules that
    fail to import here are left out; warnings and output during import are muted.
  """
  from pydoc_data import topics  # pylint: disable=g-import-not-at-top

  docs = [{"text": topics.topics[key], "meta": {"pile_set_name": "pydoc_topics"}}
          for key in sorted(topics.topics) if topics.topics[key].strip()]
  names = sorted(n for n in sys.stdlib_module_names
                 if n not in _SKIP_MODULES and "test" not in n)
  with warnings.catch_warnings():  # deprecated modules warn on attribute access too
    warnings.simplefilter("ignore")
    for name in names:
      top = _import_quietly(name)
      if top is None:
        continue
      for module in _walk_package(top):
        text = _module_text(module)
        if text.strip():
          docs.append({"text": text, "meta": {"pile_set_name": "stdlib_docstrings"}})
  return docs


def corpus_bytes(docs: list[dict]) -> bytes:
  """The frozen file's bytes: one compact JSON object per line (UTF-8, keys in the
  order text, meta), Zstandard level ZSTD_LEVEL with the content size in the header."""
  jsonl = "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs).encode("utf-8")
  return zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True).compress(jsonl)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--output", required=True, help="the .jsonl.zst file to write")
  args = parser.parse_args(argv)
  docs = stdlib_documents()
  data = corpus_bytes(docs)
  out = Path(args.output)
  tmp = out.with_name(out.name + ".tmp")
  tmp.write_bytes(data)
  tmp.replace(out)
  print(f"wrote {out}: {len(docs)} documents, {len(data):,} bytes "
        f"(CPython {'.'.join(map(str, sys.version_info[:3]))})")
  print(f"EMBEDDED_SHA256 = \"{hashlib.sha256(data).hexdigest()}\"")
  print(f"EMBEDDED_DOCUMENTS = {len(docs)}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
