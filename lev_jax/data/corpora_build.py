"""Builds the frozen prose corpora from pinned Debian packages (run on purpose, never in
tests).

Besides the default embedded corpus (`embedded_build`), lev_jax ships two English prose
corpora as ``data.corpus`` presets (`lev_jax.data.embedded.CORPORA`), each built by this
module from Debian packages whose versions and .deb sha256 are pinned in `PACKAGES`:

* ``debian_books``: four Debian manuals, a technical book's prose (GPL-2.0+ together):
  *The Debian Administrator's Handbook* (debian-handbook 11.20220922; CC-BY-SA-3.0 or
  GPL-2.0+), *Debian Reference* (debian-reference-en 2.100; GPL-2.0+), the *Debian
  Developer's Reference* (developers-reference 12.18; GPL-2.0+) and the *Debian Policy
  Manual* (debian-policy 4.6.2.0; GPL-2.0+), read from their English HTML along the
  rel="next" links (`book_documents`), one document per h1-h3 section; code blocks,
  tables, figures, examples, navigation and tables of contents left out;
* ``foldoc``: *The Free On-line Dictionary of Computing* (dict-foldoc 20230119-1, dictd
  format; encyclopedic entries; GFDL-1.1+, no invariant sections), one document per
  entry of at least `FOLDOC_MIN_CHARS` characters (`foldoc_documents`);
  cross-reference braces, domain tags, URLs, dates and indented tables left out, and
  Debian's own additions (another licence) too.

Both are then deduplicated (`deduplicate`: exact repeats of paragraphs of at least
`DEDUP_MIN_WORDS` words, then documents whose word 5-grams lie mostly in one earlier
document), written as Pile-format JSONL compressed with Zstandard
(`embedded_build.corpus_bytes`, deterministic) to ``OUTPUT_DIR/NAME.jsonl.zst``, and
summed up in ``OUTPUT_DIR/manifest.json`` (sha256, documents, characters, the split at
`MANIFEST_FRACTIONS`, package, version, licence). Rebuild with

    python -m lev_jax.data.corpora_build --output-dir lev_jax/data/corpora

which runs ``apt-get download NAME=VERSION`` (a Debian 12 machine, whose archive holds
these versions; ``--deb-dir`` reads already downloaded .deb files instead, e.g. from
snapshot.debian.org), checks each .deb's sha256 and reads it with ``dpkg-deb
--fsys-tarfile``. It prints the constants to record in `lev_jax.data.embedded.CORPORA`;
a changed corpus changes every figure measured on it: bump its version there.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import gzip
import hashlib
import html.parser
import json
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from lev_jax.data.embedded_build import corpus_bytes
from lev_jax.data.splits import split_of

# Paragraphs of at least this many words are dropped when they repeat an earlier one.
DEDUP_MIN_WORDS = 8
# A document is a near duplicate when this share of its word 5-grams is in one earlier
# document.
NEAR_DUPLICATE_SHARE = 0.8
BOOK_MIN_CHARS = 400      # a shorter book section joins the next one of its page
FOLDOC_MIN_CHARS = 200    # shorter entries (stubs, "see X") are left out
MANIFEST_FRACTIONS = (0.05, 0.05)  # (validation, test) of the manifest's split counts


@dataclasses.dataclass(frozen=True)
class Package:
  """One pinned Debian package: name, version, the .deb's sha256, its licence, and for
  a book its HTML pages' folder in the .deb and first page (read along rel="next")."""
  name: str
  version: str
  sha256: str
  licence: str
  title: str
  subset: str  # the documents' meta.pile_set_name
  pages: str = ""
  first_page: str = ""

  @property
  def deb_name(self) -> str:
    return f"{self.name}_{self.version}_all.deb"


_HANDBOOK = Package(
    "debian-handbook", "11.20220922",
    "3d5dbeac1f1afc9c094eab9d0f701f6ecff99c4927d5a4794cf6c85678134faa",
    "CC-BY-SA-3.0 or GPL-2.0+ (Raphael Hertzog, Roland Mas, Freexian SARL)",
    "The Debian Administrator's Handbook, Debian 11 edition", "debian_handbook",
    "./usr/share/doc/debian-handbook/html/en-US/", "index.html")
_REFERENCE = Package(
    "debian-reference-en", "2.100",
    "9f31d3a17df505de09689ca255512ea58c1fc47c59bb1b0c7bf1c23362e9743f",
    "GPL-2.0+ (Osamu Aoki)", "Debian Reference, version 2.100", "debian_reference",
    "./usr/share/debian-reference/", "index.en.html")
_DEVELOPERS = Package(
    "developers-reference", "12.18",
    "0dba82f6fa16e373f2a84ad07e7971aa9264ad2e7d2ae46b37edbc9c5fd57e2e",
    "GPL-2.0+ (Christian Schwarz, Adam Di Carlo, Raphael Hertzog, Andreas Barth and "
    "others)", "Debian Developer's Reference, version 12.18", "developers_reference",
    "./usr/share/developers-reference/", "index.html")
_POLICY = Package(
    "debian-policy", "4.6.2.0",
    "ef9d01b625c3b87c3a845c2cd1b66f1a16e9240b2b9e5bee53472a00e8457a39",
    "GPL-2.0+ (Ian Jackson, Christian Schwarz, Manoj Srivastava and other Debian "
    "contributors)", "Debian Policy Manual, version 4.6.2.0", "debian_policy",
    "./usr/share/doc/debian-policy/policy.html/", "index.html")
_FOLDOC = Package(
    "dict-foldoc", "20230119-1",
    "745cbedb55c2da609cc88ee0284e9d11a67a11ae3709daf7bad0e895ac3294c3",
    "GFDL-1.1+, no invariant sections (Denis Howe, editor)",
    "The Free On-line Dictionary of Computing, 19 January 2023", "foldoc")

# Each corpus: its packages, read in this order.
PACKAGES = {
    "debian_books": (_HANDBOOK, _REFERENCE, _DEVELOPERS, _POLICY),
    "foldoc": (_FOLDOC,),
}
# The corpus's licence: the one every package's text may be shared under together.
LICENCES = {"debian_books": "GPL-2.0+", "foldoc": "GFDL-1.1+"}

_FOLDOC_DICT = "./usr/share/dictd/foldoc.dict.dz"
_FOLDOC_INDEX = "./usr/share/dictd/foldoc.index"


class BuildError(Exception):
  """A package that cannot be had or is not the pinned one (one line)."""


def fetch_deb(package: Package, deb_dir: Path | None, work: Path) -> Path:
  """The pinned .deb: ``deb_dir/NAME_VERSION_all.deb`` when deb_dir is given, else
  downloaded into `work` with ``apt-get download NAME=VERSION``; its sha256 checked.

  Raises:
    BuildError: the file is missing, apt-get fails, or the sha256 differs.
  """
  if deb_dir is not None:
    path = deb_dir / package.deb_name
    if not path.is_file():
      raise BuildError(f"{path}: no such file (--deb-dir must hold {package.deb_name})")
  else:
    run = subprocess.run(["apt-get", "download", f"{package.name}={package.version}"],
                         cwd=work, capture_output=True, text=True, check=False)
    path = work / package.deb_name
    if run.returncode or not path.is_file():
      last = (run.stderr.strip().splitlines() or ["no output"])[-1]
      raise BuildError(f"apt-get download {package.name}={package.version} failed "
                       f"({last}); pass --deb-dir with {package.deb_name}")
  digest = hashlib.sha256(path.read_bytes()).hexdigest()
  if digest != package.sha256:
    raise BuildError(f"{path}: sha256 {digest} is not the pinned {package.sha256} of "
                     f"{package.name} {package.version}")
  return path


def deb_members(deb: Path, wanted) -> dict[str, bytes]:
  """The regular files of a .deb's data archive for which wanted(name) is true, by
  name (``./usr/...``), read with ``dpkg-deb --fsys-tarfile`` as a stream."""
  with subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)],
                        stdout=subprocess.PIPE) as proc:
    files = {}
    with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
      for member in tar:
        if member.isfile() and wanted(member.name):
          files[member.name] = tar.extractfile(member).read()
  if proc.returncode:
    raise BuildError(f"{deb}: dpkg-deb --fsys-tarfile failed (exit {proc.returncode})")
  return files


def _words(text: str) -> str:
  return " ".join(text.split())


class _BookPage(html.parser.HTMLParser):
  """One HTML page of a book (Publican, DocBook XSL or Sphinx output) as events
  ("title", text) for h1-h3 headings and ("para", text) for every other block of text,
  in page order; code, tables, figures, examples, navigation, tables of contents and
  permalink marks are left out."""

  _SKIP_TAGS = frozenset({"head", "pre", "table", "script", "style"})
  _SKIP_CLASSES = frozenset({
      "toc", "docnav", "navheader", "navfooter", "example", "informalexample",
      "figure", "mediaobject", "legalnotice", "indexterm", "calloutlist", "headerlink",
      "sphinxsidebar", "related", "footer", "highlight", "table", "list-of-tables",
      "list-of-figures", "list-of-examples"})
  _SKIP_IDS = frozenset({"banner", "title", "searchbox"})
  _SKIP_ROLES = frozenset({"navigation", "search", "contentinfo"})
  _BLOCKS = frozenset({"div", "p", "li", "dt", "dd", "h1", "h2", "h3", "h4", "h5", "h6",
                       "blockquote", "ul", "ol", "dl", "section"})

  def __init__(self):
    super().__init__(convert_charrefs=True)
    self.events: list[tuple[str, str]] = []
    self._text: list[str] = []
    self._stack: list[tuple[str, bool]] = []  # (tag, starts a skipped element)
    self._skipping = 0

  def _flush(self, kind: str = "para") -> None:
    text = _words("".join(self._text))
    self._text = []
    if text:
      self.events.append((kind, text))

  def handle_starttag(self, tag, attrs):
    attrs = dict(attrs)
    classes = set((attrs.get("class") or "").split())
    skip = (tag in self._SKIP_TAGS or bool(classes & self._SKIP_CLASSES)
            or attrs.get("id") in self._SKIP_IDS or attrs.get("role") in self._SKIP_ROLES)
    if tag in ("meta", "link", "img", "br", "hr", "input"):  # void: no end tag in HTML
      self.handle_startendtag(tag, attrs)
      return
    self._stack.append((tag, skip))
    if skip:
      self._skipping += 1
    elif not self._skipping and tag in self._BLOCKS:
      self._flush()

  def handle_endtag(self, tag):
    if not any(open_tag == tag for open_tag, _ in self._stack):
      return  # a stray end tag
    while self._stack:
      open_tag, skip = self._stack.pop()
      if skip:
        self._skipping -= 1
      if open_tag == tag:
        break
    if not self._skipping and tag in self._BLOCKS:
      self._flush("title" if tag in ("h1", "h2", "h3") else "para")

  def handle_startendtag(self, tag, attrs):
    if tag == "br" and not self._skipping:
      self._text.append(" ")

  def handle_data(self, data):
    if not self._skipping:
      self._text.append(data)


def _next_page(page: bytes) -> str:
  """The href of a page's <link rel="next"> ("" when it has none)."""
  for tag in re.findall(rb"<link\b[^>]*>", page):
    if re.search(rb'\brel="next"', tag):
      href = re.search(rb'\bhref="([^"#]+)"', tag)
      return href.group(1).decode() if href else ""
  return ""


def _book_order(pages: dict[str, bytes], first: str) -> list[str]:
  """Page names from `first` along the rel="next" links (other pages: indexes, search,
  single-page copies, are not read)."""
  order, name = [], first
  while name in pages and name not in order:
    order.append(name)
    name = _next_page(pages[name])
  return order


def book_documents(files: dict[str, bytes], package: Package) -> list[dict]:
  """A book's sections as Pile-format records, in reading order.

  Args:
    files: the book's HTML pages, by their path in the .deb (``package.pages`` + name).
    package: the book's package (its pages, first page and subset name).
  Returns:
    ``{"text": title + blank line + paragraphs (blank-line separated), "meta":
    {"pile_set_name": package.subset, "title": str}}`` per h1-h3 section; a section
    with less than BOOK_MIN_CHARS of text takes in the next section of its page (whose
    title becomes a line of it), and so on until it is long enough.
  """
  root = package.pages
  pages = {name[len(root):]: data for name, data in files.items()
           if name.startswith(root) and "/" not in name[len(root):]}
  docs = []

  def flush(title, parts) -> bool:
    if not parts or sum(map(len, parts)) < BOOK_MIN_CHARS:
      return False
    docs.append({"text": "\n\n".join([title] + parts),
                 "meta": {"pile_set_name": package.subset, "title": title}})
    return True

  for name in _book_order(pages, package.first_page):
    parser = _BookPage()
    parser.feed(pages[name].decode("utf-8"))
    parser.close()
    title, parts = None, []
    for kind, text in parser.events:
      if kind != "title":
        parts.append(text)
      elif title is None:
        title = text
      elif flush(title, parts):
        title, parts = text, []
      else:
        parts.append(text)
    flush(title or name, parts)
  return docs


_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_LINK_URL = re.compile(r"\{([^{}]*?)\s*\((?:(?:https?|ftp|mailto|news|telnet|gopher):"
                       r"[^()\s]*|[^()\s]*\.s?html?)\)\}")
_BRACES = re.compile(r"\{([^{}]*)\}")
_TAG = re.compile(r"<[^<>\n]*>")
_URL = re.compile(r"(?:https?|ftp|news|gopher|telnet|mailto):[^\s)}>\]]+|www\.\S+")
_DATE = re.compile(r"\(\d{4}-\d{2}-\d{2}\)")


def _dictd_number(text: str) -> int:
  """A dictd index offset or length: base-64 digits, most significant first."""
  value = 0
  for ch in text:
    value = value * 64 + _B64.index(ch)
  return value


def _foldoc_paragraphs(body: list[str]) -> list[str]:
  """An entry's cleaned paragraphs; indented blocks (tables, code) and dates dropped."""
  paragraphs, block = [], []
  for line in body + [""]:
    if line.strip():
      block.append(line)
      continue
    if block and any(len(l) - len(l.lstrip()) <= 3 for l in block):
      text = _words(" ".join(block))
      text, before = _LINK_URL.sub(r"\1", text), None
      while text != before:  # nested: {inherits {inheritance}}
        text, before = _BRACES.sub(r"\1", text), text
      text = _words(_URL.sub("", _TAG.sub("", text)))
      text = re.sub(r"\(\s*\)|\s+(?=[.,;:])", "", text).strip()
      if len(text.split()) >= 3 and not _DATE.fullmatch(text):
        paragraphs.append(text)
    block = []
  return paragraphs


def foldoc_documents(files: dict[str, bytes]) -> list[dict]:
  """FOLDOC's entries as Pile-format records, in dictionary order.

  Args:
    files: ``_FOLDOC_DICT`` (gzip-compatible dictzip) and ``_FOLDOC_INDEX`` (``word TAB
      offset TAB length``, base-64 numbers) as in the .deb.
  Returns:
    ``{"text": headword + blank line + paragraphs, "meta": {"pile_set_name": "foldoc",
    "title": headword}}`` per entry whose paragraphs total FOLDOC_MIN_CHARS or more;
    the ``00-database-*`` entries, the GFDL's own text and Debian's additions (from
    the ``dictionary.debian`` entry on, another licence) are left out.
  """
  data = gzip.decompress(files[_FOLDOC_DICT])
  rows = [line.split("\t") for line in files[_FOLDOC_INDEX].decode("utf-8").splitlines()]
  spans = {(_dictd_number(o), _dictd_number(n)): word for word, o, n in rows}
  debian = min(o for (o, _), word in spans.items() if word == "dictionary.debian")
  docs = []
  for offset, length in sorted(spans):
    if offset >= debian or spans[offset, length].startswith("00-database"):
      continue
    lines = data[offset:offset + length].decode("utf-8").splitlines()
    cut = lines.index("") if "" in lines else len(lines)
    title = _words(" ".join(lines[:cut]).split("%%%")[0])
    if title.lower().startswith("gnu free documentation license"):
      continue
    paragraphs = _foldoc_paragraphs(lines[cut:])
    if sum(map(len, paragraphs)) >= FOLDOC_MIN_CHARS:
      docs.append({"text": "\n\n".join([title] + paragraphs),
                   "meta": {"pile_set_name": "foldoc", "title": title}})
  return docs


def _key(paragraph: str) -> str:
  """A paragraph's identity for deduplication: lower-case words, punctuation dropped."""
  return " ".join(re.findall(r"\w+", paragraph.lower()))


def deduplicate(docs: list[dict], min_chars: int) -> tuple[list[dict], dict]:
  """Drops repeated paragraphs, then near-duplicate documents; order kept.

  A paragraph (blank-line separated; the first one, the title, is always kept) of at
  least DEDUP_MIN_WORDS words whose `_key` was seen in an earlier paragraph is dropped;
  a document left with less than `min_chars` characters is dropped; a document of
  which NEAR_DUPLICATE_SHARE or more of the distinct word 5-grams lie in one earlier
  kept document is dropped.

  Returns:
    (kept records, {"paragraphs_dropped", "documents_dropped_short",
    "documents_dropped_near_duplicate": int}).
  """
  seen, stats = set(), collections.Counter()
  postings = collections.defaultdict(list)  # 5-gram -> kept documents holding it
  kept = []
  for doc in docs:
    title, *paragraphs = doc["text"].split("\n\n")
    body = []
    for paragraph in paragraphs:
      key = _key(paragraph)
      if len(key.split()) >= DEDUP_MIN_WORDS and key in seen:
        stats["paragraphs_dropped"] += 1
        continue
      seen.add(key)
      body.append(paragraph)
    if sum(map(len, body)) < min_chars:
      stats["documents_dropped_short"] += 1
      continue
    words = _key(" ".join(body)).split()
    grams = {" ".join(words[i:i + 5]) for i in range(max(len(words) - 4, 1))}
    shared = collections.Counter(j for g in grams for j in postings.get(g, ()))
    if shared and shared.most_common(1)[0][1] >= NEAR_DUPLICATE_SHARE * len(grams):
      stats["documents_dropped_near_duplicate"] += 1
      continue
    for g in grams:
      postings[g].append(len(kept))
    kept.append({"text": "\n\n".join([title] + body), "meta": doc["meta"]})
  return kept, {k: stats[k] for k in ("paragraphs_dropped", "documents_dropped_short",
                                      "documents_dropped_near_duplicate")}


def build(name: str, debs: list[Path]) -> tuple[list[dict], dict]:
  """(records, dedup stats) of corpus `name` from its checked .deb files (in
  PACKAGES[name] order)."""
  docs = []
  for package, deb in zip(PACKAGES[name], debs):
    if package.pages:
      files = deb_members(deb, lambda n, root=package.pages: n.startswith(root)
                          and n.endswith(".html"))
      docs += book_documents(files, package)
    else:
      files = deb_members(deb, lambda n: n in (_FOLDOC_DICT, _FOLDOC_INDEX))
      docs += foldoc_documents(files)
  return deduplicate(docs, BOOK_MIN_CHARS if name == "debian_books" else FOLDOC_MIN_CHARS)


def manifest_entry(name: str, docs: list[dict], data: bytes, stats: dict) -> dict:
  """The manifest record of one built corpus (see the module docstring)."""
  validation, test = MANIFEST_FRACTIONS
  split = collections.Counter(split_of(d["text"], validation, test) for d in docs)
  subsets = collections.Counter(d["meta"]["pile_set_name"] for d in docs)
  return {"file": f"{name}.jsonl.zst", "sha256": hashlib.sha256(data).hexdigest(),
          "bytes": len(data), "documents": len(docs),
          "characters": sum(len(d["text"]) for d in docs),
          "utf8_bytes": sum(len(d["text"].encode()) for d in docs),
          "subsets": dict(sorted(subsets.items())),
          "split": {"validation_fraction": validation, "test_fraction": test,
                    **{k: split[k] for k in ("train", "validation", "test")}},
          "deduplication": stats, "licence": LICENCES[name],
          "packages": [{"package": p.name, "version": p.version, "deb_sha256": p.sha256,
                        "title": p.title, "licence": p.licence, "subset": p.subset}
                       for p in PACKAGES[name]]}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--output-dir", required=True, type=Path,
                      help="folder for NAME.jsonl.zst and manifest.json")
  parser.add_argument("--deb-dir", type=Path, default=None,
                      help="read NAME_VERSION_all.deb from here instead of apt-get")
  parser.add_argument("--corpus", action="append", choices=sorted(PACKAGES),
                      help="build only these (repeatable; default: all)")
  args = parser.parse_args(argv)
  built = {}
  with tempfile.TemporaryDirectory() as work:
    for name in args.corpus or sorted(PACKAGES):
      try:
        debs = [fetch_deb(p, args.deb_dir, Path(work)) for p in PACKAGES[name]]
        built[name] = build(name, debs)
      except BuildError as e:  # before anything is written
        print(f"error: {e}", file=sys.stderr)
        return 2
  manifest_path = args.output_dir / "manifest.json"
  manifest = (json.loads(manifest_path.read_text()) if manifest_path.exists() else {})
  args.output_dir.mkdir(parents=True, exist_ok=True)
  for name, (docs, stats) in built.items():
    data = corpus_bytes(docs)
    out = args.output_dir / f"{name}.jsonl.zst"
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(out)
    manifest[name] = entry = manifest_entry(name, docs, data, stats)
    print(f"wrote {out}: {entry['documents']} documents, {entry['utf8_bytes']:,} "
          f"bytes of text, {len(data):,} bytes; dedup {stats}")
    print(f'  sha256="{entry["sha256"]}", documents={entry["documents"]}')
  text = json.dumps(dict(sorted(manifest.items())), indent=2, ensure_ascii=False) + "\n"
  tmp = manifest_path.with_name(manifest_path.name + ".tmp")
  tmp.write_text(text)
  tmp.replace(manifest_path)
  return 0


if __name__ == "__main__":
  sys.exit(main())
