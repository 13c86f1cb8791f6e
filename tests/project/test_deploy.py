"""The container as a service: the Dockerfile's health check and socket directory,
the health probe against a real proxy, and the Kubernetes example in ``deploy/`` (validated as
YAML with the fields the docs promise, its arguments parsed by the real CLI)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml
from proxy_harness import FAKE_AGENT, REPO, proxy_env
from telemetry_harness import LogReader
from test_dockerfile import exec_form, parse_dockerfile

from acp_proxy.cli import build_parser
from acp_proxy.config import parse_config
from acp_proxy.shell.sockets.address import parse_address
from acp_proxy.shell.telemetry import probe
from acp_proxy.shell.telemetry.probe import metrics_url

DEPLOY = REPO / "deploy" / "kubernetes.yaml"
TIMEOUT = 20.0


def _docs() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(DEPLOY.read_text(encoding="utf-8")) if d]


def _deployment() -> dict[str, Any]:
    (deployment,) = [d for d in _docs() if d["kind"] == "Deployment"]
    return deployment


def _proxy_container() -> dict[str, Any]:
    containers = _deployment()["spec"]["template"]["spec"]["containers"]
    (proxy,) = [c for c in containers if c["name"] == "acp-proxy"]
    assert isinstance(proxy, dict)
    return proxy


def _options(args: list[str]) -> Any:
    cut = args.index("--")
    options, _ = build_parser().parse_known_args(args[:cut])
    return options, args[cut + 1 :]


def test_kubernetes_example_proxy_listens_on_a_unix_socket_in_a_shared_volume() -> None:
    spec = _deployment()["spec"]["template"]["spec"]
    proxy = _proxy_container()
    options, agent = _options(proxy["args"])
    assert agent == ["my-agent", "--acp"]
    listen = parse_address(options.listen, listen=True)
    assert (listen.scheme, listen.path) == ("unix", "/run/acp/acp.sock")
    socket_dir = str(Path(listen.path).parent)
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {
        c["name"]: {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        for c in spec["containers"]
    }
    # Every container mounts the same emptyDir at the socket's directory.
    assert len(mounts) == 2
    assert {m[socket_dir] for m in mounts.values()} == {"acp-socket"}
    assert volumes["acp-socket"] == {"name": "acp-socket", "emptyDir": {}}
    # The rules come from the ConfigMap at the path the Dockerfile documents, and are valid.
    assert options.config == "/etc/acp-proxy/rules.yaml"
    assert mounts["acp-proxy"]["/etc/acp-proxy"] == "rules"
    (configmap,) = [d for d in _docs() if d["kind"] == "ConfigMap"]
    assert volumes["rules"]["configMap"]["name"] == configmap["metadata"]["name"]
    assert parse_config(configmap["data"]["rules.yaml"], "rules.yaml", {}).rule_names == (
        "tag-tool-calls",
    )
    # The image's user (UID 10001) and a graceful stop longer than the shutdown bound (17 s).
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] == 10001
    assert spec["terminationGracePeriodSeconds"] > 17


def test_kubernetes_example_probes_and_scrape_annotations_match_the_metrics_port() -> None:
    template = _deployment()["spec"]["template"]
    proxy = _proxy_container()
    options, _ = _options(proxy["args"])
    # The pod's IP (the kubelet expands $(POD_IP) from the downward API), not 0.0.0.0, with
    # the metrics port's own consent; --allow-remote (the ACP listener's) is not needed.
    assert options.metrics == "tcp://$(POD_IP):9464"
    env = {e["name"]: e for e in proxy["env"]}
    assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    metrics = parse_address(options.metrics.replace("$(POD_IP)", "10.1.2.3"), listen=True)
    assert options.metrics_allow_remote is True
    assert options.allow_remote is None
    ports = {p["name"]: p["containerPort"] for p in proxy["ports"]}
    assert ports["metrics"] == metrics.port == 9464
    assert proxy["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert proxy["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    annotations = template["metadata"]["annotations"]
    assert annotations == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(metrics.port),
        "prometheus.io/path": "/metrics",
    }


def test_docs_point_at_the_example_and_agree_on_paths() -> None:
    readme = (REPO / "docs" / "containers.md").read_text(encoding="utf-8")
    assert "deploy/kubernetes.yaml" in readme
    assert "/etc/acp/" not in readme  # the Dockerfile's directory is /etc/acp-proxy
    assert "unix:///run/acp/acp.sock" in readme


def test_dockerfile_owns_the_socket_directory_and_checks_health() -> None:
    instructions = parse_dockerfile((REPO / "Dockerfile").read_text(encoding="utf-8"))
    final = instructions[max(i for i, ins in enumerate(instructions) if ins.keyword == "FROM") :]
    runs = " ".join(i.args for i in final if i.keyword == "RUN")
    assert "mkdir -p /etc/acp-proxy /work /run/acp" in runs
    assert "chown acp:acp /work /run/acp" in runs
    (health,) = [i for i in final if i.keyword == "HEALTHCHECK"]
    flags, _, command = health.args.partition("CMD ")
    assert exec_form(type(health)("CMD", command.strip(), health.line)) == [
        "python",
        "-m",
        "acp_proxy.shell.telemetry.probe",
    ]
    assert "--timeout=5s" in flags
    assert [i.args for i in final if i.keyword == "EXPOSE"] == ["9464"]


# -- the probe ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "url"),
    [
        (["--metrics", "tcp://127.0.0.1:9464", "--", "a"], "tcp://127.0.0.1:9464"),
        (["--metrics=tcp://[::1]:1", "--", "a"], "tcp://[::1]:1"),
        (["--config", "x", "--", "agent", "--metrics", "tcp://x:1"], None),
        ([], None),
    ],
)
def test_metrics_url_of_a_command_line(argv: list[str], url: str | None) -> None:
    assert metrics_url(argv) == url


def _probe(pid: int, **env: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "acp_proxy.shell.telemetry.probe", "--pid", str(pid)],
        env=proxy_env(**env),
        cwd=str(REPO),
        capture_output=True,
        timeout=TIMEOUT,
        check=False,
    )


@pytest.mark.anyio
async def test_probe_against_a_running_proxy() -> None:
    cmd = [
        sys.executable,
        "-m",
        "acp_proxy",
        "--log-format",
        "json",
        "--metrics",
        "tcp://127.0.0.1:0",
        "--",
        sys.executable,
        str(FAKE_AGENT),
    ]
    async with await anyio.open_process(cmd, env=proxy_env(), cwd=str(REPO)) as proc:
        assert proc.stderr and proc.stdin
        address = (await LogReader(proc.stderr).event("serving metrics"))["address"]
        # Port 0 on the command line: name the bound endpoint explicitly.
        done = await anyio.to_thread.run_sync(
            lambda: _probe(proc.pid, ACP_PROXY_HEALTHCHECK_URL=address)
        )
        assert (done.returncode, done.stdout) == (
            0,
            f"acp-proxy probe: {address}/healthz: HTTP/1.1 200 OK\n".encode(),
        )
        # What the probe reads on its own: the --metrics argument of the process.
        done = await anyio.to_thread.run_sync(lambda: _probe(proc.pid))
        assert done.returncode == 1  # port 0 cannot be reached
        assert done.stdout.startswith(b"acp-proxy probe: tcp://127.0.0.1:0/healthz: ")
        await proc.stdin.aclose()
        with anyio.fail_after(TIMEOUT):
            assert await proc.wait() == 0


def test_probe_without_metrics_passes() -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        done = _probe(sleeper.pid)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert (done.returncode, done.stdout) == (
        0,
        b"acp-proxy probe: metrics not enabled (no --metrics); nothing to check\n",
    )


def test_probe_fails_when_nothing_answers() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = _probe(1, ACP_PROXY_HEALTHCHECK_URL=f"tcp://127.0.0.1:{port}")
    assert done.returncode == 1
    assert done.stdout.startswith(f"acp-proxy probe: tcp://127.0.0.1:{port}/healthz: ".encode())


def _fake_proc(root: Path, procs: dict[int, tuple[int, list[str]]]) -> str:
    """A /proc with the given processes: pid -> (ppid, argv)."""
    for pid, (ppid, argv) in procs.items():
        (root / str(pid)).mkdir()
        (root / str(pid) / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in argv))
        comm = os.path.basename(argv[0])[:15]
        (root / str(pid) / "stat").write_bytes(f"{pid} ({comm}) S {ppid} 1 1 0".encode())
    return str(root)


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_probe_finds_the_proxy_behind_an_init_as_pid_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`docker run --init`: PID 1 is docker-init, the proxy its child. The probe must ask the
    proxy's endpoint (here nothing answers: unhealthy), not pass because PID 1 has no --metrics."""
    monkeypatch.delenv("ACP_PROXY_HEALTHCHECK_URL", raising=False)
    monkeypatch.delenv("ACP_PROXY_HEALTHCHECK", raising=False)
    url = f"tcp://127.0.0.1:{_closed_port()}"
    proxy = ["/usr/local/bin/acp-proxy", "--metrics", url, "--", "my-agent"]
    proc = _fake_proc(
        tmp_path,
        {
            1: (0, ["/sbin/docker-init", "--", *proxy]),
            7: (1, proxy),
            9: (7, ["my-agent"]),
        },
    )
    assert probe.find_proxy(proc) == 7
    assert probe.main([], proc=proc) == 1
    assert capsys.readouterr().out.startswith(f"acp-proxy probe: {url}/healthz: ")


def test_probe_finds_the_proxy_as_pid_1_and_fails_without_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ACP_PROXY_HEALTHCHECK_URL", raising=False)
    monkeypatch.delenv("ACP_PROXY_HEALTHCHECK", raising=False)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    as_pid_1 = _fake_proc(
        tmp_path / "a", {1: (0, ["python3.11", "-m", "acp_proxy", "--", "agent"]), 5: (1, ["x"])}
    )
    assert probe.find_proxy(as_pid_1) == 1
    assert probe.main([], proc=as_pid_1) == 0  # alive, no --metrics: nothing to ask
    none = _fake_proc(tmp_path / "b", {1: (0, ["/bin/sh", "-c", "sleep 1"]), 5: (1, ["sleep"])})
    assert probe.find_proxy(none) is None
    capsys.readouterr()
    assert probe.main([], proc=none) == 1
    assert capsys.readouterr().out == (
        "acp-proxy probe: no acp-proxy process (neither PID 1 nor a child of it)\n"
    )


def test_kubernetes_example_gives_the_agent_somewhere_to_write_and_sets_resources() -> None:
    """A read-only root filesystem leaves a real agent nowhere to write: its HOME, the working
    directory and /tmp are writable volumes; and every container states its resources."""
    spec = _deployment()["spec"]["template"]["spec"]
    proxy = _proxy_container()
    assert proxy["securityContext"]["readOnlyRootFilesystem"] is True
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m for m in proxy["volumeMounts"]}
    env = {e["name"]: e.get("value") for e in proxy["env"]}
    for path in {env["HOME"], "/work", env["TMPDIR"]}:  # /work: the image's WORKDIR
        mount = mounts[path]
        assert not mount.get("readOnly", False)
        assert "emptyDir" in volumes[mount["name"]]
    for container in spec["containers"]:
        resources = container["resources"]
        assert set(resources) == {"requests", "limits"}, container["name"]
        assert {"cpu", "memory"} <= set(resources["requests"]) <= set(resources["limits"])
