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
        # The first bytes may take a while (a route answers once the hub described what it was
        # told, on a loaded machine seconds); after them, half a second of silence ends the read
        # (an event stream stays open).
        data = sock.recv(65536)
        sock.settimeout(0.5)
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except TimeoutError:
            pass
    return int(data.split(b" ", 2)[1]), data
