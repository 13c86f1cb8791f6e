"""The live view credits each `_meta` key the proxy wrote to the rule that writes that key, not to
every rule that changed the frame: the keys each rule writes travel in the session's header
(``rule_keys``, in records too)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from proxy_harness import proxy_cmd, run

from acp_proxy.config import parse_config
from acp_proxy.rules.engine import entity_keys_by_rule
from acp_proxy.ui import events
from acp_proxy.ui.entities import EntityView

A2C = "agent_to_client"
RULES = """\
rules:
  - name: route
    set_meta: {x.dev/route: edge}
    remove_meta: [x.dev/debug]
  - name: host
    set_meta: {x.dev/host: h}
  - name: stamp
    target: message
    set_meta: {x.dev/proxy: acp-proxy}
"""


def update(meta: object) -> dict[str, Any]:
    body = {"sessionUpdate": "tool_call_update", "toolCallId": "c", "_meta": meta}
    return {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {"sessionId": "s", "update": body},
    }


def fed(view: EntityView) -> dict[str, Any]:
    sent = update({"a": 1, "x.dev/route": "edge", "x.dev/host": "h", "x.dev/audit": 1})
    line: Any = {
        "t": 0,
        "dir": A2C,
        "raw": orjson.dumps(update({"a": 1})).decode(),
        "sent": [orjson.dumps(sent).decode()],
        "changed_by": ["rules:route", "rules:host", "rules:stamp", "audit"],
    }
    view.feed(events.StreamBuilder().line(1, line))
    entities: Any = view.snapshot()["entities"]
    [entity] = entities
    return dict(entity)


def test_the_keys_each_rule_writes_on_entities() -> None:
    config = parse_config(RULES, "c.yaml", {})
    assert entity_keys_by_rule(config.rules) == {
        "route": ["x.dev/debug", "x.dev/route"],
        "host": ["x.dev/host"],
    }


def test_each_key_is_credited_to_the_rule_that_writes_it() -> None:
    header: Any = {"rule_keys": {"route": ["x.dev/debug", "x.dev/route"], "host": ["x.dev/host"]}}
    got = fed(EntityView.for_header(header))
    assert got["injected"] == {
        "x.dev/route": ["rules:route"],
        "x.dev/host": ["rules:host"],
        "x.dev/audit": ["audit"],  # no rule writes it: the other middleware did
    }
    assert [(h["key"], h["by"], h["rules"]) for h in got["history"]] == [
        ("a", "agent", []),
        ("x.dev/route", "proxy", ["rules:route"]),
        ("x.dev/host", "proxy", ["rules:host"]),
        ("x.dev/audit", "proxy", ["audit"]),
    ]


def test_without_the_rules_keys_every_rule_that_changed_the_frame_is_named() -> None:
    # A record written before the header named them: who wrote which key is not known.
    every = ["rules:route", "rules:host", "rules:stamp", "audit"]
    headers: list[Any] = [{}, {"rule_keys": "not a mapping"}, {"rule_keys": {"route": [1]}}]
    for header in headers:
        got = fed(EntityView.for_header(header))
        assert got["injected"] == {"x.dev/route": every, "x.dev/host": every, "x.dev/audit": every}


@pytest.mark.anyio
async def test_the_record_header_names_the_keys_each_rule_writes(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(RULES, encoding="utf-8")
    record = tmp_path / "r.jsonl"
    ran = await run(
        proxy_cmd("--log-level", "error", "--config", str(config), "--record", str(record))
    )
    assert ran.rc == 0
    header = json.loads(record.read_bytes().splitlines()[0])
    assert (header["rules"], header["rule_keys"]) == (
        ["route", "host", "stamp"],
        {"route": ["x.dev/debug", "x.dev/route"], "host": ["x.dev/host"]},
    )
