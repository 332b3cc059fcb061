"""The commands of README.md and docs/*.md (benchmarks/readme_commands.py): parsed in
order, every guide in docs/ among them, and no lev-train command lands on a workdir an
earlier one filled with another config (it would resume or refuse that run instead of
doing what the docs say); every relative link of those files points to a file (and a
heading) that exists."""

import importlib.util
import re
import shlex
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _module(path, name):
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


readme_commands = _module(REPO / "benchmarks" / "readme_commands.py", "readme_commands")
readme_figures = _module(REPO / "benchmarks" / "readme_figures.py", "readme_figures")


def _flags(command):
  return dict(re.match(r"--([\w.]+)=?(.*)", a).groups() for a in shlex.split(command)[1:]
              if a.startswith("--"))


def test_commands_are_parsed_in_order_with_continuations_joined():
  text = ("x\n```bash\n# comment\nlev-train --a=1 \\\n  --b=2   # why\n```\n"
          "```console\n$ lev-eval --c=3 \\\n    --d=4\nprinted output\n```\n"
          "```python\nnot_a_command()\n```\n")
  assert readme_commands.readme_commands(text) == ["lev-train --a=1 --b=2",
                                                   "lev-eval --c=3 --d=4"]


def test_every_guide_in_docs_is_read_in_a_set_order():
  assert sorted(readme_commands.DOCS) == sorted(p.name for p in (REPO / "docs").glob("*.md"))
  files = [p.relative_to(REPO).as_posix() for p in readme_commands.doc_files()]
  assert files[0] == "README.md" and files[1:] == [f"docs/{n}" for n in readme_commands.DOCS]
  commands = readme_commands.all_commands()
  assert commands[0][0] == "README.md" and commands[0][1].endswith(".venv/bin/lev-train")
  assert {path for path, _ in commands} >= {"README.md", "docs/training.md",
                                            "docs/evaluation.md", "docs/scaling-out.md"}


def test_no_two_lev_train_commands_share_a_workdir_with_different_configs():
  seen = {}
  for path, command in readme_commands.all_commands():
    command = command.split("&& ")[-1].replace(".venv/bin/", "")
    if not command.startswith("lev-train") or readme_commands.skip_reason(command):
      continue
    flags = _flags(command)
    config = flags.get("config", "experiments/smoke.py:leviathan")
    path, variant = config.split(":")
    name = _module(REPO / path, Path(path).stem).get_config(variant).name
    workdir = flags.get("workdir", f"runs/{name}")
    setup = {k: v for k, v in flags.items() if k != "workdir"} or {"config": config}
    setup.setdefault("config", config)
    assert seen.setdefault(workdir, setup) == setup, (
        f"{path}: {command!r} writes {workdir}, which an earlier command filled with "
        f"{seen[workdir]}")
  assert "runs/smoke_leviathan" in seen and "runs/khronos" in seen


def _slugs(markdown):
  """GitHub's anchors for the headings of a Markdown text (outside code blocks)."""
  slugs, counts = set(), {}
  for line in _prose(markdown).splitlines():
    heading = re.match(r"#{1,6} +(.*?) *#*$", line)
    if heading:
      slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
      n = counts.get(slug, 0)
      counts[slug] = n + 1
      slugs.add(slug if n == 0 else f"{slug}-{n}")
  return slugs


def _prose(markdown):
  """The text outside fenced code blocks."""
  return re.sub(r"^```.*?^```[^\n]*$", "", markdown, flags=re.M | re.S)


def broken_links(path):
  """'target (why)' for each relative link or image of a Markdown file that points to
  no file, or to a heading its Markdown file does not have."""
  text = re.sub(r"`[^`]*`", "", _prose(path.read_text()))  # code spans hold no links
  broken = []
  for target in re.findall(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", text):
    if re.match(r"[a-z][\w+.-]*:", target):  # https:, mailto:
      continue
    file, _, anchor = target.partition("#")
    resolved = (path.parent / file).resolve() if file else path
    if not resolved.exists():
      broken.append(f"{target} (no file {resolved})")
    elif anchor and resolved.suffix == ".md" and anchor not in _slugs(resolved.read_text()):
      broken.append(f"{target} (no heading #{anchor} in {resolved.name})")
  return broken


def test_every_relative_link_of_the_readme_and_docs_exists(tmp_path):
  bad = tmp_path / "bad.md"
  bad.write_text("# A `b` (c)\n[x](missing.md) [y](#a-b-c) [z](#nope) [w](https://x.org)\n"
                 "```bash\n# not a heading\n```\n")
  assert broken_links(bad) == [f"missing.md (no file {tmp_path / 'missing.md'})",
                               "#nope (no heading #nope in bad.md)"]
  files = readme_commands.doc_files()
  assert {f"{p.relative_to(REPO)}: {b}" for p in files for b in broken_links(p)} == set()


def test_readme_figures_names_an_existing_heading_for_every_section():
  assert set(readme_figures.DOCS) == set(readme_figures.SECTIONS)
  for name, target in readme_figures.DOCS.items():
    file, anchor = target.split("#")
    assert anchor in _slugs((REPO / file).read_text()), (name, target)
