"""The command line: parse arguments, load the config up front, run the proxy, map exit codes.

Contract: owns the ``acp-proxy`` command surface (issue 3, "Command line") and the process exit
code. Configuration is validated completely before the agent is spawned (style.md habit 5); a
bad config exits 2 with every error of the file on stderr. Never writes to stdout except for
``--help``, ``--version``, ``check-config``, ``schema`` and ``show`` (no protocol is running
then), and ``replay``, whose stdout is the protocol of the agent it plays.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import stat
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import MappingProxyType, SimpleNamespace
from typing import TYPE_CHECKING, Any, NoReturn

from acp_proxy import __version__

if TYPE_CHECKING:
    import argparse

    from acp_proxy.config import Config, ConfigError

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
  acp-proxy component [OPTIONS]               a proxy component of an ACP conductor's chain
  acp-proxy [OPTIONS] --listen URL -- AGENT_CMD  clients on a socket, one AGENT_CMD per connection
  acp-proxy [OPTIONS] --connect URL              client on stdio, the agent at a socket address

examples:
  acp-proxy -- my-agent --acp
  acp-proxy --config rules.yaml --log-level debug -- npx @zed-industries/claude-code-acp
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


# A config file names code to import (`use:`): it is as trusted as code.
_WRITABLE_HINT = (
    "writable by other users: its `use:` entries import code, so whoever can change it can "
    "run code as this user (chmod go-w)"
)


def _positive_int(text: str) -> int:
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The parser of the main command (options before ``--``)."""
    import argparse

    from acp_proxy.wire.scan import SCANNER

    parser = argparse.ArgumentParser(
        prog="acp-proxy",
        usage="acp-proxy [OPTIONS] -- AGENT_CMD [ARG...]\n"
        "       acp-proxy [OPTIONS] --connect URL\n"
        "       acp-proxy check-config FILE\n"
        "       acp-proxy schema\n"
        "       acp-proxy demo\n"
        "       acp-proxy show FILE\n"
        "       acp-proxy replay FILE",
        description="A sidecar proxy for the Agent Client Protocol: streams ACP between an "
        "editor (stdin/stdout) and the agent it spawns, through a YAML-configured "
        "middleware chain.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # Issue 13: which block scanner is active (the optional C accelerator, or why not).
    parser.add_argument(
        "-V", "--version", action="version", version=f"acp-proxy {__version__}\nscanner: {SCANNER}"
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        help=f"rules file (YAML); default ${CONFIG_ENV}, else pure pass-through",
    )
    parser.add_argument(
        "--log-level",
        type=str.lower,  # DEBUG, Debug and debug alike
        choices=("debug", "info", "warning", "error"),
        default="info",
        help="debug logs one line per frame (default: info)",
    )
    parser.add_argument(
        "--log-format", choices=("json", "console"), default="console", help="(default: console)"
    )
    parser.add_argument("--log-file", metavar="FILE", help="append logs here instead of stderr")
    parser.add_argument(
        "--log-frames",
        action="store_true",
        help="debug lines carry each frame's contents, redacted like a record and cut at "
        "2000 characters (implies --log-level debug)",
    )
    parser.add_argument(
        "--agent-stderr",
        choices=("log", "passthrough"),
        help="the agent's stderr: into the structured log, or to the proxy's stderr as it "
        "is; overrides agent.stderr",
    )
    parser.add_argument(
        "--max-frame-bytes",
        type=_size,
        metavar="SIZE",
        help="longest accepted line: bytes, or a size such as 64MiB, 64mb, 64k; overrides "
        "the config (default 64MiB)",
    )
    # Recording (issue 11).
    parser.add_argument(
        "--record",
        metavar="PATH",
        help="append every frame of the session, both directions, to PATH (JSON Lines, "
        "secrets redacted); with --listen a directory or a name with {conn}; overrides "
        "record.path",
    )
    # Socket transports (issue 5); each overrides the config file's key of the same name.
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
        type=_positive_int,
        metavar="N",
        help="with --listen: sessions at once; more are refused (default 64)",
    )
    sockets.add_argument(
        "--connect-timeout",
        type=_positive_float,
        metavar="SECONDS",
        help="with --connect: how long to wait for the agent's address (default 10)",
    )
    sockets.add_argument(
        "--handshake-timeout",
        type=_positive_float,
        metavar="SECONDS",
        help="with --listen: close a connection whose first request has not arrived by then "
        "(default 30)",
    )
    telemetry = parser.add_argument_group("telemetry")
    telemetry.add_argument(
        "--metrics",
        metavar="URL",
        help="serve /metrics (Prometheus), /healthz and /readyz at URL, e.g. "
        "tcp://127.0.0.1:9464 (loopback only unless --allow-remote)",
    )
    telemetry.add_argument(
        "--ui",
        metavar="URL",
        help="serve the live view (a web page of the session's frames and entities, and its "
        "event stream) at URL, e.g. tcp://127.0.0.1:0; prints its address with an access "
        "token to stderr (loopback only unless --allow-remote)",
    )
    return parser


def _size(text: str) -> int:
    import argparse

    from acp_proxy.config import parse_size

    value = parse_size(text)
    if value is None:
        raise argparse.ArgumentTypeError(
            f"not a size: {text!r} (a byte count, or a size such as 64MiB, 64mb, 64 MB, 64k)"
        )
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return value


def _positive_float(text: str) -> float:
    import argparse

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds: {text!r}")
    return value


def _socket_options(
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
        ("metrics", "metrics"),
    ):
        value = getattr(args, flag)
        if value is not None:
            changes[key] = value
    if changes:
        import dataclasses

        config = dataclasses.replace(config, **changes)  # type: ignore[arg-type]
    for key, listen in (("listen", True), ("connect", False), ("metrics", True)):
        url = getattr(config, key)
        if url is not None:
            # Imported only here: stdio mode never loads the socket layer (start-up, issue 13).
            from acp_proxy.shell.sockets.address import AddressError, parse_address

            try:
                parse_address(url, listen=listen)
            except AddressError as exc:
                _usage_error(parser, f"--{key}: {exc}")
    return config


SUBCOMMANDS = ("check-config", "schema", "demo", "show", "replay", "component", "ui")


def _refuse_misspelled_command(parser: argparse.ArgumentParser, word: str) -> None:
    """``acp-proxy check-conifg x.yaml`` is a typo, not an agent to run: refuse it (exit 2)
    when the word is close to a subcommand. ``--`` before it says it is the agent's command."""
    if word in SUBCOMMANDS:
        parser.error(
            f'"{word}" must come first (acp-proxy {word} ...); to run an agent named {word}, '
            "put -- before it"
        )
    import difflib  # only for a word that is not an option (start-up, issue 13)

    close = difflib.get_close_matches(word, SUBCOMMANDS, n=1, cutoff=0.8)
    if close:
        parser.error(
            f'unknown command "{word}"; did you mean {close[0]}? (to run an agent named '
            f"{word}, put -- before it)"
        )


def _schema(argv: Sequence[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="acp-proxy schema",
        description="Print the JSON schema of the config file (for editors: "
        "# yaml-language-server: $schema=PATH at the top of the file).",
    )
    parser.parse_args(argv)
    import json

    from acp_proxy.config import json_schema

    sys.stdout.write(json.dumps(json_schema(), indent=2, ensure_ascii=False) + "\n")
    return 0


def _run_checks(config: Config) -> list[str]:
    """What the run refuses about a config file's own settings beyond its validation (the
    socket addresses, the loopback rule), as ``FILE:LINE: KEY: REASON`` lines. check-config
    applies them so that a file it accepts also starts (issue 14)."""
    import socket

    from acp_proxy.shell.sockets.address import AddressError, is_loopback_ip, parse_address

    def where(key: str) -> str:
        line = config.lines.get(key)
        return f"{config.source}:{line}: {key}" if line is not None else f"{config.source}: {key}"

    problems: list[str] = []
    for key, listen in (("listen", True), ("connect", False), ("metrics", True)):
        url = getattr(config, key)
        if url is None:
            continue
        try:
            address = parse_address(url, listen=listen)
        except AddressError as exc:
            problems.append(f"{where(key)}: {exc}")
            continue
        if address.scheme == "unix" and len(os.fsencode(address.path)) > _UNIX_PATH_MAX:
            problems.append(
                f"{where(key)}: the socket path is {len(os.fsencode(address.path))} bytes; "
                f"Unix socket paths are limited to {_UNIX_PATH_MAX}"
            )
        if not listen or address.scheme != "tcp" or config.allow_remote:
            continue
        try:  # the same lookup as the listener's, so names are judged as the run judges them
            infos = socket.getaddrinfo(
                address.host, address.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            )
        except OSError as exc:
            problems.append(f"{where(key)}: cannot resolve {address.host}: {exc.strerror or exc}")
            continue
        remote = list(
            dict.fromkeys(str(i[4][0]) for i in infos if not is_loopback_ip(str(i[4][0])))
        )
        if remote:
            problems.append(
                f"{where(key)}: {', '.join(remote)} is not a loopback address (anyone who can "
                "reach it could drive the agent); the proxy refuses to listen there unless "
                "allow_remote: true (or --allow-remote)"
            )
    return problems


# sockaddr_un.sun_path holds 108 bytes on Linux (104 on the BSDs and macOS), NUL included.
_UNIX_PATH_MAX = 107 if sys.platform.startswith("linux") else 103


def _print_config_errors(exc: ConfigError) -> None:
    for message in exc.messages():  # every mistake of the file, one line each
        print(f"acp-proxy: {message}", file=sys.stderr)


def _check_config(argv: Sequence[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="acp-proxy check-config",
        description="Validate a rules file and explain what it does (exit 0), or print the "
        "error (exit 2).",
    )
    parser.add_argument("file", metavar="FILE")
    args = parser.parse_args(argv)
    from acp_proxy.config import ConfigError, explain_config, load_config, writable_by_others

    try:
        # Import the middleware classes but never call them: checking a file runs no code of
        # its own beyond the imports it names.
        config = load_config(args.file, os.environ, instantiate=False)
    except ConfigError as exc:
        _print_config_errors(exc)
        return EXIT_USAGE
    except OSError as exc:
        print(f"acp-proxy: {args.file}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    problems = _run_checks(config)
    if problems:
        for problem in problems:
            print(f"acp-proxy: {problem}", file=sys.stderr)
        return EXIT_USAGE
    for warning in writable_by_others(args.file):
        print(f"acp-proxy: warning: {warning}; {_WRITABLE_HINT}", file=sys.stderr)
    text = explain_config(config)
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``acp-proxy`` and ``python -m acp_proxy``; returns the exit code.

    A Ctrl-C that lands before the proxy installs its signal handlers (or in ``check-config``)
    exits 130 like a shell, without a traceback; so does a closed stdout in ``check-config |
    head`` (exit 141, 128 + SIGPIPE).
    """
    collecting = gc.isenabled()
    try:
        return _main(argv)
    except KeyboardInterrupt:
        return 128 + signal.SIGINT
    except BrokenPipeError:
        # Python's own advice: point stdout at devnull so the flush at exit does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    finally:
        if argv is not None:
            # An in-process caller (a test) gets its objects collected again. The command
            # itself (argv from sys.argv) keeps them frozen: the interpreter's collections at
            # exit need not walk them (start-up, issue 13).
            gc.unfreeze()
        if collecting:
            gc.enable()


# Start-up (issue 13): what the proxy allocates before its event loop runs (modules, classes,
# the config, the loop itself) lives as long as the process, so the cyclic garbage collector's
# passes over it (a few dozen, a tenth of the start-up's CPU) find nothing to free. It is off
# from the command line's parsing until the proxy's first coroutine runs; then those objects
# are frozen (gc.freeze: no later collection walks them again) and collection resumes.
_COLLECT = {"after_start": False}


async def _collecting(main: Callable[..., Awaitable[int]], *args: Any) -> int:
    if _COLLECT["after_start"]:
        gc.freeze()
        gc.enable()
    return await main(*args)


# Start-up (issue 13): the options an editor's command line usually holds are read without
# argparse (importing it and building the parser cost more than everything else the command line
# does). Only exact spellings are taken here; anything else (an abbreviation, a value starting
# with "-", -h, -V, the numeric options, a bare AGENT_CMD without --, a value outside the
# choices) goes to argparse, which reports every error. tests/test_cli.py checks that both
# give the same values.
_FAST_VALUES: dict[str, tuple[str, tuple[str, ...] | None]] = {
    "--config": ("config", None),
    "--log-level": ("log_level", ("debug", "info", "warning", "error")),
    "--log-format": ("log_format", ("json", "console")),
    "--log-file": ("log_file", None),
    "--agent-stderr": ("agent_stderr", ("log", "passthrough")),
    "--record": ("record", None),
    "--listen": ("listen", None),
    "--connect": ("connect", None),
    "--metrics": ("metrics", None),
    "--ui": ("ui", None),
}
_FAST_FLAGS = {"--log-frames": "log_frames", "--allow-remote": "allow_remote"}
# build_parser's defaults, one per destination.
_DEFAULTS: dict[str, object] = {
    "config": None,
    "log_level": "info",
    "log_format": "console",
    "log_file": None,
    "log_frames": False,
    "agent_stderr": None,
    "max_frame_bytes": None,
    "record": None,
    "listen": None,
    "connect": None,
    "allow_remote": None,
    "max_connections": None,
    "connect_timeout": None,
    "handshake_timeout": None,
    "metrics": None,
    "ui": None,
}


def _fast_options(options: Sequence[str]) -> SimpleNamespace | None:
    """What ``build_parser().parse_known_args(options)`` returns (with no extra arguments), or
    ``None`` when ``options`` need argparse itself."""
    values = dict(_DEFAULTS)
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


def _usage_error(parser: argparse.ArgumentParser | None, message: str) -> NoReturn:
    """argparse's usage error (exit 2), building the parser if the fast path skipped it."""
    (parser or build_parser()).error(message)


def _main(argv: Sequence[str] | None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    if args_in[:1] == ["check-config"]:
        return _check_config(args_in[1:])
    if args_in[:1] == ["demo"]:
        from acp_proxy import demo  # written separately; imported only when asked for

        return int(demo.main(args_in[1:]) or 0)
    if args_in[:1] == ["schema"]:
        return _schema(args_in[1:])
    if args_in[:1] == ["ui"] or (args_in[:1] == ["show"] and "--web" in args_in):
        from acp_proxy.shell import ui_command  # the live view: imported only when asked for

        return ui_command.main([a for a in args_in[1:] if a != "--web"])
    if args_in[:1] == ["show"]:
        from acp_proxy.shell import show

        return show.main(args_in[1:])
    if args_in[:1] == ["replay"]:
        from acp_proxy.shell import replay

        return replay.main(args_in[1:])
    if args_in[:1] == ["component"]:
        from acp_proxy.shell import component

        return component.main(args_in[1:])

    _COLLECT["after_start"] = gc.isenabled()
    gc.disable()  # until the event loop runs (main() turns it back on if we never get there)
    if "--" in args_in:
        cut = args_in.index("--")
        options, agent_argv = args_in[:cut], args_in[cut + 1 :]
    else:
        options, agent_argv = args_in, []
    parser: argparse.ArgumentParser | None = None  # built only when argparse is needed
    args: argparse.Namespace | SimpleNamespace | None = _fast_options(options)
    if args is None:
        parser = build_parser()
        args, extra = parser.parse_known_args(options)
        if extra:
            # Without "--", a bare command is accepted when it comes after all options.
            if agent_argv or extra[0].startswith("-"):
                parser.error(f"unrecognized arguments: {' '.join(extra)}")
            _refuse_misspelled_command(parser, extra[0])
            agent_argv = extra
    config_path = args.config or os.environ.get(CONFIG_ENV) or None
    # Without --connect, an AGENT_CMD is needed unless the config file names an agent address:
    # report the missing command before reading any file when no file can supply one.
    if not agent_argv and not args.connect and not config_path:
        _usage_error(parser, "missing AGENT_CMD (usage: acp-proxy [OPTIONS] -- AGENT_CMD [ARG...])")
    if config_path is None and _plain_stdio(args):
        # Issue 13 (start-up as users feel it): nothing left can refuse this session (no config
        # file, no option but the log level, format and frames), so the agent starts before the
        # config model, dataclasses and orjson are imported (about 45 ms sooner than after).
        from acp_proxy.shell.spawn import enable_supervision, start_early

        enable_supervision()
        start_early(agent_argv, _UNCONFIGURED_AGENT)

    import dataclasses

    from acp_proxy.config import ConfigError, load_config

    try:
        config = load_config(config_path, os.environ)
    except ConfigError as exc:
        _print_config_errors(exc)
        return EXIT_USAGE
    except OSError as exc:
        print(f"acp-proxy: {config_path}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.max_frame_bytes is not None:
        config = dataclasses.replace(config, max_frame_bytes=args.max_frame_bytes)
    config = _socket_options(parser, args, config)
    if args.agent_stderr is not None:
        from acp_proxy.config import StderrMode

        config = dataclasses.replace(
            config, agent=dataclasses.replace(config.agent, stderr=StderrMode(args.agent_stderr))
        )
    if args.record is not None:
        config = dataclasses.replace(
            config, record=dataclasses.replace(config.record, path=args.record)
        )
    if args.ui is not None:
        config = dataclasses.replace(config, ui=dataclasses.replace(config.ui, address=args.ui))
    if config.ui.address is not None:
        from acp_proxy.shell.sockets.address import AddressError, parse_address

        try:
            if parse_address(config.ui.address, listen=True).scheme != "tcp":
                raise AddressError("the live view needs a tcp:// address (a browser speaks TCP)")
        except AddressError as exc:
            _usage_error(parser, f"--ui: {exc}")
    if config.connect is not None and agent_argv:
        where = "--connect" if args.connect else f"connect: in {config.source}"
        _usage_error(
            parser,
            f"{where} names the agent's address; an AGENT_CMD cannot be used with it "
            "(drop one of them)",
        )
    if config.connect is None and not agent_argv:
        _usage_error(parser, "missing AGENT_CMD (usage: acp-proxy [OPTIONS] -- AGENT_CMD [ARG...])")

    from acp_proxy.shell.logsetup import configure_logging

    if args.log_frames:
        from acp_proxy.shell.framelog import enable_frame_contents

        enable_frame_contents()
        args.log_level = "debug"
    try:
        configure_logging(args.log_level, args.log_format, args.log_file)
    except OSError as exc:
        print(f"acp-proxy: --log-file {args.log_file}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE

    if config_path is not None:
        from acp_proxy.config import writable_by_others
        from acp_proxy.shell.logsetup import get_logger

        for warning in writable_by_others(config_path):
            get_logger().warning(f"config file {_WRITABLE_HINT}", detail=warning)

    from acp_proxy.shell.spawn import enable_supervision, start_early, started_early

    # No orphans (issue 10): from here on, descendants that leave the agent's session are
    # adopted, killed and reaped by the proxy; as PID 1 it reaps every orphan it inherits.
    enable_supervision()
    if not started_early() and _starts_early(config):
        # Issue 13 (start-up as users feel it): the agent starts now, and boots while the
        # proxy imports its event loop and runtime (``spawn.start_early``).
        start_early(agent_argv, config.agent)

    import anyio

    from acp_proxy.shell.process import run_supervised

    if config.listen is not None:
        from acp_proxy.shell.sockets.server import run_listen

        return anyio.run(_collecting, run_supervised, *_telemetry(config, run_listen, agent_argv))
    if config.connect is not None:
        from acp_proxy.shell.sockets.connect import run_connect

        return anyio.run(_collecting, run_supervised, *_telemetry(config, run_connect))

    from acp_proxy.shell.runtime import run_proxy

    return anyio.run(_collecting, run_supervised, *_telemetry(config, run_proxy, agent_argv))


# ``Config().agent`` as far as starting the agent reads it: no environment overrides, stderr
# passed through (``spawn.AgentSettings``). The runtime takes the agent started with it only if
# its config's agent section says the same (``spawn.take_early``; a test holds them equal).
class _UnconfiguredAgent:
    __slots__ = ()
    env: Mapping[str, str] = MappingProxyType({})
    stderr = "passthrough"


_UNCONFIGURED_AGENT = _UnconfiguredAgent()
# The options that leave a stdio session nothing to refuse after the agent started: every
# other option keeps its default.
_PLAIN_OPTIONS = frozenset(("log_level", "log_format", "log_frames"))


def _plain_stdio(args: argparse.Namespace | SimpleNamespace) -> bool:
    """No option but ``--log-level``, ``--log-format`` and ``--log-frames`` was given."""
    return all(
        getattr(args, dest) == default
        for dest, default in _DEFAULTS.items()
        if dest not in _PLAIN_OPTIONS
    )


def _starts_early(config: Config) -> bool:
    """Whether the agent is started before the event loop: a stdio session whose start nothing
    else can still refuse. With ``--record``, only when the record file can be opened now (one
    that cannot refuses the session before the agent runs; the runtime opens it again, and
    should that fail after all, the agent it never took is killed with the proxy's other
    leftovers). Not with ``--metrics`` (its address is bound first) or tracing (its exporter is
    set up first), nor on sockets (``--listen`` starts an agent per client, ``--connect``
    none)."""
    return (
        config.listen is None
        and config.connect is None
        and (config.record.path is None or _can_record(config.record.path))
        and config.metrics is None
        and config.ui.address is None
        and not config.tracing.enabled
    )


def _can_record(path: str) -> bool:
    """Whether the recorder could open ``path`` now: a directory it may create a file in, or a
    regular file it may append to (created as the recorder creates it: ``0600``). Anything
    else is left to the recorder alone: a FIFO opened and closed here would give its reader
    EOF before the record, and a device may act on an open."""
    if os.path.isdir(path) or path.endswith(os.sep):
        return os.access(path, os.W_OK | os.X_OK)
    with contextlib.suppress(OSError):  # not there yet (created below), or not reachable
        if not stat.S_ISREG(os.stat(path).st_mode):
            return False
    from acp_proxy.record.settings import RECORD_FILE_MODE, RECORD_OPEN_FLAGS

    try:
        os.close(os.open(path, RECORD_OPEN_FLAGS, RECORD_FILE_MODE))
    except OSError:
        return False
    return True


def _telemetry(config: Config, main: Callable[..., Awaitable[int]], *rest: Any) -> tuple[Any, ...]:
    """``(main, config, *rest)``, wrapped in the metrics endpoints and tracing when they are
    enabled (issue 12); unchanged, nothing imported, when not."""
    run: tuple[Any, ...] = (main, config, *rest)
    if config.tracing.enabled and os.environ.get("OTEL_SDK_DISABLED", "").lower() != "true":
        from acp_proxy.shell.tracing import run_with_tracing, with_trace_context

        # The trace-context middleware goes last in the chain (issue 12.2).
        config = with_trace_context(config)
        run = (run_with_tracing, config.tracing, main, config, *rest)
    if config.ui.address is not None:
        # The live view (imported only when on): its tap joins the metrics' and tracing's.
        from acp_proxy.shell.ui_server import run_with_ui

        run = (run_with_ui, config.ui, config.allow_remote, config.record, *run)
    if config.metrics is not None:
        from acp_proxy.shell.telemetry import run_with_metrics

        run = (
            run_with_metrics,
            config.metrics,
            config.allow_remote,
            config.listen is None,  # stdio, --connect: ready once the agent answered initialize
            config.max_pending_requests,
            *run,
        )
    return run
