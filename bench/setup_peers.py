"""Bench set-up step: install the peers the proxy is measured against (issue 13).

Contract: ``python bench/setup_peers.py [--build-dir DIR]`` installs, into ``DIR/peers``
(default ``bench/build/peers``, gitignored), the TypeScript conductor ``@thinkwell/conductor``
(npm) and the Python SDK ``agent-client-protocol`` (pip ``--target``), pinned. Idempotent: an
install already there is kept. ``ensure(build_dir)`` returns, per peer, ``None`` when it is
ready or the reason it is not (no npm, no network, ...): bench/run.py skips that peer's rows
with the reason. ``--only conductor`` installs the conductor alone and exits 1 when it is not
ready (.ci/run: the tests through the real conductor, tests/test_component_thinkwell.py).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

CONDUCTOR = "@thinkwell/conductor@0.5.7"
SDK = "agent-client-protocol==0.12.1"
BENCH = Path(__file__).resolve().parent


def conductor_module(build_dir: Path) -> Path:
    return build_dir / "peers" / "node_modules" / "@thinkwell" / "conductor" / "dist" / "index.js"


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
    build_dir: Path, *, install: bool = True, only: str | None = None
) -> dict[str, str | None]:
    """Per peer (``conductor``, ``sdk-relay``): None when ready, else why not. Without
    ``install``, only what is already there counts; with ``only``, that peer alone."""
    peers = build_dir / "peers"
    out: dict[str, str | None] = {}
    if not install:
        missing = "not installed (run python bench/setup_peers.py)"
        out["conductor"] = None if conductor_module(build_dir).exists() else missing
        ready = (sdk_path(build_dir) / "acp" / "connection.py").exists()
        out["sdk-relay"] = None if ready else missing
        return _needs_node(out)
    peers.mkdir(parents=True, exist_ok=True)
    if conductor_module(build_dir).exists():
        out["conductor"] = None
    elif shutil.which("npm") is None or shutil.which("node") is None:
        out["conductor"] = "npm/node not installed"
    else:
        out["conductor"] = _run(
            ["npm", "install", "--silent", "--no-audit", "--no-fund", CONDUCTOR], peers
        )
        if out["conductor"] is None and not conductor_module(build_dir).exists():
            out["conductor"] = "npm install left no dist/index.js"
    if only == "conductor":
        return _needs_node(out)
    if (sdk_path(build_dir) / "acp" / "connection.py").exists():
        out["sdk-relay"] = None
    else:
        target = str(sdk_path(build_dir))
        pip = [sys.executable, "-m", "pip", "install", "-q", "--target", target, SDK]
        out["sdk-relay"] = _run(pip, peers)
    return _needs_node(out)


def _needs_node(out: dict[str, str | None]) -> dict[str, str | None]:
    """An installed conductor still needs ``node`` on PATH to run."""
    if out.get("conductor") is None and shutil.which("node") is None:
        out["conductor"] = "node not installed"
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--build-dir", type=Path, default=BENCH / "build")
    ap.add_argument(
        "--only", choices=("conductor",), help="install that peer alone (CI: the conductor tests)"
    )
    a = ap.parse_args()
    ready = True
    for peer, reason in ensure(a.build_dir.resolve(), only=a.only).items():
        print(f"{peer}: {'ready' if reason is None else reason}")
        ready = ready and reason is None
    return 0 if ready or a.only is None else 1


if __name__ == "__main__":
    sys.exit(main())
