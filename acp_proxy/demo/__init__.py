"""``acp-proxy demo``: the bundled rules between a scripted ACP v2 client and a scripted agent.

Contract: owns the demo's command (its options, the rules file it uses, the child processes'
environment, the output on stdout). It plays one session twice with the scripted agent
(``agent``): once directly, to record what the agent sends, and once through the real CLI
(``python -m acp_proxy --config <rules> -- python -m acp_proxy.demo.agent``), to record what a
client receives (``session``). It pairs the updates of the two runs (``pairing``), reduces both
streams to the metadata a client stores per entity, next to what a client would store if
``_meta`` objects replaced the stored metadata whole, the rule before the v2 Metadata Patches
RFD (``stored``), and prints the report (``report``). It never changes anything on disk and
always ends its child processes (timeouts everywhere).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import orjson

import acp_proxy
from acp_proxy.demo.report import build_report, render_text
from acp_proxy.demo.session import DEFAULT_PACE_MS, DEFAULT_TIMEOUT_S, DemoError, run_session


@contextlib.contextmanager
def _bundled_config() -> Iterator[Path]:
    ref = resources.files("acp_proxy") / "data" / "default.yaml"
    with resources.as_file(ref) as path:
        if not path.is_file():
            raise DemoError(f"the bundled rules file is missing: {path}")
        yield path


def _child_env() -> dict[str, str]:
    """The inherited environment, with this very package first on the children's import path."""
    env = dict(os.environ)
    package_parent = str(Path(acp_proxy.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH", "")) if p)
    return env


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="acp-proxy demo",
        description=(
            "Run the bundled example rules between a scripted ACP v2 client and a scripted ACP v2 "
            "agent, and show what the agent sent, what the client received, and the metadata the "
            "client stores per entity."
        ),
    )
    parser.add_argument("--json", action="store_true", help="print a machine-readable transcript")
    parser.add_argument(
        "--config", metavar="FILE", help="use these rules instead of the bundled default.yaml"
    )
    parser.add_argument(
        "--pace-ms",
        type=int,
        default=DEFAULT_PACE_MS,
        metavar="N",
        help=(
            "the agent waits N ms after each update so the proxy is never under backpressure "
            f"(default {DEFAULT_PACE_MS}); 0 sends a burst, which the proxy may coalesce"
        ),
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help=f"give up on a run after this long (default {DEFAULT_TIMEOUT_S:g})",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the demo; 0 on success, 2 for a rules file the proxy refuses, 1 when the proxy or the
    agent failed (message on stderr)."""
    args = _parser().parse_args(argv)
    agent = [sys.executable, "-m", "acp_proxy.demo.agent", "--pace-ms", str(args.pace_ms)]
    env = _child_env()
    try:
        with contextlib.ExitStack() as stack:
            if args.config is not None:
                config = Path(args.config)
            else:
                config = stack.enter_context(_bundled_config())
            # Read the rules here first: a bad file is the user's config error (exit 2, with
            # FILE:LINE as the proxy says it), not a proxy that failed behind the demo.
            rules = _describe_rules(config)
            if rules is None:
                return 2
            proxy = [sys.executable, "-m", "acp_proxy", "--config", str(config), "--", *agent]
            direct = run_session(agent, env, args.timeout)
            proxied = run_session(proxy, env, args.timeout)
            if proxied.returncode not in (0, None):
                raise DemoError(
                    f"the proxy exited with status {proxied.returncode}"
                    + (f"\n--- its stderr ---\n{proxied.stderr.strip()}" if proxied.stderr else "")
                )
            shown = [
                "acp-proxy",
                "--config",
                _display_path(config),
                "--",
                "python",
                "-m",
                *agent[2:],
            ]
            report = build_report(_display_path(config), shown, direct, proxied, rules)
    except DemoError as exc:
        print(f"acp-proxy demo: error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        sys.stdout.buffer.write(orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")
    else:
        color = sys.stdout.isatty() and "NO_COLOR" not in os.environ
        sys.stdout.write(render_text(report, color))
    sys.stdout.flush()
    return 0


def _describe_rules(path: Path) -> list[str] | None:
    """One sentence per rule of the file; None (errors printed) when the file is refused."""
    from acp_proxy.cli.options import load_or_report
    from acp_proxy.config.explain import describe_rule

    config = load_or_report(str(path), instantiate=False)
    return None if config is None else [describe_rule(rule) for rule in config.rules]


def _display_path(path: Path) -> str:
    """The rules file as shown: relative to the package for the bundled one (stable output)."""
    package = Path(acp_proxy.__file__).resolve().parent
    with contextlib.suppress(ValueError):
        return str(Path("acp_proxy") / path.resolve().relative_to(package))
    return str(path)


if __name__ == "__main__":
    raise SystemExit(main())
