"""One HTTP request on a fresh connection, as the live-view tests make them."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit


def http(url: str, target: str, method: str = "GET", **headers: str) -> tuple[int, bytes]:
    """One request on a fresh connection: (status, the whole response)."""
    parts = urlsplit(url)
    fields = {"Host": parts.netloc, **{k.replace("_", "-"): v for k, v in headers.items()}}
    head = f"{method} {target} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields.items())
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        sock.sendall((head + "\r\n").encode())
        sock.settimeout(0.5)
        data = b""
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except TimeoutError:
            pass  # an event stream stays open
    return int(data.split(b" ", 2)[1]), data
