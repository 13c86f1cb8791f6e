"""With the live view off, nothing of it is loaded; with it on, its tap sees the session, and
what describes frames is loaded only when someone looks.

A whole stdio session runs in a child interpreter (``cli.main`` in-process there, so its
``sys.modules`` can be read afterwards); the child prints the modules of the live view it
loaded.
"""

from __future__ import annotations

import subprocess
import sys

import orjson
from proxy_harness import REPO, proxy_env

UI_MODULES = ("acp_proxy.ui", "acp_proxy.shell.ui.")
SCRIPT = """
import sys
from acp_proxy.cli import main
code = main([*sys.argv[1:], "--", sys.executable, "-S", {agent!r}])
loaded = sorted(m for m in sys.modules if m.startswith({prefixes!r}))
print("MODULES", ",".join(loaded), code, file=sys.stderr)
"""


def _session(*options: str) -> tuple[list[str], bytes]:
    script = SCRIPT.format(agent=str(REPO / "tests" / "tiny_agent.py"), prefixes=UI_MODULES)
    request = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 2}}
    ran = subprocess.run(
        [sys.executable, "-c", script, *options],
        input=orjson.dumps(request) + b"\n",
        capture_output=True,
        env=proxy_env(),
        timeout=60,
        check=False,
    )
    line = next(x for x in ran.stderr.decode().splitlines() if x.startswith("MODULES"))
    _, modules, code = line.split(" ")
    assert code == "0", ran.stderr.decode()
    return [m for m in modules.split(",") if m], ran.stdout


def test_nothing_of_the_live_view_is_imported_when_it_is_off() -> None:
    modules, out = _session()
    assert modules == []
    assert orjson.loads(out)["result"]["protocolVersion"] == 2


def test_the_live_view_is_imported_when_on() -> None:
    modules, out = _session("--ui", "tcp://127.0.0.1:0")
    assert "acp_proxy.shell.ui.live_server" in modules
    assert "acp_proxy.shell.ui.tap" in modules
    # Nobody looked: no entity view was made, its module (and the client model) not loaded.
    assert "acp_proxy.ui.entities" not in modules
    assert orjson.loads(out)["result"]["protocolVersion"] == 2
