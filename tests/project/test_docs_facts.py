"""Facts the user docs repeat, held equal to their source: the version, the agent package of the
examples, the editor snippets' absolute path, install steps that do what they say, the demo's
rules, the component's synopsis, the FAQ's place in the site."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import yaml
from proxy_harness import REPO

from acp_proxy import __version__
from acp_proxy.cli import show_command as show
from acp_proxy.cli.options import build_parser
from acp_proxy.config import load_config
from acp_proxy.shell.session import component_runtime as component

DOCS = sorted((REPO / "docs").glob("*.md"))
PAGES = [REPO / "README.md", *DOCS]


def text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def blocks(path: Path, *languages: str) -> list[str]:
    """The fenced code blocks of ``path`` in one of ``languages`` (fences may be indented)."""
    pattern = re.compile(r"^( *)```(\w*)\n(.*?)^\1```", re.S | re.M)
    return [
        "\n".join(line[len(m[1]) :] for line in m[3].splitlines())
        for m in pattern.finditer(text(path))
        if m[2] in languages
    ]


def test_version_strings_in_the_docs_are_the_package_version() -> None:
    found = {
        f"{path.name}: {m[1]}"
        for path in PAGES
        for m in re.finditer(r"acp-proxy (\d+\.\d+\.\d+)", text(path))
    }
    assert found, "the docs name the version somewhere"
    assert {f.split(": ")[1] for f in found} == {__version__}, sorted(found)


def test_the_agent_package_in_help_is_the_readmes() -> None:
    npm = re.compile(r"npx (?:-y )?(@[\w.-]+/[\w.-]+)")
    in_help = set(npm.findall(build_parser().format_help()))
    in_readme = set(re.findall(r'"npx", "-y", "(@[\w.-]+/[\w.-]+)"', text(REPO / "README.md")))
    assert in_help == in_readme == {"@agentclientprotocol/claude-agent-acp"}


def test_every_editor_snippet_gives_the_absolute_path_of_acp_proxy() -> None:
    commands = []
    for path in PAGES:
        for block in blocks(path, "json"):
            if "agent_servers" not in block:
                continue  # a frame, a record line
            servers = json.loads(block)["agent_servers"]
            commands += [(path.name, s["command"]) for s in servers.values()]
    assert commands
    assert [c for c in commands if not c[1].startswith("/")] == []


def test_no_install_step_relies_on_pipx_installing_over_an_installed_tool() -> None:
    # pipx leaves an installed tool as it is: a second `pipx install` in the same steps needs
    # --force (or `pipx inject` to add packages).
    again = []
    for path in PAGES:
        for block in blocks(path, "sh", "bash", "console"):
            installed = False
            for line in block.splitlines():
                command = line.split("#", 1)[0].strip()
                if command.startswith("pipx install"):
                    if installed and "--force" not in command:
                        again.append(f"{path.name}: {command}")
                    installed = True
    assert again == []


def test_the_demo_rule_is_the_examples_edge_route_rule() -> None:
    env = {"HOSTNAME": "h"}
    demo = load_config(str(REPO / "acp_proxy" / "data" / "default.yaml"), env)
    example = load_config(str(REPO / "config" / "example.yaml"), env)
    [edge] = [r for r in example.rules if r.name == "edge-route"]
    assert [dataclasses.replace(r, line=None) for r in demo.rules] == [
        dataclasses.replace(edge, line=None)
    ]
    assert "the `edge-route` rule of `config/example.yaml`" in text(REPO / "docs" / "demo.md")


def test_the_component_synopsis_lists_every_option() -> None:
    doc = text(REPO / "docs" / "component.md")
    synopsis = next(b for b in blocks(REPO / "docs" / "component.md", "sh") if "component [" in b)
    options = {
        o
        for action in component.build_parser()._actions
        for o in action.option_strings
        if o.startswith("--") and o != "--help"
    }
    assert sorted(o for o in options if o not in synopsis) == []
    assert "clientConnector" not in doc


def test_every_name_the_conductor_snippet_connects_is_defined_in_it() -> None:
    [snippet] = [b for b in blocks(REPO / "docs" / "component.md", "js") if "Conductor(" in b]
    for name in re.findall(r"\.connect\((\w+)\)", snippet):
        assert re.search(rf"\b(?:const|let|class|function) {name}\b", snippet), name


def test_show_help_lists_web() -> None:
    assert "--web" in show.build_parser().format_help()


def test_the_faq_is_in_the_site_and_says_what_to_attach_to_a_bug() -> None:
    nav = json.dumps(yaml.safe_load(text(REPO / "mkdocs.yml"))["nav"])
    assert '"faq.md"' in nav
    faq = text(REPO / "docs" / "faq.md")
    report = faq[faq.index("## Reporting a bug") :]
    for what in ("`acp-proxy -V`", "**The log**", "**A redacted record**"):
        assert what in report
