"""``python -m acp_proxy``: the same command as ``acp-proxy``."""

from __future__ import annotations

import sys

from acp_proxy.cli import main

if __name__ == "__main__":
    sys.exit(main())
