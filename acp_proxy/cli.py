"""The command line: parse arguments, load the config up front, run the proxy, map exit codes.

Contract: owns the ``acp-proxy`` command surface (issue 3, "Command line") and the process exit
code. Configuration is validated completely before the agent is spawned (style.md habit 5); a
bad config exits 2 with the error on stderr. Never writes to stdout except for ``--help``,
``--version`` and ``check-config`` (no protocol is running then).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Sequence

from acp_proxy import __version__

EXIT_USAGE = 2  # argparse's own code for usage errors; also used for config errors
CONFIG_ENV = "ACP_PROXY_CONFIG"

_EPILOG = f"""\
commands:
  acp-proxy [OPTIONS] -- AGENT_CMD [ARG...]   run AGENT_CMD behind the proxy (stdio)
  acp-proxy check-config FILE                 validate FILE and explain what it does
  acp-proxy demo                              bundled rules between a scripted client and agent

examples:
  acp-proxy -- my-agent --acp
  acp-proxy --config rules.yaml --log-level debug -- npx @zed-industries/claude-code-acp
  {CONFIG_ENV}=rules.yaml acp-proxy --log-format json --log-file proxy.log -- my-agent
  acp-proxy check-config rules.yaml

Without a config (no --config, no ${CONFIG_ENV}) the proxy is a pure pass-through.
stdout carries the protocol; logs go to stderr or --log-file.
exit codes: the agent's exit code (128+N if signal N ended it); 126 agent not executable;
127 agent not found; 2 usage or configuration error.
"""


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The parser of the main command (options before ``--``)."""
    parser = argparse.ArgumentParser(
        prog="acp-proxy",
        usage="acp-proxy [OPTIONS] -- AGENT_CMD [ARG...]\n"
        "       acp-proxy check-config FILE\n"
        "       acp-proxy demo",
        description="A sidecar proxy for the Agent Client Protocol: streams ACP between an "
        "editor (stdin/stdout) and the agent it spawns, through a YAML-configured "
        "middleware chain.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"acp-proxy {__version__}")
    parser.add_argument(
        "--config",
        metavar="FILE",
        help=f"rules file (YAML); default ${CONFIG_ENV}, else pure pass-through",
    )
    parser.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        default="info",
        help="debug logs one line per frame (default: info)",
    )
    parser.add_argument(
        "--log-format", choices=("json", "console"), default="console", help="(default: console)"
    )
    parser.add_argument("--log-file", metavar="FILE", help="append logs here instead of stderr")
    parser.add_argument(
        "--max-frame-bytes",
        type=_positive_int,
        metavar="N",
        help="longest accepted line; overrides the config (default 64 MiB)",
    )
    # Reserved for issue 5 (socket transports); accepted names, not implemented yet.
    for flag in ("--listen", "--connect"):
        parser.add_argument(flag, metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--allow-remote", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--max-connections", type=_positive_int, help=argparse.SUPPRESS)
    parser.add_argument("--connect-timeout", type=float, help=argparse.SUPPRESS)
    return parser


def _check_config(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="acp-proxy check-config",
        description="Validate a rules file and explain what it does (exit 0), or print the "
        "error (exit 2).",
    )
    parser.add_argument("file", metavar="FILE")
    args = parser.parse_args(argv)
    from acp_proxy.config import ConfigError, explain_config, load_config

    try:
        config = load_config(args.file, os.environ)
    except ConfigError as exc:
        print(f"acp-proxy: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        print(f"acp-proxy: {args.file}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    text = explain_config(config)
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``acp-proxy`` and ``python -m acp_proxy``; returns the exit code."""
    args_in = list(sys.argv[1:] if argv is None else argv)
    if args_in[:1] == ["check-config"]:
        return _check_config(args_in[1:])
    if args_in[:1] == ["demo"]:
        from acp_proxy import demo  # written separately; imported only when asked for

        return int(demo.main(args_in[1:]) or 0)

    if "--" in args_in:
        cut = args_in.index("--")
        options, agent_argv = args_in[:cut], args_in[cut + 1 :]
    else:
        options, agent_argv = args_in, []
    parser = build_parser()
    args, extra = parser.parse_known_args(options)
    if extra:
        # Without "--", a bare command is accepted when it comes after all options.
        if agent_argv or extra[0].startswith("-"):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        agent_argv = extra
    if not agent_argv:
        parser.error("missing AGENT_CMD (usage: acp-proxy [OPTIONS] -- AGENT_CMD [ARG...])")
    if args.listen or args.connect:
        parser.error("--listen/--connect are not implemented yet (issue 5)")

    from acp_proxy.config import ConfigError, load_config

    config_path = args.config or os.environ.get(CONFIG_ENV) or None
    try:
        config = load_config(config_path, os.environ)
    except ConfigError as exc:
        print(f"acp-proxy: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        print(f"acp-proxy: {config_path}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.max_frame_bytes is not None:
        config = dataclasses.replace(config, max_frame_bytes=args.max_frame_bytes)

    from acp_proxy.logsetup import configure_logging

    try:
        configure_logging(args.log_level, args.log_format, args.log_file)
    except OSError as exc:
        print(f"acp-proxy: --log-file {args.log_file}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE

    import anyio

    from acp_proxy.runtime import run_proxy

    return anyio.run(run_proxy, config, agent_argv)
