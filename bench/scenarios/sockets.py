"""Scenario 5: TCP and Unix-socket throughput relative to stdio (``--listen``).

Contract: streams the mixed-v2 data set through the proxy listening on TCP and on a Unix socket
and reports each against the same run over stdio; the peers get an "n/a" row each (neither can
listen). Measures; never asserts.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from generate import Dataset, ensure
from harness import (
    BENCH,
    PY,
    Exit,
    Harness,
    Run,
    drain,
    env_with,
    read_agent_rusage,
    tail_of,
    wait_rusage,
)
from rows import Row, fmt, paired_ratios, skipped, stats, status, table
from variants import (
    PEER_NO_LISTEN,
    PEER_TITLES,
)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sk:
        sk.bind(("127.0.0.1", 0))
        return int(sk.getsockname()[1])


@contextmanager
def listening_proxy(
    h: Harness, url: str, ds: Dataset
) -> Iterator[tuple[subprocess.Popen[bytes], Path, Path]]:
    agent_ru = h.tmp("sock-agent-rusage.json")
    stderr_path = h.tmp("sock-proxy-stderr.log")
    agent = [PY, str(BENCH / "replay_agent.py"), ds.agent_path]
    with open(stderr_path, "wb") as err:
        proc = subprocess.Popen(
            h.proxy_argv(h.s.passthrough_config, agent, ["--listen", url]),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=env_with(BENCH_AGENT_RUSAGE=str(agent_ru)),
            start_new_session=True,
        )
    try:
        yield proc, stderr_path, agent_ru
    finally:
        if proc.returncode is None:
            with suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            wait_rusage(proc, 15)


def connect(url: str, proc: subprocess.Popen[bytes], timeout: float = 15.0) -> socket.socket | None:
    """Connect to the proxy's listener; None when the proxy exited (e.g. rejected --listen)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return None
        try:
            if url.startswith("unix://"):
                sk = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sk.connect(url.removeprefix("unix://"))
            else:
                host, port = url.removeprefix("tcp://").rsplit(":", 1)
                sk = socket.create_connection((host, int(port)), timeout=5)
            sk.settimeout(None)
            return sk
        except OSError:
            time.sleep(0.02)
    return None


def socket_stream(h: Harness, url: str, ds: Dataset) -> tuple[Run | None, str]:
    """One stream over a socket; (None, why) when the proxy does not listen."""
    with listening_proxy(h, url, ds) as (proc, stderr_path, agent_ru):
        sk = connect(url, proc)
        if sk is None:
            proc.poll()
            return None, tail_of(stderr_path, 1)
        with sk:
            feeder = threading.Thread(
                target=lambda: _sock_feed(sk, Path(ds.client_path).read_bytes()), daemon=True
            )
            feeder.start()
            sink = drain(sk.fileno(), h.timeout_for(ds))
        with suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        rx = wait_rusage(proc, 15)
        agent_cpu, _ = read_agent_rusage(agent_ru)
        run = h._result(
            ds,
            sink,
            Exit(0 if rx.code is not None else None, rx.cpu_s, rx.maxrss_kb),
            time.perf_counter(),
            cpu_s=rx.cpu_s - agent_cpu,
        )
        if not run.ok:
            run.error = f"{run.error}; proxy stderr: {tail_of(stderr_path)}"
        return run, ""


def _sock_feed(sk: socket.socket, data: bytes) -> None:
    with suppress(OSError):
        sk.sendall(data)


def run(h: Harness, log: Callable[[str], None]) -> list[Row]:
    # Neither peer can listen; one explicit "n/a" row each (or why it is missing).
    peer_rows = [
        skipped(5, "mixed-v2", p, t, h.peer_errors.get(p) or PEER_NO_LISTEN[p])
        for p, t in PEER_TITLES.items()
    ]
    return proxy_socket_rows(h, log) + peer_rows


def proxy_socket_rows(h: Harness, log: Callable[[str], None]) -> list[Row]:
    s = h.s
    titles = {
        "stdio": "acp-proxy over stdio (reference)",
        "tcp": "acp-proxy --listen tcp://127.0.0.1:PORT",
        "unix": "acp-proxy --listen unix:///PATH",
    }
    reason = h.skip_reason("proxy-passthrough")
    if reason:
        return [skipped(5, "mixed-v2", v, t, reason) for v, t in titles.items()]
    ds = ensure(s.data_dir, "mixed", 2, s.size, s.seed)
    probe, why = socket_stream(h, f"tcp://127.0.0.1:{free_port()}", ds)
    if probe is None:
        log(f"  s5: n/a (sockets not available): {why}")
        return [
            skipped(5, "mixed-v2", v, t, f"n/a (sockets not available): {why}")
            for v, t in titles.items()
        ]
    runs: dict[str, list[Run]] = {v: [] for v in titles}
    for _ in range(s.reps):
        runs["stdio"].append(h.stream("proxy-passthrough", ds))
        r, _ = socket_stream(h, f"tcp://127.0.0.1:{free_port()}", ds)
        runs["tcp"].append(r or Run(False, "listener went away"))
        sock_path = s.work_dir / f"acp-{len(runs['unix'])}.sock"
        r, _ = socket_stream(h, f"unix://{sock_path}", ds)
        runs["unix"].append(r or Run(False, "listener went away"))

    def mb_s(r: Run) -> float:
        return ds.bytes / r.xfer_s / 1e6

    rows: list[Row] = []
    for v, t in titles.items():
        ok = [r for r in runs[v] if r.ok]
        if not ok:
            rows.append(
                Row(5, "mixed-v2", v, t, "error", runs[v][0].error if runs[v] else "no run")
            )
            continue
        rows.append(
            Row(
                5,
                "mixed-v2",
                v,
                t,
                metrics={"mb_s": stats([mb_s(r) for r in ok])},
                ratios={"stdio": paired_ratios(runs, v, "stdio", mb_s)},
                check={"identical": [r.identical for r in runs[v]]},
            )
        )
    return rows


def markdown(rows: list[dict[str, Any]], out: list[str]) -> None:
    """Section 5: the socket transports table."""
    out.append("### 5. Socket transports (mixed-v2, pass-through rules)")
    out.append("")
    body = []
    for r in rows:
        if r["scenario"] != 5:
            continue
        st = status(r)
        body.append(
            [r["title"]]
            + ([st, ""] if st else [fmt(r["metrics"]["mb_s"]), fmt(r["ratios"]["stdio"], 2)])
        )
    table(out, ["transport", "MB/s", "vs stdio"], body)
