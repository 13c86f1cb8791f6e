"""Refusing to start: an error found before the session starts reaches every reader.

Contract: owns what follows an error that stops the proxy before its session (a config error, a
usage error found after parsing, a log file that cannot be opened), once whoever found it
printed it on stderr as ``acp-proxy: MESSAGE``: the error is written to the log (the
``--log-file``, or the JSON log on stderr) as a ``cannot start`` event, and, when stdout is the
protocol (not ``--listen``; stdin not a terminal), each request the client sends is answered
with a ``-32603`` error ``acp-proxy could not start (MESSAGE) during METHOD``
(``startfail.answer_refusal``), as when the agent command cannot be started: an editor shows
that, where it saw its connection close before. Returns the exit code it was given; it never
starts anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from acp_proxy.cli.options import log_level_of


def refuse_start(args: Any, messages: Sequence[str], code: int, *, logging_ready: bool) -> int:
    """Log ``messages``, answer the client's requests with them, and return ``code``.

    ``logging_ready``: the log was set up already (or is what failed); else it is set up from
    ``args`` when it is a log file or the JSON log (the console on stderr has the message)."""
    from acp_proxy.shell.log import logsetup

    if not logging_ready and (args.log_file or args.log_format == "json"):
        # Only for a log that is not the console on stderr, where the message was printed.
        try:
            level = log_level_of(args, getattr(args, "listen", None) is not None)
            logsetup.configure_logging(level, args.log_format, args.log_file)
            logging_ready = True
        except OSError:
            pass  # the log file is what cannot be opened: it was said on stderr
    if logging_ready:
        log = logsetup.get_logger()
        for message in messages:
            logsetup.log_fatal(log, "cannot start", message)
    if messages and getattr(args, "listen", None) is None:
        import anyio

        from acp_proxy.shell.session.startfail import answer_refusal

        anyio.run(answer_refusal, messages)
    return code
