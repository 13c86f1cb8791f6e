"""Every recipe of docs/cookbook.md, run: its YAML is loaded as a config file, and its "before"
message goes through the proxy's own pipeline (after a v2 `initialize`), which must write exactly
the "after" bytes the page shows."""

from __future__ import annotations

import re

import orjson
import pytest
from acp_schema import validate_v2, validate_v2_message
from proxy_harness import REPO

from acp_proxy.config import parse_config
from acp_proxy.wire.chain import Direction
from acp_proxy.wire.connection.pipeline import Connection
from acp_proxy.wire.framing import Line

PAGE = (REPO / "docs" / "cookbook.md").read_text("utf-8")
INIT = (
    b'{"jsonrpc":"2.0","id":0,"method":"initialize",'
    b'"params":{"protocolVersion":2,"clientCapabilities":{}}}'
)
INIT_OK = (
    b'{"jsonrpc":"2.0","id":0,"result":'
    b'{"protocolVersion":2,"agentCapabilities":{},"authMethods":[]}}'
)


def _recipes() -> dict[str, tuple[str, Direction, bytes, list[bytes]]]:
    found = {}
    sections = re.split(r"\n## ", PAGE)
    for section in sections:
        yaml = re.search(r"```yaml\n# recipe: (\w+)\n(.*?)```", section, re.S)
        if yaml is None:
            continue
        blocks = re.findall(
            r"\n(From the \w+|To the \w+)[^\n]*\n\n```json\n(.*?)```", section, re.S
        )
        (sender, before), (_, after) = blocks
        direction = (
            Direction.AGENT_TO_CLIENT if sender == "From the agent" else Direction.CLIENT_TO_AGENT
        )
        found[yaml.group(1)] = (
            yaml.group(2),
            direction,
            before.strip().encode(),
            [line.encode() for line in after.strip().splitlines()],
        )
    return found


RECIPES = _recipes()


def test_every_recipe_is_found() -> None:
    assert sorted(RECIPES) == ["clear", "order", "prompt", "remove", "route", "upserts"]


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipe_does_what_the_page_says(name: str) -> None:
    text, direction, before, after = RECIPES[name]
    config = parse_config(text, f"{name}.yaml", {})
    conn = Connection(config.build_chain())
    conn.handle(Direction.CLIENT_TO_AGENT, Line(INIT))
    conn.handle(Direction.AGENT_TO_CLIENT, Line(INIT_OK))
    assert conn.version == 2
    result = conn.handle(direction, Line(before))
    assert result.reply == ()
    assert [frame.raw for frame in result.forward] == after
    for raw in (before, *after):  # real ACP v2, both sides of the page
        message = orjson.loads(raw)
        if message["method"] == "session/prompt":
            validate_v2("PromptRequest", message["params"])
        else:
            validate_v2_message(message)
