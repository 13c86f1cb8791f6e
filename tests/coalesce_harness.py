"""The client's view of a stream, as the coalescing tests compare it."""

from __future__ import annotations

import base64
import binascii
import decimal
import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from acp_proxy.base.jsontypes import JsonObject
from acp_proxy.meta.state import ClientModel

# The random streaming agent of the paused-client tests (only the standard library).
RANDOM_AGENT = Path(__file__).parent / "random_stream_agent.py"


def normalized(state: dict[str, Any]) -> dict[str, Any]:
    """The client's view: adjacent bare text blocks read as one text, terminal output as bytes.

    The ClientModel keeps each chunk as its own item; a client renders consecutive plain text
    blocks as one text and terminal output as one byte stream, the equivalence the coalescer
    keeps ("plain text blocks with no _meta or annotations; base64 terminal data decoded,
    joined").
    """
    for entity in state["entities"].values():
        for name in ("content", "summary"):
            blocks = entity["fields"].get(name)
            if isinstance(blocks, list):
                joined: list[Any] = []
                for block in blocks:
                    plain = (
                        isinstance(block, dict)
                        and block.keys() == {"type", "text"}
                        and block["type"] == "text"
                    )
                    if (
                        plain
                        and joined
                        and isinstance(joined[-1], dict)
                        and joined[-1].keys() == {"type", "text"}
                        and joined[-1]["type"] == "text"
                    ):
                        joined[-1] = {"type": "text", "text": joined[-1]["text"] + block["text"]}
                    else:
                        joined.append(block)
                entity["fields"][name] = joined
        output = entity["appended"].get("output")
        if output is not None:
            stream: list[Any] = []
            for data in output:
                try:
                    decoded = (
                        base64.b64decode(data, validate=True) if isinstance(data, str) else None
                    )
                except (binascii.Error, ValueError):
                    decoded = None
                if decoded is not None and stream and isinstance(stream[-1], bytes):
                    stream[-1] += decoded
                else:
                    stream.append(decoded if decoded is not None else data)
            entity["appended"]["output"] = stream
    return state


def reduce(
    frames: list[bytes], version: int, only: Callable[[JsonObject], bool] | None = None
) -> dict[str, Any]:
    model = ClientModel(version)
    for raw in frames:
        for message in messages_of(raw):
            if only is None or only(message):
                model.apply(message)
    return normalized(model.snapshot())


def messages_of(raw: bytes) -> list[JsonObject]:
    # An exact parse: a merge that respelled a number would change the state.
    value = json.loads(raw, parse_float=decimal.Decimal)
    return value if isinstance(value, list) else [value]


def random_agent_stream(seed: int, updates: int) -> list[bytes]:
    """The lines ``random_stream_agent.py --seed seed --updates updates`` writes after its
    answer to ``initialize`` (each without its newline)."""
    spec = importlib.util.spec_from_file_location("random_stream_agent", RANDOM_AGENT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    lines: list[bytes] = module.stream(seed, updates)
    return lines


def v2_client_state(lines: list[bytes]) -> dict[str, Any]:
    """What a v2 client shows after ``lines`` (adjacent plain texts read as one)."""
    model = ClientModel(2)
    for line in lines:
        model.apply(orjson.loads(line))
    return normalized(model.snapshot())
