"""The container's health probe: ``python -m acp_proxy.shell.telemetry.probe [--pid N]``.

Contract: owns one decision, made for Docker's ``HEALTHCHECK``: is the proxy healthy? It finds
the proxy's process (PID 1 when the proxy is the container's entrypoint; with ``docker run
--init`` or another init as PID 1, the child of PID 1 that is ``acp-proxy``; ``--pid N`` names
it), reads its command line, and when it has ``--metrics URL`` asks ``URL/healthz`` (exit 0 on
200, 1 otherwise). No proxy process at all is unhealthy (exit 1). Without ``--metrics`` (or with
``ACP_PROXY_HEALTHCHECK=off``) there is nothing to ask: exit 0 (the proxy's process is alive).
``ACP_PROXY_HEALTHCHECK_URL`` names the endpoint explicitly (for ``metrics:`` set in the config
file). Standard library only, one short blocking request with a timeout: it runs every interval
in its own process.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Sequence

TIMEOUT_S = 3.0


def metrics_url(argv: Sequence[str]) -> str | None:
    """The ``--metrics`` URL of an ``acp-proxy`` command line (options before ``--``)."""
    for i, arg in enumerate(argv):
        if arg == "--":
            return None
        if arg == "--metrics" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--metrics="):
            return arg.partition("=")[2]
    return None


def _cmdline(pid: int, proc: str = "/proc") -> list[str]:
    with open(f"{proc}/{pid}/cmdline", "rb") as f:
        return [os.fsdecode(a) for a in f.read().split(b"\0") if a]


def is_proxy(argv: Sequence[str]) -> bool:
    """Whether a command line runs acp-proxy (the script, or ``python -m acp_proxy``)."""
    if not argv:
        return False
    prog = os.path.basename(argv[0])
    return prog == "acp-proxy" or (
        prog.startswith("python") and list(argv[1:3]) == ["-m", "acp_proxy"]
    )


def _parent(pid: int, proc: str) -> int | None:
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            stat = f.read()
        # pid (comm) state ppid ...: comm may hold spaces and parentheses, so split after the last.
        return int(stat[stat.rindex(b")") + 2 :].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def find_proxy(proc: str = "/proc") -> int | None:
    """PID 1 when it is acp-proxy, else the lowest child of PID 1 that is (an init such as
    ``docker run --init``'s runs the entrypoint as its child); None when there is none."""
    try:
        if is_proxy(_cmdline(1, proc)):
            return 1
        pids = sorted(int(name) for name in os.listdir(proc) if name.isdigit())
    except OSError:
        return None
    for pid in pids:
        if pid != 1 and _parent(pid, proc) == 1:
            try:
                if is_proxy(_cmdline(pid, proc)):
                    return pid
            except OSError:
                continue
    return None


def healthz(url: str) -> tuple[bool, str]:
    """GET ``/healthz`` at a ``tcp://HOST:PORT`` or ``unix:///PATH`` URL (or another form
    ``--metrics`` accepts: ``HOST:PORT``, ``http://HOST:PORT``): (healthy, why)."""
    from acp_proxy.telemetry.endpoint import endpoint_url as listener_form

    scheme, _, rest = listener_form(url).partition("://")
    try:
        if scheme == "unix":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(TIMEOUT_S)
            sock.connect(rest)
        else:
            host, _, port = rest.rpartition(":")
            host = host.strip("[]")
            # A wildcard bind is reached through loopback.
            host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
            sock = socket.create_connection((host, int(port)), timeout=TIMEOUT_S)
        with sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n")
            data = b""
            while len(data) < 4096:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                data += chunk
    except (OSError, ValueError) as exc:
        return False, f"{url}/healthz: {exc}"
    status = data.split(b"\r\n", 1)[0].decode("latin-1", "replace")
    return status.split(" ")[1:2] == ["200"], f"{url}/healthz: {status or 'no answer'}"


def main(argv: Sequence[str] | None = None, proc: str = "/proc") -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if os.environ.get("ACP_PROXY_HEALTHCHECK", "").lower() == "off":
        return 0
    url = os.environ.get("ACP_PROXY_HEALTHCHECK_URL") or None
    if url is None:
        found = int(args[args.index("--pid") + 1]) if "--pid" in args else find_proxy(proc)
        if found is None:
            print("acp-proxy probe: no acp-proxy process (neither PID 1 nor a child of it)")
            return 1
        pid = found
        try:
            url = metrics_url(_cmdline(pid, proc)[1:])
        except OSError as exc:
            print(f"acp-proxy probe: cannot read the command line of PID {pid}: {exc}")
            return 1
    if url is None:
        print("acp-proxy probe: metrics not enabled (no --metrics); nothing to check")
        return 0
    healthy, why = healthz(url)
    print(f"acp-proxy probe: {why}")
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
