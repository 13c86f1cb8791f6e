"""Tracing holds bounded memory whatever peers send and whether or not the collector answers
(attribute limits, a byte budget on spans awaiting export), and the OpenTelemetry SDK's own
messages go through the proxy's logging, rate-limited (also as JSON and into ``--log-file``)."""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from proxy_harness import FAKE_AGENT, init_response, proxy_env, request, run

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import TracerProvider

from acp_proxy.shell.telemetry.trace_bounds import (
    MAX_ATTRIBUTE_CHARS,
    ByteBudget,
    estimate,
    span_limits,
)

PROXY = [sys.executable, "-m", "acp_proxy", "--log-format", "json"]


class Holder:
    """A span processor that keeps every span it is given: a collector that never answers."""

    def __init__(self) -> None:
        self.spans: list[Any] = []

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        pass

    def on_end(self, span: Any) -> None:
        self.spans.append(span)

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 0) -> bool:
        return True


def test_a_huge_attribute_is_cut_and_spans_awaiting_export_are_bounded_in_bytes() -> None:
    holder = Holder()
    budget = ByteBudget(holder, budget=1024 * 1024)
    provider = TracerProvider(span_limits=span_limits({}), shutdown_on_exit=False)
    provider.add_span_processor(budget)  # type: ignore[arg-type]
    tracer = provider.get_tracer("t")
    message = "x" * (16 * 1024 * 1024)  # a 16 MiB error message from a peer
    for _ in range(1000):
        span = tracer.start_span("session/prompt")
        span.set_attribute("rpc.jsonrpc.error_message", message)
        span.end()
    kept = holder.spans
    assert all(len(s.attributes["rpc.jsonrpc.error_message"]) == MAX_ATTRIBUTE_CHARS for s in kept)
    assert budget.held == sum(estimate(s) for s in kept) <= 1024 * 1024
    assert budget.dropped == 1000 - len(kept) > 0
    # Exported (the processor lets go of them): their share is released, nothing drifts.
    holder.spans = []
    del kept, span
    gc.collect()
    assert budget.held == 0


def test_span_limits_leave_the_users_otel_variables_in_charge() -> None:
    ours = span_limits({})
    assert ours.max_attribute_length == MAX_ATTRIBUTE_CHARS
    theirs = span_limits({"OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "10"})
    # None: the SDK reads the variable itself (here from the real environment: unset).
    assert theirs.max_attribute_length is None or theirs.max_attribute_length != 4096


@pytest.mark.anyio
@pytest.mark.parametrize("log_file", [False, True])
async def test_sdk_warnings_go_through_the_proxys_logging_rate_limited(
    tmp_path: Path, log_file: bool
) -> None:
    """Invalid ``baggage`` on every request makes the SDK warn each time: the proxy logs the
    first as one of its own events (JSON here) and counts the rest; nothing else is printed."""
    config = tmp_path / "proxy.yaml"
    config.write_text("tracing: {enabled: true}\n")
    meta = {
        "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "baggage": "this is not baggage",
    }
    frames = [request(0, "initialize", {"protocolVersion": 2})]
    frames += [request(i, "_test/echo", {"n": i, "_meta": meta}) for i in range(1, 301)]
    log = tmp_path / "proxy.log"
    extra = ["--log-file", str(log)] if log_file else []
    ran = await run(
        [*PROXY, *extra, "--config", str(config), "--", sys.executable, str(FAKE_AGENT)],
        b"".join(frames),
        env=proxy_env(OTEL_TRACES_EXPORTER="none"),
        timeout=60,
    )
    assert ran.rc == 0
    assert len(ran.stdout.splitlines()) == 301
    assert ran.stdout.splitlines()[0] == init_response(0).rstrip(b"\n")
    text = log.read_bytes() if log_file else ran.stderr
    if log_file:
        assert ran.stderr == b""
    events = [json.loads(line) for line in text.splitlines()]  # every line is a JSON event
    sdk = [e for e in events if e["event"] == "opentelemetry sdk"]
    assert len(sdk) == 1
    assert sdk[0]["logger"].startswith("opentelemetry.baggage")
    assert sdk[0]["level"] == "warning"
    assert orjson.loads(ran.stdout.splitlines()[1])["id"] == 1


@pytest.mark.anyio
async def test_tracing_passes_nothing_to_the_agent_and_keeps_the_users_otel_variables(
    tmp_path: Path,
) -> None:
    """The agent's environment is the same with tracing on as off (the SDK is configured in
    the proxy's process, never through variables the agent inherits); the user's ``OTEL_*``
    reach it unchanged, and only ``agent.env`` adds to it."""
    dump = (
        "import json, os, sys; "
        "open(sys.argv[1], 'w').write(json.dumps(dict(os.environ), sort_keys=True))"
    )
    user = {"OTEL_SERVICE_NAME": "users-own", "OTEL_EXPORTER_OTLP_HEADERS": "k=v"}
    envs: list[dict[str, str]] = []
    for config in ("{}\n", "tracing: {enabled: true, inject: true}\n", "agent: {env: {X: y}}\n"):
        (tmp_path / "proxy.yaml").write_text(config)
        out = tmp_path / f"env{len(envs)}.json"
        cmd = [*PROXY, "--config", str(tmp_path / "proxy.yaml"), "--", sys.executable, "-c", dump]
        ran = await run(
            [*cmd, str(out)], b"", env=proxy_env(OTEL_TRACES_EXPORTER="none", **user), timeout=60
        )
        assert ran.rc == 0, ran.stderr
        env = json.loads(out.read_text())
        del env["ACP_PROXY_SESSION"]  # the proxy's marker for its exit sweep: differs per run
        envs.append(env)
    plain, traced, configured = envs
    assert traced == plain
    assert {k: plain[k] for k in user} == user
    assert configured == {**plain, "X": "y"}
