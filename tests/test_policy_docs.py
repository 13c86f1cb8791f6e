"""Every recipe of docs/policy.md, run: its YAML is loaded as a config file, a v1 session is
opened (cwd ``/workspace/project``, agent ``claude-code``), and the frames the page shows go
through the proxy's own pipeline with the policy link, which must answer (or forward) exactly
the bytes the page shows. The page's fixtures are checked against the official v1 schema."""

from __future__ import annotations

import dataclasses
import functools
import re
from pathlib import Path

import orjson
import pytest
from acp_schema import validate_v1

from acp_proxy.config import MiddlewareSpec, parse_config
from acp_proxy.policy.middleware import NAME, PolicyMiddleware
from acp_proxy.wire.chain import Direction
from acp_proxy.wire.framing import Line
from acp_proxy.wire.pipeline import Connection

PAGE = (Path(__file__).resolve().parent.parent / "docs" / "policy.md").read_text("utf-8")
C2A, A2C = Direction.CLIENT_TO_AGENT, Direction.AGENT_TO_CLIENT
OPENING = (
    (C2A, b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1}}'),
    (
        A2C,
        b'{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":1,"agentCapabilities":{},'
        b'"agentInfo":{"name":"claude-code","version":"1.0.0"}}}',
    ),
    (
        C2A,
        b'{"jsonrpc":"2.0","id":1,"method":"session/new",'
        b'"params":{"cwd":"/workspace/project","mcpServers":[]}}',
    ),
    (A2C, b'{"jsonrpc":"2.0","id":1,"result":{"sessionId":"sess_1"}}'),
)
SCHEMAS = {
    "session/update": "SessionNotification",
    "session/request_permission": "RequestPermissionRequest",
    "fs/read_text_file": "ReadTextFileRequest",
    "fs/write_text_file": "WriteTextFileRequest",
    "session/set_mode": "SetSessionModeRequest",
    "session/cancel": "CancelNotification",
}


Recipe = tuple[str, Direction, list[bytes], list[tuple[str, list[bytes]]]]


def _recipes() -> dict[str, Recipe]:
    found = {}
    for section in re.split(r"\n### ", PAGE):
        yaml = re.search(r"```yaml\n# recipe: (\w+)\n(.*?)```", section, re.S)
        if yaml is None:
            continue
        blocks = re.findall(r"\n(From the \w+|The [\w ]+?):\n\n```json\n(.*?)```", section, re.S)
        (sender, before), *outcomes = blocks
        found[yaml.group(1)] = (
            yaml.group(2),
            A2C if sender == "From the agent" else C2A,
            [line.encode() for line in before.strip().splitlines()],
            [
                (what, [line.encode() for line in after.strip().splitlines()])
                for what, after in outcomes
            ],
        )
    return found


RECIPES = _recipes()


def test_every_recipe_is_found() -> None:
    assert sorted(RECIPES) == [
        "cancel", "delete", "modes", "monitor", "reads", "remember", "secrets", "writes",
    ]  # fmt: skip


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipe_does_what_the_page_says(name: str) -> None:
    text, direction, before, outcomes = RECIPES[name]
    config = parse_config(text, f"{name}.yaml", {"HOME": "/home/dev"})
    assert config.policy is not None
    factory = functools.partial(PolicyMiddleware, config.policy, None, lambda path: path)
    config = dataclasses.replace(config, middleware=(MiddlewareSpec(NAME, factory),))
    conn = Connection(config.build_chain())
    for side, frame in OPENING:
        conn.handle(side, Line(frame))
    for frame in before[:-1]:
        conn.handle(direction, Line(frame))
    result = conn.handle(direction, Line(before[-1]))
    # What goes on to the receiver, and what goes back to the sender: each as the page says
    # (nothing where it says nothing).
    sent = {"forward": [f.raw for f in result.forward], "reply": [f.raw for f in result.reply]}
    said: dict[str, list[bytes]] = {"forward": [], "reply": []}
    for what, after in outcomes:
        said["reply" if what.startswith("The proxy") else "forward"] = after
    assert sent == said
    for raw in before + [line for _, after in outcomes for line in after]:
        message = orjson.loads(raw)
        if "method" in message:
            validate_v1(SCHEMAS[message["method"]], message["params"])
