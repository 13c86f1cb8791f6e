"""The command line: parse arguments, load the config up front, run the proxy, map exit codes.

Contract: owns the ``acp-proxy`` command surface (which subcommand or mode runs; the order in
which the config is loaded, logging set up and the agent started) and the process exit code.
The options are in ``options`` (those several commands share in ``flags``), the config
subcommands in ``commands``, what runs around the event loop in ``launch``, the
refusals before a session in ``refuse``; the command programs are ``show_command``,
``replay_command``, ``ui_command``, ``policy_command`` and ``budgets_command``. Configuration is
validated completely before the agent is spawned (style.md habit 5); a bad config exits 2 with
every error of the file on stderr. Never writes to stdout except for ``--help``, ``--version``,
``check-config``, ``schema`` and ``show`` (no protocol is running then), and ``replay``, whose
stdout is the protocol of the agent it plays.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
from collections.abc import Sequence
from types import SimpleNamespace
from typing import TYPE_CHECKING

from acp_proxy.cli.launch import (
    COLLECT,
    UNCONFIGURED_AGENT,
    bind_endpoints_early,
    collecting,
    missing_record_directory,
    starts_early,
    with_telemetry,
)
from acp_proxy.cli.options import (
    CONFIG_ENV,
    EXIT_USAGE,
    USAGE_ERRORS,
    build_parser,
    fast_options,
    load_or_report,
    log_level_of,
    plain_stdio,
    refuse_misspelled_command,
    search_middleware_paths,
    socket_options,
    usage_error,
)

if TYPE_CHECKING:
    import argparse

    from acp_proxy.config import Config

__all__ = ["build_parser", "main"]


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
            # exit need not walk them (start-up time).
            gc.unfreeze()
        if collecting:
            gc.enable()


def _main(argv: Sequence[str] | None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    if args_in[:1] == ["check-config"]:
        from acp_proxy.cli.commands import check_config

        return check_config(args_in[1:])
    if args_in[:1] == ["demo"]:
        from acp_proxy import demo  # written separately; imported only when asked for

        return int(demo.main(args_in[1:]) or 0)
    if args_in[:1] == ["schema"]:
        from acp_proxy.cli.commands import schema

        return schema(args_in[1:])
    if args_in[:1] == ["ui"] or (args_in[:1] == ["show"] and "--web" in args_in):
        from acp_proxy.cli import ui_command  # the live view: imported only when asked for

        return ui_command.main([a for a in args_in[1:] if a != "--web"])
    if args_in[:1] == ["show"]:
        from acp_proxy.cli import show_command

        return show_command.main(args_in[1:])
    if args_in[:1] == ["replay"]:
        from acp_proxy.cli import replay_command

        return replay_command.main(args_in[1:])
    if args_in[:2] == ["policy", "test"]:
        from acp_proxy.cli import policy_command

        return policy_command.main(args_in[2:])
    if args_in[:1] == ["budgets"]:
        from acp_proxy.cli import budgets_command

        return budgets_command.main(args_in[1:])
    if args_in[:1] == ["audit"]:
        from acp_proxy.shell.control.policy_runtime import verify_main

        return verify_main(args_in[1:])
    if args_in[:1] == ["component"]:
        from acp_proxy.shell.session import component_runtime

        return component_runtime.main(args_in[1:])

    COLLECT["after_start"] = gc.isenabled()
    gc.disable()  # until the event loop runs (main() turns it back on if we never get there)
    if "--" in args_in:
        cut = args_in.index("--")
        options, agent_argv = args_in[:cut], args_in[cut + 1 :]
    else:
        options, agent_argv = args_in, []
    parser: argparse.ArgumentParser | None = None  # built only when argparse is needed
    args: argparse.Namespace | SimpleNamespace | None = fast_options(options)
    if args is None:
        parser = build_parser()
        args, extra = parser.parse_known_args(options)
        if extra:
            # Without "--", a bare command is accepted when it comes after all options.
            if agent_argv or extra[0].startswith("-"):
                parser.error(f"unrecognized arguments: {' '.join(extra)}")
            refuse_misspelled_command(parser, extra[0])
            agent_argv = extra
    said = len(USAGE_ERRORS)
    try:
        prepared = _prepare(parser, args, agent_argv)
    except SystemExit as exc:
        if exc.code != EXIT_USAGE or len(USAGE_ERRORS) == said:
            raise
        # A usage error found after the options were read: argparse printed it.
        from acp_proxy.cli.refuse import refuse_start

        return refuse_start(args, USAGE_ERRORS[said:], EXIT_USAGE, logging_ready=False)
    if isinstance(prepared, int):
        return prepared
    config, config_path = prepared

    if config_path is not None:
        from acp_proxy.cli.commands import WRITABLE_HINT
        from acp_proxy.config import writable_by_others
        from acp_proxy.shell.log.logsetup import get_logger

        for warning in writable_by_others(config_path):
            get_logger().warning(f"config file {WRITABLE_HINT}", detail=warning)

    from acp_proxy.shell.agent.spawn import enable_supervision, start_early, started_early

    # No orphans: from here on, descendants that leave the agent's session are
    # adopted, killed and reaped by the proxy; as PID 1 it reaps every orphan it inherits.
    enable_supervision()
    if not started_early():
        # ``--metrics`` and ``--ui`` on an address that needs no lookup are bound here, so
        # that the agent starts early with them too (a refusal still spawns nothing).
        refusal = bind_endpoints_early(config)
        if refusal is not None:
            return refusal
    if not started_early() and starts_early(config):
        # Start-up as users feel it: the agent starts now, and boots while the
        # proxy imports its event loop and runtime (``spawn.start_early``).
        start_early(agent_argv, config.agent)

    import anyio

    from acp_proxy.shell.agent.process import run_supervised

    if config.listen is not None:
        from acp_proxy.shell.sockets.server import run_listen

        return anyio.run(
            collecting, run_supervised, *with_telemetry(config, run_listen, agent_argv)
        )
    if config.connect is not None:
        from acp_proxy.shell.sockets.connect import run_connect

        return anyio.run(collecting, run_supervised, *with_telemetry(config, run_connect))

    from acp_proxy.shell.session.runtime import run_proxy

    return anyio.run(collecting, run_supervised, *with_telemetry(config, run_proxy, agent_argv))


def _prepare(
    parser: argparse.ArgumentParser | None,
    args: argparse.Namespace | SimpleNamespace,
    agent_argv: list[str],
) -> tuple[Config, str | None] | int:
    """The config with the options applied, logging set up, and an early start when nothing
    can refuse the session any more; or the exit code of a refusal (``refuse``). Usage errors
    exit through argparse (``SystemExit``)."""
    config_path = args.config or os.environ.get(CONFIG_ENV) or None
    # Without --connect, an AGENT_CMD is needed unless the config file names an agent address:
    # report the missing command before reading any file when no file can supply one.
    if not agent_argv and not args.connect and not config_path:
        usage_error(parser, "missing AGENT_CMD (usage: acp-proxy [OPTIONS] -- AGENT_CMD [ARG...])")
    if config_path is None and plain_stdio(args):
        # Start-up as users feel it: nothing left can refuse this session (no config
        # file, no option but the log level, format and frames), so the agent starts before the
        # config model, dataclasses and orjson are imported (docs/performance.md, "Figures
        # behind the code").
        from acp_proxy.shell.agent.spawn import enable_supervision, start_early

        enable_supervision()
        start_early(agent_argv, UNCONFIGURED_AGENT)

    import dataclasses

    search_middleware_paths(parser, args.middleware_path)
    said: list[str] = []
    config = load_or_report(config_path, said=said)
    if config is None:
        from acp_proxy.cli.refuse import refuse_start

        return refuse_start(args, said, EXIT_USAGE, logging_ready=False)
    if args.max_frame_bytes is not None:
        config = dataclasses.replace(config, max_frame_bytes=args.max_frame_bytes)
    config = socket_options(parser, args, config)
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
        from acp_proxy.telemetry.endpoint import endpoint_url

        config = dataclasses.replace(
            config, ui=dataclasses.replace(config.ui, address=endpoint_url(args.ui))
        )
    if args.ui_allow_remote:
        config = dataclasses.replace(config, ui=dataclasses.replace(config.ui, allow_remote=True))
    if config.ui.address is not None:
        from acp_proxy.shell.sockets.address import AddressError, parse_endpoint

        try:
            parse_endpoint(config.ui.address, browser=True)
        except AddressError as exc:
            usage_error(parser, f"--ui: {exc}")
    if config.listen is not None and config.record.path is not None:
        # Each connection opens its own record: one with no directory to go to would run
        # unrecorded, connection after connection. Refused now, like the other bad paths.
        missing = missing_record_directory(config.record.path)
        if missing is not None:
            if args.record is not None:
                where = f"--record {args.record}"
            else:
                line = config.lines.get("record")
                where = f"{config.source}:{line}: record: record.path {config.record.path}"
            print(f"acp-proxy: {where}: the directory {missing} does not exist", file=sys.stderr)
            return EXIT_USAGE
    if config.connect is not None and agent_argv:
        where = "--connect" if args.connect else f"connect: in {config.source}"
        usage_error(
            parser,
            f"{where} names the agent's address; an AGENT_CMD cannot be used with it "
            "(drop one of them)",
        )
    if config.connect is None and not agent_argv:
        usage_error(parser, "missing AGENT_CMD (usage: acp-proxy [OPTIONS] -- AGENT_CMD [ARG...])")

    from acp_proxy.shell.log.logsetup import configure_logging

    if args.log_frames:
        from acp_proxy.shell.log.framelog import enable_frame_contents

        enable_frame_contents()
        args.log_level = "debug"
    args.log_level = log_level_of(args, config.listen is not None)
    try:
        configure_logging(args.log_level, args.log_format, args.log_file)
    except OSError as exc:
        message = f"--log-file {args.log_file}: {exc.strerror or exc}"
        print(f"acp-proxy: {message}", file=sys.stderr)
        from acp_proxy.cli.refuse import refuse_start

        return refuse_start(args, [message], EXIT_USAGE, logging_ready=True)
    return config, config_path
