"""Smoke tests of the benchmark suite: its output is complete and well-formed.

Contract: runs ``bench/run.py --quick`` (seconds) and ``bench/generate.py`` as a user would and
checks the *shape* of what they produce: every scenario row is present, every number is finite,
the JSON has the documented keys, the generated traffic is valid ACP. Never asserts a timing.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from acp_schema import validate_v1, validate_v1_message, validate_v2, validate_v2_message
from proxy_harness import REPO

# The quick benchmark run (a module fixture, timed with the module's first test) takes about a
# minute on an idle 2-core machine, more beside the rest of the suite: past the default timeout.
pytestmark = pytest.mark.timeout(600)

ROOT = REPO
BENCH = ROOT / "bench"

PROFILES = ("mixed-v2", "mixed-v1", "chunks-v2")
# The peers are rows of scenarios 1, 2 and 4 too (skipped here: --quick with an empty
# build dir does not install them), an "n/a" row each in scenario 5, start-up rows in 6.
PEERS = ("conductor", "sdk-relay")
PEER_VARIANTS = ("conductor", "conductor-annotate", "sdk-relay")
THROUGHPUT_VARIANTS = (
    "pipe-cat",
    "c-relay",
    "py-line",
    "py-inject",
    "proxy-passthrough",
    "proxy-passthrough-nc",
    "proxy-annotate",
    "proxy-annotate-nc",
    "proxy-example",
    "proxy-passthrough-policy",
    "proxy-annotate-policy",
    *PEER_VARIANTS,
)
EXPECTED_IDS = (
    {f"s{n}/{p}/{v}" for n in (1, 2) for p in PROFILES for v in THROUGHPUT_VARIANTS}
    | {
        f"s3/rtt-v2/{v}"
        for v in (
            "direct",
            "asyncio-relay",
            "proxy-passthrough",
            "added",
            "added-asyncio-relay",
            *PEER_VARIANTS,
            *(f"added-{v}" for v in PEER_VARIANTS),
        )
    }
    | {
        f"s4/bigline/{v}"
        for v in ("py-line", "py-inject", "proxy-passthrough", "proxy-annotate", *PEER_VARIANTS)
    }
    | {
        f"s4/slow-client/{v}"
        for v in ("py-line", "proxy-coalesce-on", "proxy-coalesce-off", "conductor", "sdk-relay")
    }
    | {f"s4/long-stream/{who}-{n}" for who in ("proxy", *PEERS) for n in ("1x", "long")}
    | {f"s5/mixed-v2/{v}" for v in ("stdio", "tcp", "unix", "conductor", "sdk-relay")}
    | {
        f"s7/component/{v}"
        for v in ("direct", "proxy-annotate", "conductor", "conductor-component")
    }
    | {
        f"s9/policy-200-rules/{v}"
        for v in ("decision", "decision-audited", "frame-no-policy", "frame-policy")
    }
)
# Rows that may be skipped (with a reason), and why: no C compiler, the proxy not runnable
# (parallel development), sockets unavailable, example config absent.
# The peers are skipped where bench/setup_peers.py has not installed them (--quick).
MAY_SKIP_VARIANTS = ("c-relay", "proxy", "stdio", "tcp", "unix", "added", "conductor", "sdk-relay")
ROW_KEYS = {"id", "scenario", "profile", "variant", "title", "status", "reason"} | {
    "metrics",
    "ratios",
    "check",
}
META_KEYS = {
    "started",
    "duration_s",
    "quick",
    "reps",
    "size_bytes",
    "bigline_bytes",
    "burst_bytes",
    "latency_pairs",
    "long_stream_passes",
    "seed",
    "machine",
    "proxy_available",
    "proxy_error",
    "c_relay_error",
    "rss_source",
    "loadavg_end",
}
METRICS = {
    1: {"mb_s", "msg_s", "peak_rss_mb"},
    2: {"cpu_us_per_msg", "startup_cpu_ms"},
    3: {"p50_us", "p99_us", "max_us"},
    5: {"mb_s"},
    7: {"rtt_p50_us", "rtt_p99_us", "added_p50_us", "updates_per_s", "delivered"},
    9: {"p50_us"},
}


def _numbers(value: Any) -> list[float]:
    """Every number inside ``value`` (nested dicts and lists), booleans excluded."""
    if isinstance(value, bool):
        return []
    if isinstance(value, int | float):
        return [float(value)]
    if isinstance(value, dict):
        return [x for v in value.values() for x in _numbers(v)]
    if isinstance(value, list):
        return [x for v in value for x in _numbers(v)]
    return []


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    tmp = tmp_path_factory.mktemp("bench")
    out = tmp / "results.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCH / "run.py"),
            "--quick",
            "--out",
            str(out),
            "--data-dir",
            str(tmp / "data"),
            "--build-dir",
            str(tmp / "build"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.read_text())
    return result, proc.stdout


def test_json_has_the_documented_keys(quick_run: tuple[dict[str, Any], str]) -> None:
    result, _ = quick_run
    assert set(result) == {"schema", "meta", "rows", "startup"}
    startup = result["startup"]  # scenario 6: every variant, one number per rep
    assert set(startup) == {"reps", "wall_s", "cpu_s", "vs_relay", "cpu_vs_relay", "skipped"}
    assert set(startup["wall_s"]) == {"python-S", "python", "relay", "anyio", "proxy"}
    assert set(startup["skipped"]) == {"conductor", "sdk-relay"}  # not installed in tmp/build
    assert all(len(xs) == startup["reps"] for xs in startup["cpu_s"].values())
    assert result["schema"] == "acp-proxy-bench/1"
    assert set(result["meta"]) == META_KEYS
    assert result["meta"]["quick"] is True
    assert {"cpu", "cpus", "mem_mb", "os", "python", "loadavg_start"} <= set(
        result["meta"]["machine"]
    )
    for row in result["rows"]:
        assert set(row) == ROW_KEYS, row["id"]


def test_every_scenario_row_is_present_once(quick_run: tuple[dict[str, Any], str]) -> None:
    result, _ = quick_run
    ids = [row["id"] for row in result["rows"]]
    assert len(ids) == len(set(ids))
    assert set(ids) == EXPECTED_IDS


def test_rows_are_measured_or_skipped_with_a_reason(
    quick_run: tuple[dict[str, Any], str],
) -> None:
    result, _ = quick_run
    for row in result["rows"]:
        assert row["status"] in ("ok", "skipped"), (row["id"], row["reason"])
        if row["status"] == "skipped":
            assert isinstance(row["reason"], str) and row["reason"], row["id"]
            quick_profile = row["scenario"] in (1, 2) and row["profile"] != PROFILES[0]
            if quick_profile:
                assert row["reason"] == "--quick: only the first profile runs", row["id"]
            else:
                assert row["variant"].startswith(MAY_SKIP_VARIANTS), row["id"]
            continue
        assert row["reason"] is None
        expected = METRICS.get(row["scenario"])
        if expected is not None:
            assert expected <= set(row["metrics"]), row["id"]
        if row["scenario"] == 4:
            assert "peak_rss_mb" in row["metrics"], row["id"]
        numbers = _numbers(row["metrics"]) + _numbers(row["ratios"])
        assert numbers, row["id"]
        assert all(math.isfinite(x) for x in numbers), row["id"]


def test_baselines_reproduce_the_stream(quick_run: tuple[dict[str, Any], str]) -> None:
    """The byte relays and the line relay must deliver the agent's bytes unchanged."""
    result, _ = quick_run
    for row in result["rows"]:
        if row["status"] == "skipped":
            continue
        if row["scenario"] == 1 and row["variant"] in ("pipe-cat", "py-line"):
            assert row["check"]["identical"] == [True], row["id"]
        if row["scenario"] == 1 and row["variant"] == "py-inject":
            assert row["check"]["lines_out"] == [row["check"]["lines_in"]], row["id"]


def test_markdown_tables_are_printed(quick_run: tuple[dict[str, Any], str]) -> None:
    _, stdout = quick_run
    for heading in ("### 1.", "### 2.", "### 3.", "### 4.", "### 5.", "### 7."):
        assert heading in stdout
    assert "| profile | variant | MB/s |" in stdout


def _generate(out: Path, profile: str, version: int) -> dict[str, Any]:
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCH / "generate.py"),
            "--profile",
            profile,
            "--version",
            str(version),
            "--size",
            "48K",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    meta: dict[str, Any] = json.loads(proc.stdout)
    return meta


@pytest.mark.parametrize(("profile", "version"), [("mixed", 2), ("mixed", 1), ("burst", 2)])
def test_generator_is_deterministic_and_valid_acp(
    tmp_path: Path, profile: str, version: int
) -> None:
    first = _generate(tmp_path / "a", profile, version)
    second = _generate(tmp_path / "b", profile, version)
    assert first["sha256"] == second["sha256"]
    agent = Path(first["agent_path"]).read_bytes()
    client = Path(first["client_path"]).read_bytes()
    assert agent.endswith(b"\n") and client.endswith(b"\n")
    lines = agent.split(b"\n")[:-1]
    assert len(lines) == first["lines"]
    messages = [orjson.loads(line) for line in lines]
    requests = [orjson.loads(line) for line in client.split(b"\n")[:-1]]
    schema = {"initialize": "Initialize", "session/new": "NewSession", "session/prompt": "Prompt"}
    validate_def = validate_v2 if version == 2 else validate_v1
    methods = {}
    for req in requests:  # every client line is a request the agent file answers
        validate_def(schema[req["method"]] + "Request", req["params"])
        methods[req["id"]] = req["method"]
    # The initialize response comes first and answers the client's first line.
    assert requests[0]["method"] == "initialize" and messages[0]["id"] == requests[0]["id"]
    assert messages[0]["result"]["protocolVersion"] == version
    validate_message = validate_v2_message if version == 2 else validate_v1_message
    count = 0
    answered = set()
    for frame in messages:
        for msg in frame if isinstance(frame, list) else [frame]:
            count += 1
            if msg.get("method") in ("session/update", "session/request_permission"):
                validate_message(msg)
            elif msg.get("method") == "fs/read_text_file":
                validate_v1("ReadTextFileRequest", msg["params"])
            else:
                assert "result" in msg and msg["id"] in methods, msg
                validate_def(schema[methods[msg["id"]]] + "Response", msg["result"])
                answered.add(msg["id"])
    assert count == first["messages"]
    assert answered == set(methods)


def test_record_cost_bench_prints_both_rows() -> None:
    # The cost of --record, same run; shape only, never a timing.
    done = subprocess.run(
        [sys.executable, str(BENCH / "record_cost.py"), "300", "1"],
        capture_output=True,
        cwd=str(ROOT),
        timeout=120,
        check=True,
    )
    lines = done.stdout.decode().splitlines()
    assert lines[1:3] == [
        "| run | wall s | messages/s | proxy CPU µs/message | record bytes |",
        "|---|---|---|---|---|",
    ]
    plain, recorded = (line.split(" | ") for line in lines[3:5])
    assert plain[0] == "| plain" and recorded[0] == "| --record"
    assert plain[-1] == "0 |"
    assert int(recorded[-1].rstrip(" |").replace(",", "")) > 300 * 250  # every frame recorded


def test_bytecodes_bench_prints_the_function_table_and_the_totals() -> None:
    # Bytecodes per round trip (a count, not a timing); shape, and that the proxy's
    # own code and asyncio's loop are both counted, for it and for the relay.
    done = subprocess.run(
        [sys.executable, str(BENCH / "bytecodes.py"), "--round-trips", "20", "--top", "3"],
        capture_output=True,
        cwd=str(ROOT),
        timeout=120,
        check=True,
    )
    lines = done.stdout.decode().splitlines()
    assert lines[:3] == [
        "20 and 60 sequential round trips against bench/echo_agent.py",
        "| module | function | bytecodes / round trip |",
        "|---|---|---|",
    ]
    assert len([line for line in lines[3:6] if line.startswith("| ")]) == 3
    assert lines[6:9] == [
        "",
        "| totals per round trip | acp-proxy | minimal asyncio relay (relay_asyncio.py) |",
        "|---|---|---|",
    ]
    totals = {}
    for line in lines[9:12]:
        name, proxy, relay = (cell.strip(" *") for cell in line.strip("|").split(" | "))
        totals[name.split(" (")[0]] = (float(proxy.replace(",", "")), float(relay.replace(",", "")))
    assert list(totals) == ["all", "asyncio's loop", "the rest"]
    (proxy_all, relay_all), (proxy_loop, relay_loop), (proxy_own, relay_own) = totals.values()
    # (each cell rounded on its own)
    assert (
        abs(proxy_all - proxy_loop - proxy_own) <= 1
        and abs(relay_all - relay_loop - relay_own) <= 1
    )
    assert relay_loop > 0 and relay_own > 0
    assert proxy_own > relay_own  # the proxy parses and tracks; the relay copies bytes


_SLOW_CLIENT_PROBE = r"""
import json, os, sys, threading
sys.path.insert(0, sys.argv[1])
import slow_client as sc

def r(after, cpu):
    return sc.Result("x", after_resume_s=after, cpu_s=cpu)

on = [r(0.110, 0.5), r(0.120, 0.6), r(0.095, 0.4)]
off = [r(0.100, 0.3), r(0.100, 0.3), r(0.100, 0.3)]
paired = sc.paired(on, off)
# The editor client: lines cut across reads are parsed whole; the last byte is read and parsed.
def line(i):
    return json.dumps({"jsonrpc": "2.0", "method": "m", "params": {"i": i}}).encode()
lines = [line(i) for i in range(2000)]
data = b"\n".join(lines) + b"\n"
rfd, wfd = os.pipe()
def write():
    for i in range(0, len(data), 777):
        os.write(wfd, data[i : i + 777])
    os.close(wfd)
threading.Thread(target=write).start()
got, first, last = sc.editor_reader(0.0)(rfd, 10.0)
broken_r, broken_w = os.pipe()
os.write(broken_w, b'{"a":1}\n{not json\n')
os.close(broken_w)
try:
    sc.editor_reader(0.0)(broken_r, 10.0)
    refused = False
except ValueError:
    refused = True
out = {"paired": paired, "same": got == data, "timed": first <= last, "refused": refused}
print(json.dumps(out))
"""


def test_slow_client_pairs_on_and_off_by_round_and_its_editor_parses_every_line() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _SLOW_CLIENT_PROBE, str(BENCH)],
        capture_output=True,
        check=True,
        cwd=BENCH,
    )
    got = json.loads(out.stdout)
    paired = got["paired"]
    # Round differences: +10, +20 and -5 ms; CPU +0.2, +0.3 and +0.1 s.
    assert math.isclose(paired["after_first_ms_median"], 10.0)
    assert paired["on_later_in"] == 2 and paired["rounds"] == 3
    assert math.isclose(paired["cpu_s_median"], 0.2)
    low, high = paired["after_first_ms_ci95"]
    # A bootstrap of three differences: the interval holds the median, inside their range.
    assert -5.0 - 1e-9 <= low <= 10.0 <= high <= 20.0 + 1e-9
    assert got["same"] and got["timed"] and got["refused"]


def test_ui_cost_bench_prints_each_variant_and_the_ratios(tmp_path: Path) -> None:
    # The live view's cost, same run; shape only, never a timing.
    done = subprocess.run(
        [
            sys.executable,
            str(BENCH / "ui_cost.py"),
            *("--size", "64K", "--repeat", "1", "--data", str(tmp_path)),
            *("--variants", "off", "ui", "ui+1"),
        ],
        capture_output=True,
        cwd=str(ROOT),
        timeout=120,
        check=True,
    )
    lines = done.stdout.decode().splitlines()
    assert lines[0].startswith("mixed v2 stream: ") and lines[0].endswith(", 1 runs each")
    assert [line.split()[0] for line in lines[1:4]] == ["off", "ui", "ui+1"]
    assert all(" wall " in line and " peak RSS " in line for line in lines[1:4])
    assert [line.split(" wall ")[0].strip() for line in lines[4:]] == ["ui / off", "ui+1 / ui"]
