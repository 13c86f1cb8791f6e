"""The command line's options: the argparse parser, the fast path that reads common options
without it, and applying the socket options to the config.

Contract: owns the spelling of every option of the main command (``build_parser``), what each
means for the config (``socket_options``), the usage errors (exit 2), and the fast path
(``fast_options``) that gives exactly what the parser would for the options an editor's command
line usually holds. It never loads a config file and never starts anything; argparse is
imported only when the fast path declines.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import TYPE_CHECKING, NoReturn

from acp_proxy import __version__
from acp_proxy.cli.flags import LOG_FORMATS, LOG_LEVELS

if TYPE_CHECKING:
    import argparse

    from acp_proxy.config import Config

EXIT_USAGE = 2  # argparse's own code for usage errors; also used for config errors
CONFIG_ENV = "ACP_PROXY_CONFIG"

_EPILOG = f"""\
commands:
  acp-proxy [OPTIONS] -- AGENT_CMD [ARG...]   run AGENT_CMD behind the proxy (stdio)
  acp-proxy check-config FILE                 validate FILE and explain what it does
  acp-proxy schema                            print the JSON schema of the config file
  acp-proxy demo                              bundled rules between a scripted client and agent
  acp-proxy show FILE                         a record (--record PATH) as a transcript
  acp-proxy replay FILE                       act as the agent of a record, on stdio
  acp-proxy ui FILE...                        the live view (a web page) over records
  acp-proxy component [OPTIONS]               a proxy component of an ACP conductor's chain
  acp-proxy audit verify FILE                 check a policy audit file's hash chain
  acp-proxy policy test --config FILE RECORD...  what a policy would decide on recorded sessions
  acp-proxy [OPTIONS] --listen URL -- AGENT_CMD  clients on a socket, one AGENT_CMD per connection
  acp-proxy [OPTIONS] --connect URL              client on stdio, the agent at a socket address

examples:
  acp-proxy -- my-agent --acp
  acp-proxy --config rules.yaml --log-level debug -- npx -y @agentclientprotocol/claude-agent-acp
  {CONFIG_ENV}=rules.yaml acp-proxy --log-format json --log-file proxy.log -- my-agent
  acp-proxy check-config rules.yaml
  acp-proxy --record session.jsonl -- my-agent --acp && acp-proxy show session.jsonl
  acp-proxy --listen tcp://127.0.0.1:7777 -- my-agent --acp
  acp-proxy --listen unix:///run/acp/acp.sock --max-connections 8 -- my-agent
  acp-proxy --connect tcp://127.0.0.1:7777 --connect-timeout 5
  acp-proxy --metrics tcp://127.0.0.1:9464 -- my-agent --acp

Without a config (no --config, no ${CONFIG_ENV}) the proxy is a pure pass-through.
stdout carries the protocol; logs go to stderr or --log-file.
exit codes: the agent's exit code (128+N if signal N ended it); 126 agent not executable;
127 agent not found; 2 usage or configuration error. --listen exits 0 after SIGINT/SIGTERM
and 1 when it cannot listen; --connect exits 1 when the agent's address cannot be reached or
the connection is lost (requests in flight get -32603 errors first).
"""


def build_parser() -> argparse.ArgumentParser:
    """The parser of the main command (options before ``--``)."""
    import argparse

    from acp_proxy.cli import flags
    from acp_proxy.wire.scan import SCANNER

    parser = argparse.ArgumentParser(
        prog="acp-proxy",
        usage="acp-proxy [OPTIONS] -- AGENT_CMD [ARG...]\n"
        "       acp-proxy [OPTIONS] --connect URL\n"
        "       acp-proxy check-config FILE\n"
        "       acp-proxy schema\n"
        "       acp-proxy demo\n"
        "       acp-proxy show FILE\n"
        "       acp-proxy replay FILE\n"
        "       acp-proxy ui FILE...\n"
        "       acp-proxy component [OPTIONS]\n"
        "       acp-proxy audit verify FILE\n"
        "       acp-proxy policy test --config FILE RECORD...",
        description="A sidecar proxy for the Agent Client Protocol: streams ACP between an "
        "editor (stdin/stdout) and the agent it spawns, through a YAML-configured "
        "middleware chain.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # Which block scanner is active (the optional C accelerator, or why not).
    parser.add_argument(
        "-V", "--version", action="version", version=f"acp-proxy {__version__}\nscanner: {SCANNER}"
    )
    flags.add(
        parser, "--config", f"rules file (YAML); default ${CONFIG_ENV}, else pure pass-through"
    )
    flags.add_log_options(
        parser,
        level=None,
        level_help="debug logs one line per frame (default: info; warning when the log is the "
        "console on stderr of a session whose stdout is the protocol, which editors show)",
    )
    parser.add_argument(
        "--agent-stderr",
        choices=("log", "passthrough"),
        help="the agent's stderr: into the structured log, or to the proxy's stderr as it "
        "is; overrides agent.stderr",
    )
    flags.add(
        parser,
        "--max-frame-bytes",
        "longest accepted line: bytes, or a size such as 64MiB, 64mb, 64k; overrides the "
        "config (default 64MiB)",
    )
    # Recording.
    flags.add(
        parser,
        "--record",
        "append every frame of the session, both directions, to PATH (JSON Lines, secrets "
        "redacted); with --listen a directory or a name with {conn}; overrides record.path",
    )
    # Socket transports; each overrides the config file's key of the same name.
    sockets = parser.add_argument_group(
        "sockets",
        "NDJSON over TCP or Unix sockets (ACP itself defines only stdio). URL: "
        "tcp://HOST:PORT, tcp://[IPV6]:PORT or unix:///ABSOLUTE/PATH",
    )
    sockets.add_argument(
        "--listen",
        metavar="URL",
        help="accept clients on URL instead of stdin/stdout; one agent per connection "
        "(loopback only unless --allow-remote)",
    )
    sockets.add_argument(
        "--connect",
        metavar="URL",
        help="reach the agent at URL instead of spawning AGENT_CMD (then no AGENT_CMD)",
    )
    sockets.add_argument(
        "--allow-remote",
        action="store_true",
        default=None,
        help="let --listen bind a non-loopback address (traffic is unauthenticated and "
        "unencrypted)",
    )
    sockets.add_argument(
        "--max-connections",
        type=flags.positive_int,
        metavar="N",
        help="with --listen: sessions at once; more are refused (default 64)",
    )
    sockets.add_argument(
        "--connect-timeout",
        type=flags.positive_float,
        metavar="SECONDS",
        help="with --connect: how long to wait for the agent's address (default 10)",
    )
    sockets.add_argument(
        "--handshake-timeout",
        type=flags.positive_float,
        metavar="SECONDS",
        help="with --listen: close a connection whose first request has not arrived by then "
        "(default 30)",
    )
    sockets.add_argument(
        "--detach-grace",
        type=flags.non_negative_float,
        metavar="SECONDS",
        help="with --listen: keep an agent this long after its client's connection ended, for a "
        "reattach with session/load (default 0: stop it)",
    )
    flags.add(
        parser,
        "--middleware-path",
        "search DIR first for the modules of the config's use: entries (repeatable; adds to "
        "middleware_paths:); PYTHONPATH does not reach a proxy installed with pipx",
    )
    telemetry = parser.add_argument_group("telemetry")
    flags.add(
        telemetry,
        "--metrics",
        "serve /metrics (Prometheus), /healthz and /readyz at URL, e.g. 127.0.0.1:9464, "
        "http://127.0.0.1:9464 or tcp://127.0.0.1:9464 (loopback only unless "
        "--metrics-allow-remote)",
    )
    telemetry.add_argument(
        "--metrics-allow-remote",
        action="store_true",
        default=None,
        help="let --metrics bind a non-loopback address (anyone who can reach it can read the "
        "metrics; --allow-remote does not cover it)",
    )
    flags.add(
        telemetry,
        "--ui",
        "serve the live view (a web page of the session's frames and entities, and its event "
        "stream) at URL, in the forms of --metrics but TCP only, e.g. 127.0.0.1:0 or "
        "tcp://127.0.0.1:0 (port 0: a free one); prints its address with an access token to "
        "stderr (loopback only unless --ui-allow-remote)",
    )
    telemetry.add_argument(
        "--ui-allow-remote",
        action="store_true",
        default=None,
        help="let --ui bind a non-loopback address (its token still guards every request; "
        "--allow-remote does not cover it)",
    )
    return parser


def socket_options(
    parser: argparse.ArgumentParser | None,
    args: argparse.Namespace | SimpleNamespace,
    config: Config,
) -> Config:
    """The config with the socket flags applied (the command line wins over the file), the
    addresses checked (usage error, exit 2, before anything is spawned or bound)."""
    changes: dict[str, object] = {}
    for flag, key in (
        ("listen", "listen"),
        ("connect", "connect"),
        ("allow_remote", "allow_remote"),
        ("max_connections", "max_connections"),
        ("connect_timeout", "connect_timeout_s"),
        ("handshake_timeout", "handshake_timeout_s"),
        ("detach_grace", "detach_grace_s"),
        ("metrics", "metrics"),
        ("metrics_allow_remote", "metrics_allow_remote"),
    ):
        value = getattr(args, flag, None)
        if value is not None:
            changes[key] = value
    if changes.get("metrics") is not None:
        from acp_proxy.telemetry.endpoint import endpoint_url

        changes["metrics"] = endpoint_url(str(changes["metrics"]))
    if changes:
        import dataclasses

        config = dataclasses.replace(config, **changes)  # type: ignore[arg-type]
    for key, listen in (("listen", True), ("connect", False), ("metrics", True)):
        url = getattr(config, key)
        if url is not None:
            # Imported only here: stdio mode never loads the socket layer (start-up time).
            from acp_proxy.shell.sockets.address import AddressError, parse_address

            try:
                parse_address(url, listen=listen)
            except AddressError as exc:
                usage_error(parser, f"--{key}: {exc}")
    return config


SUBCOMMANDS = (
    "check-config",
    "schema",
    "demo",
    "show",
    "replay",
    "component",
    "ui",
    "audit",
    "policy",
)


def refuse_misspelled_command(parser: argparse.ArgumentParser, word: str) -> None:
    """``acp-proxy check-conifg x.yaml`` or ``acp-proxy shwo x`` is a typo, not an agent to
    run: refuse it (exit 2) when the word is close to a subcommand (one edit away, or alike by
    difflib's measure) and no executable of that name is on PATH (running it would only fail
    with "command not found"). ``--`` before it says it is the agent's command, and is never
    refused."""
    if word in SUBCOMMANDS:
        parser.error(
            f'"{word}" must come first (acp-proxy {word} ...); to run an agent named {word}, '
            "put -- before it"
        )
    import difflib  # only for a word that is not an option (start-up time)

    close = [c for c in SUBCOMMANDS if one_edit_apart(word, c)]
    close = close or difflib.get_close_matches(word, SUBCOMMANDS, n=1, cutoff=0.8)
    if close:
        import shutil

        if shutil.which(word) is not None:
            return
        parser.error(
            f'unknown command "{word}"; did you mean {close[0]}? (to run an agent named '
            f"{word}, put -- before it)"
        )


def one_edit_apart(a: str, b: str) -> bool:
    """Whether ``b`` is ``a`` with exactly one letter added, left out, replaced, or two
    neighbouring letters swapped."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    start = 0
    while start < min(len(a), len(b)) and a[start] == b[start]:
        start += 1
    if len(a) == len(b):
        swapped = a[start : start + 2][::-1] == b[start : start + 2]
        return a[start + 1 :] == b[start + 1 :] or (swapped and a[start + 2 :] == b[start + 2 :])
    longer, shorter = (a, b) if len(a) > len(b) else (b, a)
    return longer[start + 1 :] == shorter[start:]


# Start-up time: the options an editor's command line usually holds are read without
# argparse (importing it and building the parser cost more than everything else the command line
# does). Only exact spellings are taken here; anything else (an abbreviation, a value starting
# with "-", -h, -V, the numeric options, a bare AGENT_CMD without --, a value outside the
# choices) goes to argparse, which reports every error. tests/test_cli.py checks that both
# give the same values.
_FAST_VALUES: dict[str, tuple[str, tuple[str, ...] | None]] = {
    "--config": ("config", None),
    "--log-level": ("log_level", LOG_LEVELS),
    "--log-format": ("log_format", LOG_FORMATS),
    "--log-file": ("log_file", None),
    "--agent-stderr": ("agent_stderr", ("log", "passthrough")),
    "--record": ("record", None),
    "--listen": ("listen", None),
    "--connect": ("connect", None),
    "--metrics": ("metrics", None),
    "--ui": ("ui", None),
}
_FAST_FLAGS = {
    "--log-frames": "log_frames",
    "--allow-remote": "allow_remote",
    "--metrics-allow-remote": "metrics_allow_remote",
    "--ui-allow-remote": "ui_allow_remote",
}
# build_parser's defaults, one per destination.
DEFAULTS: dict[str, object] = {
    "config": None,
    "log_level": None,  # not given: ``log_level_of`` decides
    "log_format": "console",
    "log_file": None,
    "log_frames": False,
    "agent_stderr": None,
    "max_frame_bytes": None,
    "middleware_path": None,
    "record": None,
    "listen": None,
    "connect": None,
    "allow_remote": None,
    "max_connections": None,
    "connect_timeout": None,
    "handshake_timeout": None,
    "detach_grace": None,
    "metrics": None,
    "metrics_allow_remote": None,
    "ui": None,
    "ui_allow_remote": None,
}


def fast_options(options: Sequence[str]) -> SimpleNamespace | None:
    """What ``build_parser().parse_known_args(options)`` returns (with no extra arguments), or
    ``None`` when ``options`` need argparse itself."""
    values = dict(DEFAULTS)
    i = 0
    while i < len(options):
        name, eq, inline = options[i].partition("=")
        if name in _FAST_FLAGS and not eq:
            values[_FAST_FLAGS[name]] = True
            i += 1
            continue
        if name not in _FAST_VALUES:
            return None
        if eq:
            value, i = inline, i + 1
        elif i + 1 < len(options):
            value, i = options[i + 1], i + 2
        else:
            return None
        if value.startswith("-"):
            return None
        dest, choices = _FAST_VALUES[name]
        if dest == "log_level":
            value = value.lower()  # the option's type=str.lower
        if choices is not None and value not in choices:
            return None
        values[dest] = value
    return SimpleNamespace(**values)


def search_middleware_paths(
    parser: argparse.ArgumentParser | None, directories: Sequence[str] | None
) -> None:
    """``--middleware-path DIR`` (relative to the working directory): searched first for the
    config's ``use:`` modules; one that is not a directory is a usage error (exit 2)."""
    if not directories:
        return
    import os

    for given in directories:
        if not os.path.isdir(given):
            usage_error(parser, f"--middleware-path {given}: not a directory")
    from acp_proxy.config.imports import search_first

    search_first([os.path.abspath(d) for d in directories])


# The usage errors said (their messages), for the command line to pass on to the log and the
# editor (``refuse``) after argparse printed them.
USAGE_ERRORS: list[str] = []


def log_level_of(args: argparse.Namespace | SimpleNamespace, listen: bool) -> str:
    """The log level: ``--log-level`` when given; else ``warning`` when the log is the console
    on stderr and stdout is the protocol (stdio, ``--connect``): an editor shows that stderr,
    and the agent's own words must not be buried under the proxy's start and exit lines;
    else ``info`` (a ``--log-file``, the JSON log a machine reads, a ``--listen`` daemon)."""
    if args.log_level is not None:
        return str(args.log_level)
    if args.log_file or args.log_format == "json" or listen:
        return "info"
    return "warning"


def usage_error(parser: argparse.ArgumentParser | None, message: str) -> NoReturn:
    """argparse's usage error (exit 2), building the parser if the fast path skipped it."""
    USAGE_ERRORS.append(message)
    (parser or build_parser()).error(message)


# The options that leave a stdio session nothing to refuse after the agent started: every
# other option keeps its default.
_PLAIN_OPTIONS = frozenset(("log_level", "log_format", "log_frames"))


def plain_stdio(args: argparse.Namespace | SimpleNamespace) -> bool:
    """No option but ``--log-level``, ``--log-format`` and ``--log-frames`` was given."""
    return all(
        getattr(args, dest) == default
        for dest, default in DEFAULTS.items()
        if dest not in _PLAIN_OPTIONS
    )


def load_or_report(
    path: str | None, *, instantiate: bool = True, said: list[str] | None = None
) -> Config | None:
    """The config file at ``path`` (None: the built-in pass-through), or None after printing
    why it is refused: every mistake of the file as ``acp-proxy: FILE:LINE: ...``, or the reason
    it cannot be read (each message also appended to ``said``). What every command that takes
    a config file does first."""
    import os
    import sys

    from acp_proxy.config import ConfigError, load_config

    messages: list[str] = []
    try:
        return load_config(path, os.environ, instantiate=instantiate)
    except ConfigError as exc:
        messages = list(exc.messages())  # every mistake of the file, one line each
    except OSError as exc:
        messages = [f"{path}: {exc.strerror or exc}"]
    for message in messages:
        print(f"acp-proxy: {message}", file=sys.stderr)
    if said is not None:
        said.extend(messages)
    return None
