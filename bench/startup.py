"""Start-up wall time of ``acp-proxy -- true`` against a minimal Python relay's.

Contract: measures and reports, never asserts. Each repetition runs, interleaved, every variant
once with stdin from ``/dev/null`` (so each exits at once) and records its wall time from
``fork`` to reap:

* ``relay``: ``python bench/relay_min.py line`` (interpreter, site, orjson, EOF): the baseline;
* ``python -S``/``python``: the interpreter alone, without and with ``site`` (floors);
* ``anyio``: ``python -c "import anyio; anyio.run(...)"`` (the event-loop floor any anyio
  program pays);
* ``proxy``: ``python -m acp_proxy --log-level warning -- true`` (spawns ``true``, waits for it,
  exits);
* the peers, when bench/setup_peers.py installed them: ``conductor``,
  ``node bench/peer_conductor.mjs true`` (Node, the conductor's module; it spawns its agent only
  on the client's ``initialize``, so at EOF it never starts ``true``), and ``sdk-relay``,
  ``python bench/peer_sdk_relay.py true`` (imports the SDK, spawns ``true``, waits for it).
  A peer that is not installed is listed under ``skipped`` with the reason.

The proxy's package is byte-compiled first (``compileall``), as an installed wheel is: with
``PYTHONDONTWRITEBYTECODE`` set (as on the bench machine) the proxy would otherwise compile its
sources on every start, which no installed copy does. CPU is user+sys from ``os.wait4``
(including the agent ``true``): on a machine whose CPU is shared under a quota, wall times come in
steps of the scheduler's period, CPU time does not. Ratios are paired by repetition
(proxy time ÷ relay time of the same repetition); cells are median [min..max].

With ``--baseline-ref REF`` the tree at git ``REF`` is exported into ``bench/build/`` and run as a
further variant ``proxy@REF`` (before/after in the same run).

Usage: ``python bench/startup.py [--reps N] [--baseline-ref REF] [--build-dir DIR]`` prints a
Markdown table; ``run(reps)`` returns the numbers for ``bench/run.py``.
"""

from __future__ import annotations

import argparse
import compileall
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

import setup_peers

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
PY = sys.executable

VARIANTS: dict[str, list[str]] = {
    "python-S": [PY, "-S", "-c", "pass"],
    "python": [PY, "-c", "pass"],
    "relay": [PY, str(BENCH / "relay_min.py"), "line"],
    "anyio": [PY, "-c", "import anyio, asyncio; anyio.run(asyncio.sleep, 0)"],
    "proxy": [PY, "-m", "acp_proxy", "--log-level", "warning", "--", "true"],
}
TITLES = {
    "python-S": "python -S -c pass (interpreter floor)",
    "python": "python -c pass (with site)",
    "relay": "minimal Python relay (relay_min.py line): baseline",
    "anyio": "python + anyio.run (event-loop floor)",
    "proxy": "acp-proxy -- true",
    "conductor": "TypeScript conductor (peer_conductor.mjs true; spawns nothing before initialize)",
    "sdk-relay": "Python SDK relay (peer_sdk_relay.py true)",
}
PEERS = ("conductor", "sdk-relay")


def peer_variants(
    build_dir: Path,
) -> tuple[dict[str, tuple[list[str], dict[str, str]]], dict[str, str]]:
    """The installed peers' start-up commands and environments, and why the others are left out."""
    ready = setup_peers.ensure(build_dir, install=False)
    found: dict[str, tuple[list[str], dict[str, str]]] = {}
    skipped = {p: why for p, why in ready.items() if why is not None and p in PEERS}
    if ready.get("conductor") is None:
        env = {**_env(), "CONDUCTOR_MODULE": str(setup_peers.conductor_module(build_dir))}
        found["conductor"] = (["node", str(BENCH / "peer_conductor.mjs"), "true"], env)
    if ready.get("sdk-relay") is None:
        env = {**_env(), "PYTHONPATH": str(setup_peers.sdk_path(build_dir))}
        found["sdk-relay"] = ([PY, str(BENCH / "peer_sdk_relay.py"), "true"], env)
    return found, skipped


def _env(root: Path = ROOT) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(root) + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""
    )
    return env


def export_ref(ref: str) -> Path:
    """The tree at git ``ref`` under ``bench/build/ref-<sha>`` (byte-compiled)."""
    sha = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", ref],
        capture_output=True,
        check=True,
        text=True,
    ).stdout.strip()
    dest = BENCH / "build" / f"ref-{sha}"
    if not (dest / "acp_proxy").is_dir():
        dest.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", sha, "acp_proxy"], capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    compileall.compile_dir(str(dest / "acp_proxy"), quiet=1)
    build_accelerator(dest)
    return dest


def build_accelerator(tree: Path) -> None:
    """Compile the tree's optional C module in place, as ``pip install`` does for the current
    tree: without it an older tree would run its pure-Python fallbacks and look slower than it
    was. Best effort: a tree without ``_scan.c``, or no compiler, runs as it is (said on
    stderr)."""
    # Where the scanner sits depends on the tree's age (``wire/raw/`` since the regroup).
    sources = [tree / "acp_proxy" / "wire" / d / "_scan.c" for d in ("raw", ".")]
    source = next((s for s in sources if s.exists()), None)
    if source is None:
        print(f"note: {tree.name} has no C accelerator (no _scan.c)", file=sys.stderr)
        return
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    target = source.with_name("_scan" + suffix)
    if target.exists():
        return
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    include = sysconfig.get_paths()["include"]
    cmd = [str(compiler), "-shared", "-fPIC", "-O2", f"-I{include}", str(source), "-o", str(target)]
    if compiler is None or subprocess.run(cmd, check=False, capture_output=True).returncode:
        print(f"note: {tree.name} runs without its C accelerator (not built)", file=sys.stderr)


def _once(argv: list[str], env: dict[str, str], cwd: Path = ROOT) -> tuple[float, float]:
    """Wall and CPU (user+sys, the process and its reaped children) seconds of one run.

    ``cwd`` is the tree whose ``acp_proxy`` runs: ``python -m`` puts the working directory
    first on ``sys.path``, ahead of ``PYTHONPATH``."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=cwd,
    )
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{argv} exited with {proc.returncode}")
    return wall, ru.ru_utime + ru.ru_stime


def _cell(xs: list[float], scale: float = 1.0, digits: int = 0) -> str:
    return (
        f"{statistics.median(xs) * scale:.{digits}f} "
        f"[{min(xs) * scale:.{digits}f}..{max(xs) * scale:.{digits}f}]"
    )


def run(
    reps: int = 20, baseline_ref: str | None = None, build_dir: Path = BENCH / "build"
) -> dict[str, Any]:
    """Wall times (s) per variant and proxy/relay ratios, ``reps`` interleaved repetitions;
    the peers installed in ``build_dir`` too."""
    compileall.compile_dir(str(ROOT / "acp_proxy"), quiet=1)
    env = _env()
    variants = {name: (argv, env, ROOT) for name, argv in VARIANTS.items()}
    peers, skipped = peer_variants(build_dir)
    variants.update({name: (argv, env, ROOT) for name, (argv, env) in peers.items()})
    if baseline_ref is not None:
        name = f"proxy@{baseline_ref}"
        TITLES[name] = f"acp-proxy -- true at {baseline_ref} (before)"
        tree = export_ref(baseline_ref)
        variants[name] = (VARIANTS["proxy"], _env(tree), tree)
    for argv, e, cwd in variants.values():  # warm the page cache once
        _once(argv, e, cwd)
    times: dict[str, list[float]] = {k: [] for k in variants}
    cpu: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(reps):
        for name, (argv, e, cwd) in variants.items():
            wall, used = _once(argv, e, cwd)
            times[name].append(wall)
            cpu[name].append(used)

    def vs_relay(xs: dict[str, list[float]]) -> dict[str, list[float]]:
        return {name: [t / r for t, r in zip(xs[name], xs["relay"], strict=True)] for name in xs}

    return {
        "reps": reps,
        "wall_s": times,
        "cpu_s": cpu,
        "vs_relay": vs_relay(times),
        "cpu_vs_relay": vs_relay(cpu),
        "skipped": skipped,
    }


def markdown(result: dict[str, Any]) -> str:
    out = [
        "| start-up | wall ms | wall ÷ relay | CPU ms | CPU ÷ relay |",
        "|---|---|---|---|---|",
    ]
    for name, xs in result["wall_s"].items():
        out.append(
            f"| {TITLES[name]} | {_cell(xs, 1000)} | {_cell(result['vs_relay'][name], 1, 2)} "
            f"| {_cell(result['cpu_s'][name], 1000)} "
            f"| {_cell(result['cpu_vs_relay'][name], 1, 2)} |"
        )
    for name, why in result.get("skipped", {}).items():
        out.append(f"| {TITLES[name]} | skipped: {why} | | | |")
    return "\n".join(out)


INIT = (
    b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":2,'
    b'"info":{"name":"bench","version":"1"},"capabilities":{}}}\n'
)


def _first_response(argv: list[str], env: dict[str, str], cwd: Path) -> float:
    """Seconds from the fork of ``argv`` to the first line it writes back for ``initialize``
    (sent at once: a client does not wait)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=cwd, bufsize=0
    )
    assert proc.stdin is not None and proc.stdout is not None
    os.write(proc.stdin.fileno(), INIT)
    got = b""
    while not got.endswith(b"\n"):
        chunk = os.read(proc.stdout.fileno(), 65536)
        if not chunk:
            raise RuntimeError(f"{argv}: no response to initialize")
        got += chunk
    wall = time.perf_counter() - t0
    proc.stdin.close()
    proc.wait(30)
    return wall


def first_response(reps: int, boots: list[int], baseline_ref: str | None) -> str:
    """Start-up as users feel it: the time from starting ``acp-proxy -- AGENT`` to
    the agent's answer to ``initialize``, against starting the agent directly, for an agent
    that boots in ``boot`` ms (``echo_agent.py --boot-ms``). The proxy starts the agent before
    importing its event loop (``acp_proxy/shell/agent/spawn.py``), so a slow agent's boot hides
    it."""
    compileall.compile_dir(str(ROOT / "acp_proxy"), quiet=1)
    env = _env()
    trees = {"proxy": ROOT}
    if baseline_ref is not None:
        trees[f"proxy@{baseline_ref}"] = export_ref(baseline_ref)
    rows = [
        "| agent boot | path | first response ms | added by the proxy ms |",
        "|---|---|---|---|",
    ]
    for boot in boots:
        agent = [PY, str(BENCH / "echo_agent.py"), "--boot-ms", str(boot)]
        variants = {"direct": (agent, env, ROOT)}
        for name, tree in trees.items():
            argv = [PY, "-m", "acp_proxy", "--log-level", "warning", "--", *agent]
            variants[name] = (argv, _env(tree), tree)
        for argv, e, cwd in variants.values():  # warm the page cache once
            _first_response(argv, e, cwd)
        walls: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(reps):
            for name, (argv, e, cwd) in variants.items():
                walls[name].append(_first_response(argv, e, cwd))
        for name, xs in walls.items():
            added = [x - d for x, d in zip(xs, walls["direct"], strict=True)]
            extra = "" if name == "direct" else _cell(added, 1000)
            rows.append(f"| {boot} ms | {name} | {_cell(xs, 1000)} | {extra} |")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--baseline-ref", help="also run the proxy at this git ref (before/after)")
    ap.add_argument("--build-dir", type=Path, default=BENCH / "build", help="where the peers are")
    ap.add_argument(
        "--first-response",
        metavar="BOOT_MS",
        help="instead: time to the answer to initialize, for agents booting in these ms (0,300)",
    )
    a = ap.parse_args()
    if a.first_response:
        boots = [int(x) for x in a.first_response.split(",")]
        print(first_response(a.reps, boots, a.baseline_ref))
        return 0
    print(markdown(run(a.reps, a.baseline_ref, a.build_dir.resolve())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
