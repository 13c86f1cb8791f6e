"""The block scan (``acp_proxy.wire.raw.block_scan``): the pure-Python scanner and the C
accelerator give
exactly the result of the definition (split into lines, test each line), on ordinary and hostile
input; the C one is chosen at import unless ``ACP_PROXY_PURE_PYTHON=1``, and ``--version`` says
which one runs. Both scanners are tested in every run (the C one when it is built; CI requires
it where a C compiler exists, see .ci/run)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from acp_proxy.wire.raw import block_scan as scan_module
from acp_proxy.wire.raw.block_scan import ScanResult, scan_py

Scanner = Callable[[bytes, tuple[bytes, ...]], ScanResult]

try:
    from acp_proxy.wire.raw import _scan

    C_SCAN: Scanner | None = _scan.scan
    C_CONTAINS: Callable[[bytes, bytes], bool] | None = _scan.contains
except ImportError:
    C_SCAN = None
    C_CONTAINS = None

needs_c = pytest.mark.skipif(C_SCAN is None, reason="the C accelerator is not built")
SCANNERS = [
    pytest.param(scan_py, id="python"),
    pytest.param(C_SCAN, id="c", marks=needs_c),
]


def definition(raw: bytes, needles: tuple[bytes, ...]) -> ScanResult:
    """What ``scan`` returns, written the obvious way."""
    lines = raw.split(b"\n")
    specials = []
    start = 0
    for index, line in enumerate(lines):
        stop = start + len(line)
        if not line.startswith(b'{"') or any(n in line for n in needles):
            specials.append((index, start, stop))
        start = stop + 1
    return len(lines), specials


ID = b'"id"'
NOTE = b'{"jsonrpc":"2.0","method":"session/update","params":{"x":"y"}}'  # 62 bytes
REQ = b'{"jsonrpc":"2.0","id":1,"method":"m"}'  # 37 bytes


@pytest.mark.parametrize("scanner", SCANNERS)
@pytest.mark.parametrize(
    ("raw", "needles", "expected"),
    [
        (NOTE, (ID,), (1, [])),
        (NOTE + b"\n" + NOTE, (ID,), (2, [])),
        (NOTE + b"\n" + REQ + b"\n" + NOTE, (ID,), (3, [(1, 63, 100)])),
        # Several needles and several hits on one line: the line is listed once.
        (REQ, (ID, b'"m"', b"json"), (1, [(0, 0, 37)])),
        # Lines that do not start like ``{"``: a batch, blank, whitespace first, text, ``{`` alone.
        (b"[" + NOTE + b"]\n" + NOTE, (), (2, [(0, 0, 64)])),
        (NOTE + b"\n\n" + NOTE, (), (3, [(1, 63, 63)])),
        (NOTE + b"\n", (), (2, [(1, 63, 63)])),
        (b"\n", (), (2, [(0, 0, 0), (1, 1, 1)])),
        (b"", (ID,), (1, [(0, 0, 0)])),
        (b' {"a":1}\nhello\n{\n{"', (), (4, [(0, 0, 8), (1, 9, 14), (2, 15, 16)])),
        (b'{"a":1}\r\n\r', (), (2, [(1, 9, 10)])),
        # A needle at the very start and the very end of lines.
        (b'{"a"\n{"b"', (b'{"a', b'b"'), (2, [(0, 0, 4), (1, 5, 9)])),
        # An empty needle occurs in every line; one holding a newline in none.
        (NOTE + b"\n" + NOTE, (b"",), (2, [(0, 0, 62), (1, 63, 125)])),
        (b'{"a"\n{"b"', (b'"\n{',), (2, [])),
        # A needle longer than the line, and NUL bytes.
        (b'{"\x00"}', (b'{"\x00"}x', b"\x00\x00"), (1, [])),
        (b'{"\x00"}', (b'"\x00"',), (1, [(0, 0, 5)])),
    ],
)
def test_scan_examples(
    scanner: Scanner, raw: bytes, needles: tuple[bytes, ...], expected: ScanResult
) -> None:
    assert definition(raw, needles) == expected
    assert scanner(raw, needles) == expected


# Hostile input: few distinct bytes, so needles hit often, at line edges and across newlines.
ALPHABET = b'{"}\n\r\\u/id \x00[a'
hostile_bytes = st.lists(st.sampled_from(list(ALPHABET)), max_size=300).map(bytes)
# Needles are at most 40 bytes: drawn at that size (drawing 300 bytes to keep 40 made this the
# slowest property of the suite).
hostile_needle = st.lists(st.sampled_from(list(ALPHABET)), max_size=40).map(bytes)


@st.composite
def block_and_needles(draw: st.DrawFn) -> tuple[bytes, tuple[bytes, ...]]:
    parts = draw(
        st.lists(st.one_of(hostile_bytes, st.sampled_from([NOTE, REQ, b'{"'])), max_size=8)
    )
    raw = b"\n".join(parts) if draw(st.booleans()) else b"".join(parts)
    needles: list[bytes] = []
    for _ in range(draw(st.integers(0, 40))):
        if raw and draw(st.booleans()):
            start = draw(st.integers(0, len(raw) - 1))  # a substring of the block: a hit
            needles.append(raw[start : start + draw(st.integers(0, 40))])
        else:
            needles.append(draw(hostile_needle))
    return raw, tuple(needles)


@pytest.mark.parametrize("scanner", SCANNERS)
@settings(max_examples=400, deadline=None)
@given(block_and_needles())
def test_scan_is_the_definition(scanner: Scanner, case: tuple[bytes, tuple[bytes, ...]]) -> None:
    raw, needles = case
    assert scanner(raw, needles) == definition(raw, needles)


@needs_c
@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 200), min_size=1, max_size=6),
    st.integers(2, 40),
    st.data(),
)
def test_c_and_python_agree_on_needles_at_every_offset(
    lengths: list[int], k: int, data: st.DataObject
) -> None:
    """Lines of lengths around the 16-byte steps of the C search, a needle of 2..40 bytes
    (or a near miss of it) placed at a drawn offset of a drawn line, or nowhere: the edges of
    the 16-byte steps, the tail, and candidates that pass the first/last-byte filter only."""
    needle = b'"' + bytes([0x41 + i % 26 for i in range(k - 2)]) + b'"'
    lines = [b'{"' + b"x" * n for n in lengths]
    which = data.draw(st.integers(0, len(lines)))
    if which < len(lines):
        at = data.draw(st.integers(0, len(lines[which])))
        placed = needle
        if data.draw(st.booleans()):  # a near miss: one byte of the needle changed
            j = data.draw(st.integers(0, k - 1))
            placed = needle[:j] + b"~" + needle[j + 1 :]
        lines[which] = lines[which][:at] + placed + lines[which][at:]
    raw = b"\n".join(lines)
    assert C_SCAN is not None
    assert C_SCAN(raw, (needle,)) == scan_py(raw, (needle,)) == definition(raw, (needle,))


@needs_c
@settings(max_examples=300, deadline=None)
@given(
    st.integers(0, 200),
    st.integers(1, 40),
    st.data(),
)
def test_contains_is_the_definition_at_every_offset(
    length: int, k: int, data: st.DataObject
) -> None:
    """``contains`` (the C one, and ``contains_py``) is ``needle in raw``: a needle of 1..40
    bytes, or a near miss of it, at a drawn offset of a line around the 16-byte steps."""
    needle = b'"' + bytes([0x41 + i % 26 for i in range(k - 2)]) + b'"' if k > 1 else b'"'
    raw = b'{"' + b"x" * length
    if data.draw(st.booleans()):
        at = data.draw(st.integers(0, len(raw)))
        placed = needle
        if data.draw(st.booleans()):
            j = data.draw(st.integers(0, k - 1))
            placed = needle[:j] + b"~" + needle[j + 1 :]
        raw = raw[:at] + placed + raw[at:]
    assert C_CONTAINS is not None
    assert C_CONTAINS(raw, needle) is scan_module.contains_py(raw, needle) is (needle in raw)


@needs_c
@settings(max_examples=200, deadline=None)
@given(hostile_bytes, hostile_needle.map(lambda b: b[:8]))
def test_contains_agrees_on_hostile_bytes(raw: bytes, needle: bytes) -> None:
    assert C_CONTAINS is not None
    assert C_CONTAINS(raw, needle) is (needle in raw)
    assert C_CONTAINS(raw + needle, needle) is True
    with pytest.raises(TypeError):
        C_CONTAINS("text", needle)  # type: ignore[arg-type]


@pytest.mark.parametrize("scanner", SCANNERS)
def test_huge_lines(scanner: Scanner) -> None:
    big = b'{"' + b"a" * (4 << 20)
    raw = b"\n".join([big, big + ID, ID + big, big[:-1] + b"\\u", NOTE])
    needles = (ID, b"\\u", b"\\/")
    assert scanner(raw, needles) == definition(raw, needles)
    assert [s[0] for s in scanner(raw, needles)[1]] == [1, 2, 3]


@pytest.mark.parametrize("scanner", SCANNERS)
def test_many_needles(scanner: Scanner) -> None:
    needles = tuple(b'"k%d"' % i for i in range(100))
    raw = b"\n".join(b'{"a":"k%d"}' % i for i in range(0, 200, 3))
    assert scanner(raw, needles) == definition(raw, needles)
    assert len(scanner(raw, needles)[1]) == 34  # k0, k3, ... k99


@needs_c
def test_c_rejects_wrong_types() -> None:
    assert C_SCAN is not None
    with pytest.raises(TypeError):
        C_SCAN("text", ())  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        C_SCAN(b"x", [b"a"])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        C_SCAN(b"x", ("a",))  # type: ignore[arg-type]


def _scanner_in_subprocess(env: dict[str, str]) -> str:
    ran = subprocess.run(
        [sys.executable, "-c", "from acp_proxy.wire.raw.block_scan import SCANNER; print(SCANNER)"],
        env=env,
        capture_output=True,
        check=True,
        timeout=60,
    )
    return ran.stdout.decode().strip()


def test_the_env_var_forces_the_pure_python_scanner() -> None:
    env = {**os.environ, "ACP_PROXY_PURE_PYTHON": "1"}
    assert _scanner_in_subprocess(env) == "pure Python (ACP_PROXY_PURE_PYTHON=1)"
    env.pop("ACP_PROXY_PURE_PYTHON")
    expected = "C" if C_SCAN is not None else scan_module.SCANNER
    assert _scanner_in_subprocess(env) == expected


def test_the_scanner_in_use_is_the_one_announced() -> None:
    if scan_module.SCANNER == "C":
        assert scan_module.scan is C_SCAN
    else:
        assert scan_module.scan is scan_py
        assert scan_module.SCANNER.startswith("pure Python (")


@pytest.mark.skipif(
    os.environ.get("ACP_PROXY_REQUIRE_C") != "1", reason="ACP_PROXY_REQUIRE_C is not set"
)
def test_the_c_accelerator_is_built_where_ci_requires_it() -> None:
    """.ci/run sets ACP_PROXY_REQUIRE_C=1 when a C compiler exists: the install must have built
    the accelerator (a silent fallback there would hide a broken build)."""
    assert C_SCAN is not None
