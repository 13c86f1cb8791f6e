"""The options several commands share (``acp_proxy.cli.flags``): one definition each, so an
option parses the same in every command that takes it."""

from __future__ import annotations

import argparse
import re

import pytest

from acp_proxy.cli import flags
from acp_proxy.cli.options import build_parser
from acp_proxy.shell import component, replay, show

PARSERS = {
    "acp-proxy": build_parser,
    "component": component.build_parser,
    "replay": replay.build_parser,
    "show": show.build_parser,
}


def _shape(action: argparse.Action) -> tuple[object, ...]:
    """How an option parses (not its help or default, which a command may say its own way)."""
    return (type(action).__name__, action.dest, action.type, action.choices, action.metavar)


def test_an_option_of_several_commands_parses_the_same_in_each() -> None:
    seen: dict[str, dict[str, tuple[object, ...]]] = {}
    for command, make in PARSERS.items():
        for action in make()._actions:
            for option in action.option_strings:
                seen.setdefault(option, {})[command] = _shape(action)
    shared = {option: shapes for option, shapes in seen.items() if len(shapes) > 1}
    assert sorted(shared) == [
        "--config",
        "--help",
        "--log-file",
        "--log-format",
        "--log-frames",
        "--log-level",
        "--max-frame-bytes",
        "--metrics",
        "--middleware-path",
        "--record",
        "--session",
        "--ui",
        "-h",
    ]
    for option, shapes in shared.items():
        assert len(set(shapes.values())) == 1, (option, shapes)


@pytest.mark.parametrize(
    ("text", "value"), [("65536", 65536), ("64k", 64 * 1024), ("64MiB", 64 * 1024 * 1024)]
)
def test_max_frame_bytes_takes_a_size_in_every_command(text: str, value: int) -> None:
    for make in (build_parser, component.build_parser):
        assert make().parse_known_args(["--max-frame-bytes", text])[0].max_frame_bytes == value
    assert replay.build_parser().parse_args(["f", "--max-frame-bytes", text]).max_frame_bytes == (
        value
    )


@pytest.mark.parametrize(
    ("kind", "text", "message"),
    [
        (flags.size, "0", "must be positive: '0'"),
        (flags.size, "lots", "not a size: 'lots'"),
        (flags.positive_int, "1.5", "not an integer: '1.5'"),
        (flags.positive_int, "-1", "must be positive: '-1'"),
        (flags.positive_float, "inf", "must be a positive number of seconds: 'inf'"),
        (flags.positive_float, "x", "not a number: 'x'"),
    ],
)
def test_refused_values(kind: object, text: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="^" + re.escape(message)):
        kind(text)  # type: ignore[operator]


def test_component_refuses_a_frame_size_that_is_not_one(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        component.build_parser().parse_args(["--max-frame-bytes", "0"])
    assert exited.value.code == 2
    assert "--max-frame-bytes: must be positive: '0'" in capsys.readouterr().err
