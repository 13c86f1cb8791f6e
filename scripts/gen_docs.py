"""Regenerate what the docs derive from code: the settings table and the list of checks across
keys of docs/configuration.md, and config/acp-proxy.schema.json, from the declarations
(``SETTINGS``, the rule and middleware fields, ``config.checks``).

Usage: ``python scripts/gen_docs.py`` (rewrites the files), ``--check`` (exit 1 if stale).
The tests fail on a stale copy; this is how to refresh it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from acp_proxy.config import checks_text, json_schema, settings_table

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "configuration.md"
SCHEMA = REPO / "config" / "acp-proxy.schema.json"
HEAD = "## Settings\n\n"
CHECKS_HEAD = "**Checked across keys**"


def main(argv: list[str]) -> int:
    doc = DOC.read_text(encoding="utf-8")
    start = doc.index(HEAD) + len(HEAD)
    end = doc.index("\n\n", start)
    new_doc = doc[:start] + settings_table() + doc[end:]
    start = new_doc.index("\n\n", new_doc.index(CHECKS_HEAD)) + 2
    end = new_doc.index("\n\n", start)
    new_doc = new_doc[:start] + checks_text() + new_doc[end:]
    new_schema = json.dumps(json_schema(), indent=2, ensure_ascii=False) + "\n"
    stale = [
        str(path.relative_to(REPO))
        for path, text in ((DOC, new_doc), (SCHEMA, new_schema))
        if path.read_text(encoding="utf-8") != text
    ]
    if "--check" in argv:
        for name in stale:
            print(f"{name} is stale: run python scripts/gen_docs.py", file=sys.stderr)
        return 1 if stale else 0
    DOC.write_text(new_doc, encoding="utf-8")
    SCHEMA.write_text(new_schema, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
