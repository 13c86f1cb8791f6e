"""Static checks of the Dockerfile and .dockerignore (no Docker engine exists on CI).

The Dockerfile is parsed into instructions (comments dropped, continuation lines joined) and
checked for what the image promises: a python:3.11-slim base, the project copied and installed
without a pip cache, a non-root user, ``acp-proxy`` as the entrypoint with ``--help`` as the
default command, and a build context (.dockerignore) that still holds every file it copies.
"""

from __future__ import annotations

import fnmatch
import json
import shlex
import tomllib
from dataclasses import dataclass

import pytest
from proxy_harness import REPO

ROOT = REPO

# https://docs.docker.com/reference/dockerfile/ (the complete list of instructions).
INSTRUCTIONS = {
    "ADD", "ARG", "CMD", "COPY", "ENTRYPOINT", "ENV", "EXPOSE", "FROM", "HEALTHCHECK", "LABEL",
    "MAINTAINER", "ONBUILD", "RUN", "SHELL", "STOPSIGNAL", "USER", "VOLUME", "WORKDIR",
}  # fmt: skip


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str
    line: int


def parse_dockerfile(text: str) -> list[Instruction]:
    """Instructions in order; ``\\`` continues a line, ``#`` starts a comment line."""
    out: list[Instruction] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # comment lines inside a continuation are removed by Docker
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending.append(stripped[:-1].strip())
            continue
        pending.append(stripped)
        keyword, _, args = " ".join(p for p in pending if p).partition(" ")
        out.append(Instruction(keyword.upper(), args.strip(), start))
        pending = []
    assert not pending, "the Dockerfile ends inside a continuation line"
    return out


def stages(instructions: list[Instruction]) -> list[list[Instruction]]:
    out: list[list[Instruction]] = []
    for ins in instructions:
        if ins.keyword == "FROM":
            out.append([])
        assert out, f"line {ins.line}: {ins.keyword} before the first FROM"
        out[-1].append(ins)
    return out


def exec_form(ins: Instruction) -> list[str]:
    value = json.loads(ins.args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), ins
    return value


def copy_sources(ins: Instruction) -> tuple[dict[str, str], list[str]]:
    """(flags, sources) of a COPY instruction (the last word is the destination)."""
    words = shlex.split(ins.args)
    flags = dict(w[2:].partition("=")[::2] for w in words if w.startswith("--"))
    paths = [w for w in words if not w.startswith("--")]
    return flags, paths[:-1]


def ignored(path: str, patterns: list[str]) -> bool:
    """.dockerignore semantics: the last matching pattern wins; a matched directory covers all
    its contents; ``!`` re-includes."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    result = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        body = pattern[1:] if negated else pattern
        body = body.strip("/")
        if body.startswith("**/"):
            hit = any(fnmatch.fnmatch(p.rsplit("/", 1)[-1], body[3:]) for p in prefixes)
        else:
            hit = any(
                fnmatch.fnmatchcase(p, body) and p.count("/") == body.count("/") for p in prefixes
            )
        if hit:
            result = not negated
    return result


@pytest.fixture(scope="module")
def instructions() -> list[Instruction]:
    return parse_dockerfile((ROOT / "Dockerfile").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def dockerignore() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def test_parser_handles_continuations_and_comments() -> None:
    parsed = parse_dockerfile('# c\nFROM a AS b\nRUN x \\\n    # inner\n    && y\nCMD ["z"]\n')
    assert parsed == [
        Instruction("FROM", "a AS b", 2),
        Instruction("RUN", "x && y", 3),
        Instruction("CMD", '["z"]', 6),
    ]


def test_only_known_instructions(instructions: list[Instruction]) -> None:
    assert instructions, "empty Dockerfile"
    unknown = [(i.line, i.keyword) for i in instructions if i.keyword not in INSTRUCTIONS]
    assert unknown == []


def test_bases_are_python_311_slim(instructions: list[Instruction]) -> None:
    froms = [i.args.split() for i in instructions if i.keyword == "FROM"]
    assert [f[0] for f in froms] == ["python:3.11-slim"] * len(froms)
    assert 1 <= len(froms) <= 2
    # Every stage a later COPY --from names exists.
    names = {f[2] for f in froms if len(f) == 3 and f[1].upper() == "AS"}
    for ins in instructions:
        if ins.keyword == "COPY":
            flags, _ = copy_sources(ins)
            if "from" in flags:
                assert flags["from"] in names, ins


def test_project_is_copied_and_installed_without_cache(instructions: list[Instruction]) -> None:
    copied = {src for i in instructions if i.keyword == "COPY" for src in copy_sources(i)[1]}
    assert {"pyproject.toml", "acp_proxy"} <= copied
    readme = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert readme["readme"] in copied  # setuptools needs it to build the package
    installs = [i for i in instructions if i.keyword == "RUN" and "pip install" in i.args]
    assert installs, "the project is never installed"
    assert all("--no-cache-dir" in i.args for i in installs)


def test_final_stage_runs_acp_proxy_as_non_root(instructions: list[Instruction]) -> None:
    final = stages(instructions)[-1]
    users = [i for i in final if i.keyword == "USER"]
    assert users, "the image runs as root"
    user = users[-1].args.split(":")[0]
    assert user not in ("root", "0")
    assert user.isdigit()  # numeric, so Kubernetes runAsNonRoot can verify it
    (entrypoint,) = [i for i in final if i.keyword == "ENTRYPOINT"]
    assert exec_form(entrypoint) == ["acp-proxy"]
    (cmd,) = [i for i in final if i.keyword == "CMD"]
    assert exec_form(cmd) == ["--help"]
    # The user is created before it is used.
    creates = [i for i in final if i.keyword == "RUN" and f"--uid {user}" in i.args]
    assert creates and creates[0].line < users[-1].line


def test_dockerignore_keeps_what_the_build_copies(
    instructions: list[Instruction], dockerignore: list[str]
) -> None:
    for ins in instructions:
        if ins.keyword != "COPY":
            continue
        flags, sources = copy_sources(ins)
        if "from" in flags:
            continue
        for source in sources:
            path = ROOT / source
            assert path.exists(), source
            files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
            kept = [
                f
                for f in files
                if "__pycache__" not in f.parts
                and not ignored(f.relative_to(ROOT).as_posix(), dockerignore)
            ]
            assert kept, f"{source} is excluded by .dockerignore"
    assert ignored("acp_proxy/data/default.yaml", dockerignore) is False
    assert ignored("acp_proxy/__pycache__/cli.cpython-311.pyc", dockerignore) is True
    for heavy in (".git/HEAD", ".venv/bin/python", "tests/cli/test_demo.py", "bench/x.py"):
        assert ignored(heavy, dockerignore) is True, heavy


def test_sidecar_usage_is_documented() -> None:
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    assert "acp-proxy --config /etc/acp-proxy/rules.yaml -- my-agent" in text
    # The pod advice is a Unix socket in a shared volume (or the pod's loopback).
    assert '"--listen", "unix:///run/acp/acp.sock",' in text
    assert "`--listen tcp://127.0.0.1:7777` works as well" in text


def test_the_image_builds_the_c_scanner_in_the_build_stage_only(
    instructions: list[Instruction],
) -> None:
    """The build stage has a compiler, builds the optional C block scanner and fails if
    it fell back to pure Python; the runtime stage gets the compiled module, not the compiler."""
    *builds, final = stages(instructions)
    (build,) = builds
    runs = [i.args for i in build if i.keyword == "RUN"]
    assert any("apt-get install" in r and " gcc " in f"{r} " for r in runs)
    copied = {src for i in build if i.keyword == "COPY" for src in copy_sources(i)[1]}
    assert "setup.py" in copied
    assert any("pip install" in r and "SCANNER == 'C'" in r for r in runs)
    assert not any("gcc" in i.args for i in final if i.keyword == "RUN")


def test_the_image_can_trace(instructions: list[Instruction]) -> None:
    """The image installs the otel extra and its build checks that the tracing SDK imports."""
    *builds, _ = stages(instructions)
    runs = [i.args for stage in builds for i in stage if i.keyword == "RUN"]
    (install,) = [r for r in runs if "pip install" in r and "--prefix=/install" in r]
    assert "'.[otel]'" in install
    assert "import opentelemetry.sdk.trace" in install
