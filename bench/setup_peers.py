"""Bench set-up step: install the peers the proxy is measured against.

Contract: ``python bench/setup_peers.py [--build-dir DIR]`` installs, into ``DIR/peers``
(default ``bench/build/peers``, gitignored), the TypeScript conductor ``@thinkwell/conductor``
(npm) and the Python SDK ``agent-client-protocol`` (pip ``--target``), pinned. Idempotent: an
install already there is kept. ``ensure(build_dir)`` returns, per peer, ``None`` when it is
ready or the reason it is not (no npm, no network, ...): bench/run.py skips that peer's rows
with the reason. ``--only PEER`` (repeatable) installs those peers alone and exits 1 when one is
not ready (.ci/run): ``conductor`` for the tests through the real conductor
(tests/wire/conductor/test_component_thinkwell.py), ``ts-sdk`` for the official TypeScript SDK
``@agentclientprotocol/sdk`` (npm, the version whose schemas are in tests/schemas), which runs the
v2 agent of the turn telemetry tests (tests/agents/ts_sdk_v2_agent.mjs); the bench does not use
it, so only ``--only ts-sdk`` installs it.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from collections.abc import Collection
from pathlib import Path

CONDUCTOR = "@thinkwell/conductor@0.5.7"
SDK = "agent-client-protocol==0.12.1"
TS_SDK = "@agentclientprotocol/sdk@2.4.0"
# Node 20 has no WebSocket global: the SDK's WebSocket client (`experimental/ws-client`) takes the
# `ws` package's constructor (tests/shell/ws/test_websocket_sdk.py); installed with the SDK.
TS_WS = "ws@8.23.1"
BENCH_PEERS = ("conductor", "sdk-relay")
BENCH = Path(__file__).resolve().parent


def conductor_module(build_dir: Path) -> Path:
    return build_dir / "peers" / "node_modules" / "@thinkwell" / "conductor" / "dist" / "index.js"


def ts_sdk_v2_module(build_dir: Path) -> Path:
    """The TypeScript SDK's ACP v2 entry point (``@agentclientprotocol/sdk/experimental/v2``)."""
    sdk = build_dir / "peers" / "node_modules" / "@agentclientprotocol" / "sdk"
    return sdk / "dist" / "v2" / "stable" / "acp.js"


def ts_ws_module(build_dir: Path) -> Path:
    """The ``ws`` package's ES module entry (its ``WebSocket`` takes headers)."""
    return build_dir / "peers" / "node_modules" / "ws" / "wrapper.mjs"


def sdk_path(build_dir: Path) -> Path:
    return build_dir / "peers" / "py"


def _run(argv: list[str], cwd: Path) -> str | None:
    try:
        proc = subprocess.run(
            argv, cwd=cwd, capture_output=True, text=True, timeout=600, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{argv[0]}: {exc}"
    if proc.returncode != 0:
        return f"{' '.join(argv[:3])} failed: {proc.stderr.strip()[-300:]}"
    return None


def ensure(
    build_dir: Path, *, install: bool = True, only: Collection[str] | None = None
) -> dict[str, str | None]:
    """Per peer (``conductor``, ``sdk-relay``; ``ts-sdk`` when named in ``only``): None when
    ready, else why not. Without ``install``, only what is already there counts; with ``only``,
    those peers alone."""
    wanted = BENCH_PEERS if only is None else tuple(only)
    peers = build_dir / "peers"
    out: dict[str, str | None] = {}
    if not install:
        missing = "not installed (run python bench/setup_peers.py)"
        there = {
            "conductor": conductor_module(build_dir).exists(),
            "sdk-relay": (sdk_path(build_dir) / "acp" / "connection.py").exists(),
            "ts-sdk": ts_sdk_v2_module(build_dir).exists() and ts_ws_module(build_dir).exists(),
        }
        return _needs_node({peer: None if there[peer] else missing for peer in wanted})
    peers.mkdir(parents=True, exist_ok=True)
    npm_peers = {
        "conductor": ((CONDUCTOR,), (conductor_module,)),
        "ts-sdk": ((TS_SDK, TS_WS), (ts_sdk_v2_module, ts_ws_module)),
    }
    for peer, (specs, modules) in npm_peers.items():
        if peer not in wanted:
            continue
        if all(module(build_dir).exists() for module in modules):
            out[peer] = None
        elif shutil.which("npm") is None or shutil.which("node") is None:
            out[peer] = "npm/node not installed"
        else:
            npm = ["npm", "install", "--silent", "--no-audit", "--no-fund", *specs]
            out[peer] = _run(npm, peers)
            for module in modules:
                if out[peer] is None and not module(build_dir).exists():
                    out[peer] = f"npm install left no {module(build_dir).name}"
    if "sdk-relay" in wanted:
        if (sdk_path(build_dir) / "acp" / "connection.py").exists():
            out["sdk-relay"] = None
        else:
            target = str(sdk_path(build_dir))
            pip = [sys.executable, "-m", "pip", "install", "-q", "--target", target, SDK]
            out["sdk-relay"] = _run(pip, peers)
    return _needs_node(out)


def _needs_node(out: dict[str, str | None]) -> dict[str, str | None]:
    """An installed npm peer still needs ``node`` on PATH to run."""
    for peer in ("conductor", "ts-sdk"):
        if peer in out and out[peer] is None and shutil.which("node") is None:
            out[peer] = "node not installed"
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--build-dir", type=Path, default=BENCH / "build")
    ap.add_argument(
        "--only",
        action="append",
        choices=("conductor", "ts-sdk"),
        help="install that peer alone, repeatable (CI: the conductor and TypeScript SDK tests)",
    )
    a = ap.parse_args()
    ready = True
    for peer, reason in ensure(a.build_dir.resolve(), only=a.only).items():
        print(f"{peer}: {'ready' if reason is None else reason}")
        ready = ready and reason is None
    return 0 if ready or a.only is None else 1


if __name__ == "__main__":
    sys.exit(main())
