"""The subcommands that check and describe a config: ``check-config FILE`` and ``schema``.

Contract: owns what ``check-config`` prints and exits with (every error of the file, the checks
a run would refuse beyond validation, the explanation on stdout) and ``schema``'s output. It
never imports a middleware's code beyond the imports the file names, never instantiates one,
and never starts an agent.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from acp_proxy.cli.options import EXIT_USAGE

if TYPE_CHECKING:
    from acp_proxy.config import Config

# A config file names code to import (`use:`): it is as trusted as code.
WRITABLE_HINT = (
    "writable by other users: its `use:` entries import code, so whoever can change it can "
    "run code as this user (chmod go-w)"
)


def schema(argv: Sequence[str]) -> int:
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


def run_checks(config: Config) -> list[str]:
    """What the run refuses about a config file's own settings beyond its validation (the
    socket addresses, the loopback rule, the optional features' requirements), as
    ``FILE:LINE: KEY: REASON`` lines. check-config applies them so that a file it accepts
    also starts."""
    import socket

    from acp_proxy.shell.sockets.address import AddressError, is_loopback_ip, parse_address

    def where(key: str) -> str:
        line = config.lines.get(key)
        return f"{config.source}:{line}: {key}" if line is not None else f"{config.source}: {key}"

    problems: list[str] = []
    for key, listen in (("listen", True), ("connect", False), ("metrics", True), ("ui", True)):
        url = config.ui.address if key == "ui" else getattr(config, key)
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
        if key == "ui" and address.scheme != "tcp":
            problems.append(f"{where(key)}: the live view needs a tcp:// address")
            continue
        consent = {"metrics": config.metrics_allow_remote, "ui": config.ui.allow_remote}.get(
            key, config.allow_remote
        )
        if not listen or address.scheme != "tcp" or consent:
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
        if remote and key == "metrics":
            problems.append(
                f"{where(key)}: {', '.join(remote)} is not a loopback address (anyone who can "
                "reach it can read the metrics and the health of the proxy); the proxy refuses "
                "to serve them there unless metrics_allow_remote: true (or "
                "--metrics-allow-remote)"
            )
        elif remote and key == "ui":
            problems.append(
                f"{where(key)}: {', '.join(remote)} is not a loopback address (anyone who has "
                "the live view's URL could read the session); the proxy refuses to serve it "
                "there unless ui.allow_remote: true (or --ui-allow-remote)"
            )
        elif remote:
            problems.append(
                f"{where(key)}: {', '.join(remote)} is not a loopback address (anyone who can "
                "reach it could drive the agent); the proxy refuses to listen there unless "
                "allow_remote: true (or --allow-remote)"
            )
    problems += _feature_checks(config, where)
    return problems


def _feature_checks(config: Config, where: Callable[[str], str]) -> list[str]:
    """The run's refusals of the optional features a file turns on: tracing without the
    OpenTelemetry SDK, a record path or a policy audit file whose directory does not exist."""
    problems: list[str] = []
    if config.tracing.enabled and os.environ.get("OTEL_SDK_DISABLED", "").lower() != "true":
        import importlib.util

        try:
            found = all(
                importlib.util.find_spec(name) is not None
                for name in ("opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.http")
            )
        except ModuleNotFoundError:
            found = False
        if not found:
            from acp_proxy.shell.tracing import install_hint

            problems.append(
                f"{where('tracing')}: tracing is enabled but the OpenTelemetry SDK (the otel "
                f"extra) is not installed; add it with: {install_hint()}"
            )
    if config.record.path is not None:
        from acp_proxy.cli.launch import missing_record_directory

        path = config.record.path
        target = missing_record_directory(path)
        if target is not None:
            problems.append(
                f"{where('record')}: record.path {path}: the directory {target} does not exist"
            )
    audit = config.policy.audit if config.policy is not None else None
    if audit is not None:
        target = os.path.dirname(audit)
        if target and not os.path.isdir(target):
            problems.append(
                f"{where('policy')}: policy.audit {audit}: the directory {target} does not exist"
            )
    if config.budgets is not None:
        target = os.path.dirname(config.budgets.state)
        if not os.path.isdir(target):
            problems.append(
                f"{where('budgets')}: budgets.state {config.budgets.state}: the directory "
                f"{target} does not exist (prompts would be refused)"
            )
    return problems


# sockaddr_un.sun_path holds 108 bytes on Linux (104 on the BSDs and macOS), NUL included.
_UNIX_PATH_MAX = 107 if sys.platform.startswith("linux") else 103


def check_config(argv: Sequence[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="acp-proxy check-config",
        description="Validate a rules file and explain what it does (exit 0), or print the "
        "error (exit 2).",
    )
    parser.add_argument("file", metavar="FILE")
    parser.add_argument(
        "--middleware-path",
        action="append",
        metavar="DIR",
        help="search DIR first for the modules of use: entries (repeatable), as the run does",
    )
    args = parser.parse_args(argv)
    from acp_proxy.cli.options import load_or_report, search_middleware_paths

    search_middleware_paths(parser, args.middleware_path)
    from acp_proxy.config import explain_config, writable_by_others

    # Import the middleware classes but never call them: checking a file runs no code of its
    # own beyond the imports it names.
    config = load_or_report(args.file, instantiate=False)
    if config is None:
        return EXIT_USAGE
    problems = run_checks(config)
    if problems:
        for problem in problems:
            print(f"acp-proxy: {problem}", file=sys.stderr)
        return EXIT_USAGE
    for warning in writable_by_others(args.file):
        print(f"acp-proxy: warning: {warning}; {WRITABLE_HINT}", file=sys.stderr)
    text = explain_config(config)
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0
