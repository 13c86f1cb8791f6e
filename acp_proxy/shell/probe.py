"""The container's health probe (issue 12.3): ``python -m acp_proxy.shell.probe [--pid N]``.

Contract: owns one decision, made for Docker's ``HEALTHCHECK``: is the proxy healthy? It reads
the proxy's command line (``/proc/N/cmdline``, N = 1: the proxy is the container's entrypoint),
and when it has ``--metrics URL`` it asks ``URL/healthz`` (exit 0 on 200, 1 otherwise). Without
``--metrics`` (or with ``ACP_PROXY_HEALTHCHECK=off``) there is nothing to ask: exit 0 (the
container's own life is the proxy's, PID 1). ``ACP_PROXY_HEALTHCHECK_URL`` names the endpoint
explicitly (for ``metrics:`` set in the config file). Standard library only, one short
blocking request with a timeout: it runs every interval in its own process.
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


def _cmdline(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return [os.fsdecode(a) for a in f.read().split(b"\0") if a]


def healthz(url: str) -> tuple[bool, str]:
    """GET ``/healthz`` at a ``tcp://HOST:PORT`` or ``unix:///PATH`` URL: (healthy, why)."""
    scheme, _, rest = url.partition("://")
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


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    pid = int(args[args.index("--pid") + 1]) if "--pid" in args else 1
    if os.environ.get("ACP_PROXY_HEALTHCHECK", "").lower() == "off":
        return 0
    url = os.environ.get("ACP_PROXY_HEALTHCHECK_URL") or None
    if url is None:
        try:
            url = metrics_url(_cmdline(pid)[1:])
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
