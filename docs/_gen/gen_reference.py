"""mkdocs-gen-files: append the generated settings and CLI references to their pages."""

from __future__ import annotations

import sys
from pathlib import Path

import mkdocs_gen_files

sys.path.insert(0, str(Path(__file__).parent))
import reference  # noqa: E402

for page, text in (("reference/settings.md", reference.settings_markdown()),
                   ("reference/cli.md", reference.cli_markdown())):
    with mkdocs_gen_files.open(page, "a") as out:
        out.write("\n" + text)
