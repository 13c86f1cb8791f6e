"""The live view page's own code, run by node: the header's counts ("frames" counts the frames
received, "shown" the frames the filters show, so "shown" is never above "frames"; rows that
are not frames, such as a session start or the end, count in neither), and the marks of the
policy's decisions on a frame."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

PAGE_PATH = Path(__file__).resolve().parent.parent / "acp_proxy" / "ui" / "page.html"

START, END = "// -- the header's counts ", "// -- end of the header's counts"


def counts(events: list[dict[str, object]], shown: list[int]) -> dict[str, int]:
    page = PAGE_PATH.read_text(encoding="utf-8")
    code = page[page.index(START) : page.index(END)]
    script = (
        code
        + f"\nconst events = {json.dumps(events)};\nconst shown = {json.dumps(shown)};\n"
        + "console.log(JSON.stringify({frames: events.filter(isFrame).length, "
        + "shown: countFrames(events, shown)}));\n"
    )
    node = shutil.which("node")
    assert node is not None, "node runs the page's code (CI installs it)"
    done = subprocess.run([node, "-e", script], capture_output=True, timeout=30, check=True)
    result: dict[str, int] = json.loads(done.stdout)
    return result


EVENTS: list[dict[str, object]] = [
    {"seq": 1, "event": "session", "conn": 1},
    {"seq": 2, "event": "version", "protocolVersion": 2},
    {"seq": 3, "dir": "client_to_agent", "raw": "{}"},
    {"seq": 4, "dir": "agent_to_client", "raw": "{}"},
    {"seq": 5, "event": "coalesced", "direction": "agent_to_client", "frames": 3},
    {"seq": 6, "event": "end"},
]


def test_shown_counts_the_frames_among_the_rows_shown() -> None:
    assert counts(EVENTS, [0, 1, 2, 3, 4, 5]) == {"frames": 2, "shown": 2}  # no filter
    assert counts(EVENTS, [3]) == {"frames": 2, "shown": 1}
    assert counts(EVENTS, [4]) == {"frames": 2, "shown": 0}  # a merge row: not a frame


def test_a_frame_is_marked_with_the_policy_s_decisions() -> None:
    page = PAGE_PATH.read_text(encoding="utf-8")
    code = page[page.index("// -- policy marks") : page.index("// -- end of policy marks")]
    decisions = [
        {"rule": "no-secrets", "decision": "deny", "forwarded": False, "mode": "enforce"},
        {"rule": None, "decision": "ask", "forwarded": True, "mode": "enforce"},
        {"rule": "no-rm", "decision": "deny", "forwarded": True, "mode": "monitor"},
        {"rule": "reads", "decision": "allow", "forwarded": False, "mode": "enforce"},
        {"rule": "no-rm", "decision": "deny", "unasked": True, "cancelled": True},
        {"rule": "no-rm", "decision": "deny", "unasked": True},
    ]
    script = code + f"\nconsole.log(JSON.stringify({json.dumps(decisions)}.map(policyMark)));\n"
    node = shutil.which("node")
    assert node is not None, "node runs the page's code (CI installs it)"
    done = subprocess.run([node, "-e", script], capture_output=True, timeout=30, check=True)
    assert json.loads(done.stdout) == [
        ["policy-deny", "policy deny (no-secrets)"],
        ["policy-ask", "policy ask (default)"],
        ["policy-deny", "policy deny (no-rm) · monitor"],
        ["policy-allow", "policy allow (reads)"],
        ["policy-unasked", "unasked: no-rm · cancelled"],
        ["policy-unasked", "unasked: no-rm"],
    ]


def test_the_page_s_scripts_parse() -> None:
    """Every script of the page parses (two features once declared one name twice, and the whole
    page stopped; only the browser tests saw it)."""
    import re

    page = PAGE_PATH.read_text(encoding="utf-8")
    scripts = re.findall(r"<script[^>]*>(.*?)</script>", page, re.S)
    assert scripts
    node = shutil.which("node")
    assert node is not None, "node parses the page's code (CI installs it)"
    for script in scripts:
        done = subprocess.run(
            [node, "--check", "-"], input=script.encode(), capture_output=True, check=False
        )
        assert done.returncode == 0, done.stderr.decode()
