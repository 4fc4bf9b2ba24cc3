"""MkDocs hook: the pages keep links that work on GitHub (``../examples/digits.py``,
``../README.md#exit-codes``), and the site resolves them.

- A link to a file of the repository outside docs/ (a script, a recipe, a test) is served from
  the site's ``_repo/`` folder, a copy of that file made at build time.
- A link to a heading of the README (``../README.md#a-run-survives-its-machine``: the README
  was the manual once) goes to the page that holds that heading now.
- The docstrings on the Python API page name things with Sphinx's roles (``:func:`init```,
  ``:class:`~prudent.kernel.stop.StopReason```); the page shows the name alone, as code.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROLE = re.compile(r":(?:func|meth|class|attr|exc|mod|data|obj):(<code>)~?")
LINK = re.compile(r"\]\(([^)\s#]+)(#[^)\s]*)?\)")
HEADING = re.compile(r"^#{1,6} +(.+?) *#*$", re.M)
REPO_COPY = "_repo"
_anchors: dict[str, str] = {}  # heading id -> src_uri of the page that holds it


def _anchor(title: str) -> str:
    text = re.sub(r"[^\w\s-]", "", title.replace("`", "")).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _repo_path(src_uri: str, target: str, docs_dir: Path) -> str | None:
    """The link's path from the repository's root when it leaves docs/, else None."""
    joined = posixpath.normpath(posixpath.join("docs", posixpath.dirname(src_uri), target))
    if joined.startswith(("docs/", "..")) or "://" in target:
        return None
    return joined


def on_files(files: Files, config: Any) -> Files:
    docs_dir = Path(config["docs_dir"])
    root = docs_dir.parent
    _anchors.clear()
    wanted: set[str] = set()
    for page in files.documentation_pages():
        text = page.content_string
        for title in HEADING.findall(re.sub(r"```.*?```", "", text, flags=re.S)):
            _anchors.setdefault(_anchor(title), page.src_uri)
        for target, _ in LINK.findall(text):
            path = _repo_path(page.src_uri, target, docs_dir)
            if path and not path.endswith(".md") and (root / path).is_file():
                wanted.add(path)
    for path in sorted(wanted):
        files.append(File.generated(config, f"{REPO_COPY}/{path}", abs_src_path=str(root / path)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    src_uri = page.file.src_uri
    here = posixpath.dirname(src_uri)
    docs_dir = Path(config["docs_dir"])

    def rewrite(match: re.Match[str]) -> str:
        target, fragment = match.group(1), match.group(2) or ""
        path = _repo_path(src_uri, target, docs_dir)
        if path is None:
            return match.group(0)
        if path == "README.md":
            dest = _anchors.get(fragment[1:], "index.md") if fragment else "index.md"
        elif path.endswith(".md"):
            return match.group(0)
        else:
            dest = f"{REPO_COPY}/{path}"
        return f"]({posixpath.relpath(dest, here or '.')}{fragment})"

    return LINK.sub(rewrite, markdown)


def on_page_content(html: str, page: Any, config: Any, files: Files) -> str:
    return ROLE.sub(r"\1", html)
