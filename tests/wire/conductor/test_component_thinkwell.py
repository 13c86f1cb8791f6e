"""``acp-proxy component`` inside the real TypeScript conductor, ``@thinkwell/conductor`` from npm.

The conductor (version pinned in bench/setup_peers.py) is installed by ``python
bench/setup_peers.py`` (CI: .ci/run, which sets ``ACP_PROXY_REQUIRE_CONDUCTOR=1`` so that a
missing conductor fails these tests instead of skipping them). ``ACP_PROXY_CONDUCTOR_MODULE``
may name another install's ``dist/index.js``.

The scripted v2 client (``acp_proxy.demo.run_session``) plays the same session three ways:
directly against the scripted agent, through standalone acp-proxy, and through the conductor
with one or two acp-proxy components. The client must end in the same state as through the
standalone proxy (the rule's keys added to what the agent alone gives), with the frames byte
for byte the same, but for the ``_meta.proxy`` the conductor requires in the component's
initialize answer (which reaches the client: the conductor passes it on).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import anyio
import orjson
import pytest
from proxy_harness import REPO, TESTS, TIMEOUT

pytestmark = pytest.mark.anyio

DRIVER = TESTS / "conductors" / "thinkwell.mjs"
EXACT = TESTS / "conductors" / "annotate-exact.yaml"
AGENT = [sys.executable, "-m", "acp_proxy.demo.agent", "--pace-ms", "2"]
COMPONENT = [sys.executable, "-m", "acp_proxy", "component", "--config", str(EXACT)]
LOGGED = [*COMPONENT, "--log-format", "json"]


def _conductor_module() -> Path:
    named = os.environ.get("ACP_PROXY_CONDUCTOR_MODULE")
    if named:
        return Path(named)
    sys.path.insert(0, str(REPO / "bench"))
    try:
        from setup_peers import conductor_module
    finally:
        sys.path.remove(str(REPO / "bench"))
    return Path(conductor_module(REPO / "bench" / "build"))


@pytest.fixture(scope="module")
def conductor() -> Path:
    module = _conductor_module()
    missing = None
    if shutil.which("node") is None:
        missing = "node is not installed"
    elif not module.exists():
        missing = f"{module} is missing (python bench/setup_peers.py installs it)"
    if missing is not None:
        if os.environ.get("ACP_PROXY_REQUIRE_CONDUCTOR") == "1":
            pytest.fail(f"the TypeScript conductor is required here: {missing}")
        pytest.skip(f"the TypeScript conductor: {missing}")
    return module


def _session(argv: list[str], module: Path | None = None) -> object:
    from acp_proxy import demo
    from acp_proxy.demo import session as demo_session

    env = demo._child_env()
    if module is not None:
        env["CONDUCTOR_MODULE"] = str(module)
    return demo_session.run_session(argv, env, TIMEOUT)


# The runs without the conductor are the same for every test: made once.
_RUNS: dict[tuple[str, ...], object] = {}


async def _once(argv: list[str]) -> object:
    key = tuple(argv)
    if key not in _RUNS:
        _RUNS[key] = await anyio.to_thread.run_sync(_session, argv)
    return _RUNS[key]


def _state(record: object) -> object:
    from acp_proxy.demo import session as demo_session
    from acp_proxy.meta.state import ClientModel

    assert isinstance(record, demo_session.SessionRecord)
    model = ClientModel(record.negotiated_version)
    for frame in record.received:
        if isinstance(frame.message, dict):
            model.apply(frame.message)
    return model.snapshot()


@pytest.mark.parametrize("components", [1, 2])
async def test_thinkwell_chain_reaches_the_standalone_client_state(
    conductor: Path, components: int
) -> None:
    from acp_proxy.demo import session as demo_session
    from acp_proxy.demo import stored

    chain = ["node", str(DRIVER), *[json.dumps(LOGGED)] * components, json.dumps(AGENT)]
    standalone = [*COMPONENT[:3], "--config", str(EXACT), "--", *AGENT]
    direct = await _once(AGENT)
    alone = await _once(standalone)
    chained = await anyio.to_thread.run_sync(_session, chain, conductor)
    for record in (direct, alone, chained):
        assert isinstance(record, demo_session.SessionRecord)
    assert isinstance(chained, demo_session.SessionRecord) and isinstance(
        alone, demo_session.SessionRecord
    )
    assert isinstance(direct, demo_session.SessionRecord)

    # the same client state as through standalone acp-proxy, which is the agent's own state
    # with the rule's keys added
    assert _state(chained) == _state(alone)
    assert stored.final_meta(chained) == stored.final_meta(alone)
    before = stored.final_meta(direct)
    added = set()
    for name, meta in stored.final_meta(chained).items():
        own = before.get(name)
        for key, val in (meta if isinstance(meta, dict) else {}).items():
            if not isinstance(own, dict) or own.get(key) != val:
                added.add(key)
    assert added == {"example.dev/route"}

    # byte for byte, but for the proxy acceptance in the initialize answer
    got = [f.raw for f in chained.received]
    init = orjson.loads(got[0])
    assert init["result"].pop("_meta") == {"proxy": True}
    assert orjson.dumps(init) == alone.received[0].raw
    rest = got[1:]
    if components == 2:  # the second component repeats the first one's follow-up to a clear
        rest = [raw for i, raw in enumerate(rest) if i == 0 or rest[i - 1] != raw]
    assert rest == [f.raw for f in alone.received[1:]]
    # each component ended on its own when the conductor closed its input, before the
    # conductor's SIGTERM (250 ms later), with its exit logged
    events = [orjson.loads(line) for line in chained.stderr.splitlines() if line.startswith("{")]
    exits = [e for e in events if e.get("event") == "exit"]
    assert [(e["exit_code"], e["dialect"]) for e in exits] == [(0, "thinkwell")] * components
    assert not [e for e in events if "signal" in str(e.get("event"))]
