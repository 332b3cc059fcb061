"""The prose presets' builder on tiny made-up inputs (no package is downloaded): book
pages to sections, FOLDOC entries to documents, deduplication, pinned .deb checks."""

import dataclasses
import gzip

import pytest

from lev_jax.data import corpora_build as cb

PROSE = "This sentence is ordinary English prose about packages and their maintainers. "
BOOK = cb.Package("book", "1.0", "0" * 64, "GPL-2.0+", "A Book", "book", "./doc/", "a.html")


def _page(body: str, next_page: str = "") -> bytes:
  link = f'<link rel="next" href="{next_page}" title="Next" />' if next_page else ""
  return (f'<?xml version="1.0"?><html><head><title>T</title>{link}</head><body>'
          f'<div id="banner"><span>Download the ebook</span></div>'
          f'<ul class="docnav top"><li>Prev</li></ul>{body}'
          f'<div role="navigation"><p>Sidebar</p></div></body></html>').encode()


def test_book_pages_become_sections_without_code_tables_or_navigation():
  files = {
      "./doc/a.html": _page(
          f'<h1 class="title">1. Start</h1><div class="para">{PROSE * 6}</div>'
          '<pre class="screen">$ apt-get install secret-command</pre>'
          '<table><tr><td>cell text</td></tr></table><div class="toc"><p>toc</p></div>'
          f'<h2>1.1. Tiny<a class="headerlink" href="#x">¶</a></h2><p>Short.</p>'
          f'<h2>1.2. Next</h2><div class="para">{PROSE * 6}<br/>end &amp; more</div>',
          "b.html"),
      "./doc/b.html": _page(f'<h2 class="title">2. Other</h2><ul><li>{PROSE * 6}</li></ul>'),
      "./doc/stray.html": _page(f"<h2>Stray</h2><p>{PROSE * 9}</p>"),  # not linked
  }
  docs = cb.book_documents(files, BOOK)
  assert [d["meta"]["title"] for d in docs] == ["1. Start", "1.1. Tiny", "2. Other"]
  text = "\n".join(d["text"] for d in docs)
  for gone in ("secret-command", "cell text", "toc", "Download", "Prev", "Sidebar",
               "Stray", "¶", "<"):
    assert gone not in text, gone
  # A section shorter than BOOK_MIN_CHARS takes in the next one, whose title is a line.
  assert docs[1]["text"].startswith("1.1. Tiny\n\nShort.\n\n1.2. Next\n\nThis sentence")
  assert docs[1]["text"].endswith("maintainers. end & more")
  assert {d["meta"]["pile_set_name"] for d in docs} == {"book"}


def _dictd(entries: list[tuple[str, str]]) -> dict[str, bytes]:
  """A dictd pair: the gzip'd entries and an index of base-64 offsets and lengths."""
  def b64(n):
    digits = ""
    while True:
      digits = cb._B64[n % 64] + digits  # pylint: disable=protected-access
      n //= 64
      if not n:
        return digits
  data, index, offset = b"", [], 0
  for word, text in entries:
    raw = text.encode()
    index.append(f"{word}\t{b64(offset)}\t{b64(len(raw))}")
    data, offset = data + raw, offset + len(raw)
  return {cb._FOLDOC_DICT: gzip.compress(data),  # pylint: disable=protected-access
          cb._FOLDOC_INDEX: "\n".join(index).encode()}  # pylint: disable=protected-access


def test_foldoc_entries_are_cleaned_and_stubs_and_other_licences_left_out():
  body = ("   <programming> An {abstract data type} hides its form behind {access\n"
          "   functions}; see {Cook paper (http://wcook.org/a.pdf)} and\n"
          "   http://example.com/x for more.  A {subclass} {inherits {inheritance}} all.\n"
          f"   {PROSE}{PROSE}\n\n"
          "    *# | + 0 -\n    ---|------\n\n"
          "   (2003-07-03)\n")
  files = _dictd([
      ("00-database-info", "00-database-info\n\n   This file was converted.\n"),
      ("adt", f"abstract data type%%%ADT\n\n{body}\n"),
      ("stub", "stub\n\n   {something else}.\n"),
      ("dictionary.debian", f"Dictionary.debian\n\n        {PROSE * 4}\n"),
      ("developer", f"developer\n\n        <Debian> {PROSE * 4}\n"),
  ])
  docs = cb.foldoc_documents(files)
  assert len(docs) == 1 and docs[0]["meta"] == {"pile_set_name": "foldoc",
                                               "title": "abstract data type"}
  title, paragraph = docs[0]["text"].split("\n\n")
  assert title == "abstract data type"
  assert paragraph.startswith("An abstract data type hides its form behind access "
                              "functions; see Cook paper and for more. A subclass "
                              "inherits inheritance all. This sentence")
  for gone in ("<", "{", "http", "*#", "2003"):
    assert gone not in docs[0]["text"], gone


def test_deduplicate_drops_repeated_paragraphs_and_near_duplicate_documents():
  long = PROSE * 3
  other = " ".join(f"word{i}" for i in range(120))
  docs = [{"text": f"A\n\n{long}\n\nshort line", "meta": {}},
          {"text": f"B\n\n{long}\n\nshort line\n\n{other}", "meta": {}},  # long repeats
          {"text": f"C\n\n{long}", "meta": {}},  # nothing left once the repeat is dropped
          {"text": f"D\n\n{other} extra words at the end", "meta": {}}]  # near-duplicate of B
  kept, stats = cb.deduplicate(docs, min_chars=50)
  assert [d["text"] for d in kept] == [f"A\n\n{long}\n\nshort line",
                                       f"B\n\nshort line\n\n{other}"]
  assert stats == {"paragraphs_dropped": 2, "documents_dropped_short": 1,
                   "documents_dropped_near_duplicate": 1}


def test_a_deb_that_is_missing_or_not_the_pinned_one_is_one_line(tmp_path, capsys):
  with pytest.raises(cb.BuildError, match=r"book_1.0_all.deb: no such file \(--deb-dir "
                     r"must hold book_1.0_all.deb\)"):
    cb.fetch_deb(BOOK, tmp_path, tmp_path)
  (tmp_path / BOOK.deb_name).write_bytes(b"not a deb")
  with pytest.raises(cb.BuildError, match=r"book_1.0_all.deb: sha256 [0-9a-f]{64} is not "
                     r"the pinned 0{64} of book 1.0$"):
    cb.fetch_deb(BOOK, tmp_path, tmp_path)
  assert dataclasses.replace(BOOK, sha256="1").deb_name == "book_1.0_all.deb"
  assert cb.main(["--output-dir", str(tmp_path / "out"), "--deb-dir",
                  str(tmp_path / "none"), "--corpus", "foldoc"]) == 2
  err = capsys.readouterr().err
  assert err.startswith("error: ") and err.count("\n") == 1 and "dict-foldoc_" in err
  assert not (tmp_path / "out").exists()  # nothing written
