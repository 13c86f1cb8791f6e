# The C accelerator of acp_proxy.wire.scan (built from _scan.c when a compiler is present).
def scan(raw: bytes, needles: tuple[bytes, ...], /) -> tuple[int, list[tuple[int, int, int]]]: ...
def member_span(
    raw: bytes, path: tuple[bytes, ...], key: bytes, /
) -> tuple[int, int, int, int, int] | None: ...
def numbers_risky(raw: bytes, /) -> bool: ...
def splice_member(
    raw: bytes,
    path: tuple[bytes, ...],
    key: bytes,
    member_key: bytes,
    value: bytes,
    expect: bytes | None,
    /,
) -> bytes | None: ...
