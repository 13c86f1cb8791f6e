"""A config file is data unless it says otherwise.

``use:`` may only name a middleware class, refused before anything is called; ``check-config``
never instantiates; hostile YAML (alias bombs, recursive aliases, unknown tags, deep nesting) and
odd paths (devices, FIFOs, directories, huge files) end in exit 2 with ``FILE:LINE: reason`` and
no traceback. The CLI runs in a subprocess under a 1 GiB address-space cap, so a regression
fails with MemoryError instead of swapping the machine.
"""

from __future__ import annotations

import os
import resource
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from proxy_harness import REPO, proxy_env

from acp_proxy.config import ConfigError, load_config, parse_config, writable_by_others

TESTS = REPO / "tests"
CAP = 1024**3  # RLIMIT_AS for the proxy under test
MAX_CONFIG_BYTES = 1024 * 1024  # the documented limit


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))


def proxy(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[bytes]:
    """``python -m acp_proxy ARGS`` with a memory cap; tests/ importable for user middleware."""
    env = proxy_env(PYTHONPATH=os.pathsep.join([str(REPO), str(TESTS)]))
    return subprocess.run(
        [sys.executable, "-m", "acp_proxy", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        env=env,
        cwd=str(cwd or REPO),
        timeout=120,  # generous: only against a hang, never a timing assertion
        preexec_fn=_cap_memory,
        check=False,
    )


def check_config(path: Path | str) -> subprocess.CompletedProcess[bytes]:
    return proxy("check-config", str(path))


def start(path: Path | str) -> subprocess.CompletedProcess[bytes]:
    """The run: load the config, then (only if it is valid) spawn ``true`` as the agent."""
    return proxy("--config", str(path), "--", sys.executable, "-c", "pass")


def both_refuse(path: Path, message: str) -> None:
    """check-config and the run both exit 2 with exactly ``acp-proxy: MESSAGE``."""
    for ran in (check_config(path), start(path)):
        assert (ran.returncode, ran.stdout, ran.stderr.decode()) == (
            2,
            b"",
            f"acp-proxy: {message}\n",
        )


# --- use: names a middleware class, refused before it is called ------------------------------


def test_os_system_is_refused_before_it_runs(tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    path = tmp_path / "evil.yaml"
    path.write_text(f"middleware:\n  - use: os:system\n    with: {{command: 'touch {marker}'}}\n")
    both_refuse(
        path,
        f'{path}:2: middleware[0].use: "os:system" is a built-in function: expected a '
        "middleware class (subclass acp_proxy.middleware.BaseMiddleware)",
    )
    assert not marker.exists()


NOT_CLASSES = [
    ("subprocess:run", "a function"),
    ("builtins:eval", "a built-in function"),
    ("os:path", "a module"),
    ("custom_middleware:broken_import", "a function"),
    ("custom_middleware:CALLABLE_OBJECT", "a callable object (Callable), not a class"),
    ("custom_middleware:NOT_CALLABLE", "not a class (it is int)"),
    ("subprocess:Popen", "a class without a `__call__(message, ctx)` method"),
    (
        "custom_middleware:NoName",
        "a class without a `name` (declare `name: str` in the class body)",
    ),
]


@pytest.mark.parametrize(("use", "what"), NOT_CLASSES, ids=[u for u, _ in NOT_CLASSES])
def test_only_middleware_classes_are_accepted(use: str, what: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(f"middleware:\n  - use: {use}\n", "c.yaml", {})
    assert str(info.value) == (
        f'c.yaml:2: middleware[0].use: "{use}" is {what}: expected a middleware class '
        "(subclass acp_proxy.middleware.BaseMiddleware)"
    )


def test_a_class_with_name_and_call_is_a_middleware(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(TESTS))
    config = parse_config("middleware:\n  - use: custom_middleware:Duck\n", "c.yaml", {})
    assert [spec.name for spec in config.middleware] == ["duck"]


def test_check_config_imports_but_never_instantiates(tmp_path: Path) -> None:
    marker = tmp_path / "built"
    path = tmp_path / "c.yaml"
    path.write_text(
        f"middleware:\n  - use: custom_middleware:Marker\n    with: {{path: '{marker}'}}\n"
    )
    ran = check_config(path)
    assert (ran.returncode, ran.stderr) == (0, b"")
    assert "  1. Marker = custom_middleware:Marker with" in ran.stdout.decode()
    assert not marker.exists()
    # The run builds one instance up front (to check the options) and one per connection.
    ran = start(path)
    assert ran.returncode == 0, ran.stderr
    assert marker.read_text().startswith("built\n")


def test_check_config_still_checks_the_options_against_the_signature(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("middleware:\n  - use: custom_middleware:Marker\n    with: {colour: red}\n")
    ran = check_config(path)
    assert (ran.returncode, ran.stderr.decode()) == (
        2,
        f"acp-proxy: {path}:3: middleware[0].with: custom_middleware:Marker does not accept "
        "these options: missing a required argument: 'path' (its parameters: path)\n",
    )


# --- YAML: aliases, tags, nesting --------------------------------------------------------------


def billion_laughs() -> str:
    """Nine levels of nine aliases each: 9**9 (387 million) strings once expanded."""
    lines = [
        "rules:",
        "  - set_meta:",
        '      x/a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]',
    ]
    prev = "a"
    for name in "bcdefghi":
        lines.append(f"      x/{name}: &{name} [{','.join([f'*{prev}'] * 9)}]")
        prev = name
    return "\n".join(lines) + "\n"


def test_billion_laughs_is_refused_quickly(tmp_path: Path) -> None:
    path = tmp_path / "laughs.yaml"
    path.write_text(billion_laughs())
    assert len(billion_laughs()) < 700
    both_refuse(
        path,
        f'{path}:8: the aliases expand to more than 100000 values (a YAML "billion laughs"?): '
        "write the values out, or use fewer nested aliases",
    )


def test_aliases_within_bounds_still_work() -> None:
    text = (
        "rules:\n"
        "  - name: a\n    set_meta: &meta {x/a: [1, 2], x/b: {c: true}}\n"
        "  - name: b\n    set_meta: *meta\n"
    )
    config = parse_config(text, "c.yaml", {})
    assert [r.set_meta for r in config.rules] == [{"x/a": [1, 2], "x/b": {"c": True}}] * 2


def test_too_many_aliases() -> None:
    text = "rules:\n  - set_meta:\n      x/a: &a 1\n      x/b: [" + ", ".join(["*a"] * 1001) + "]\n"
    with pytest.raises(ConfigError) as info:
        parse_config(text, "c.yaml", {})
    assert str(info.value) == "c.yaml:4: too many aliases: more than 1000 uses of *name in one file"


@pytest.mark.parametrize(
    "text",
    [
        "rules:\n  - set_meta:\n      x/a: &a [1, *a]\n",
        "rules:\n  - set_meta:\n      x/a: &a {b: {c: *a}}\n",
        "v1: &a\n  <<: *a\n",
    ],
    ids=["list", "mapping", "merge"],
)
def test_recursive_alias(tmp_path: Path, text: str) -> None:
    path = tmp_path / "rec.yaml"
    path.write_text(text)
    line = text.count("\n", 0, text.index("*a")) + 1
    both_refuse(
        path,
        f'{path}:{line}: recursive alias "*a": it is inside the value its anchor "&a" names, '
        "so the value would be infinite",
    )


TAGS = [
    (
        "rules:\n  - set_meta: !!python/object/apply:os.system ['id']\n",
        "!!python/object/apply:os.system",
    ),
    ("rules:\n  - set_meta: {x/a: !!python/name:os.system ''}\n", "!!python/name:os.system"),
    ("rules: !!set {a: null}\n", "!!set"),
    ("non_json: !local log\n", "!local"),
    ("max_frame_bytes: !!timestamp 2001-12-14\n", "!!timestamp"),
]


@pytest.mark.parametrize(("text", "tag"), TAGS, ids=[t for _, t in TAGS])
def test_unknown_tags_are_refused(tmp_path: Path, text: str, tag: str) -> None:
    path = tmp_path / "tag.yaml"
    path.write_text(text)
    line = text.count("\n", 0, text.index("!")) + 1
    both_refuse(
        path,
        f"{path}:{line}: unknown tag {tag}: only the standard YAML tags (!!str, !!int, !!float, "
        "!!bool, !!null, !!seq, !!map) are allowed; remove the tag",
    )


def test_core_tags_are_allowed() -> None:
    config = parse_config(
        "rules: !!seq\n  - set_meta: !!map {x/a: !!str 5, x/b: !!int '7'}\n", "c.yaml", {}
    )
    assert config.rules[0].set_meta == {"x/a": "5", "x/b": 7}


def test_deep_nesting_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text("rules: " + "[" * 5000 + "]" * 5000 + "\n")
    both_refuse(path, f"{path}:1: nested too deeply: more than 100 levels of lists and mappings")


# --- the file itself ---------------------------------------------------------------------------


def test_dev_zero_is_refused() -> None:
    both_refuse(Path("/dev/zero"), "/dev/zero: the config file is a device, not a regular file")


def test_a_directory_is_refused(tmp_path: Path) -> None:
    both_refuse(tmp_path, f"{tmp_path}: the config file is a directory, not a regular file")


def test_a_fifo_is_refused_without_hanging(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    # No writer ever opens it: a blocking open would hang (the subprocess timeout catches that).
    both_refuse(fifo, f"{fifo}: the config file is a FIFO (named pipe), not a regular file")


def test_a_file_over_one_mib_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_bytes(b"#" * MAX_CONFIG_BYTES + b"\n")
    both_refuse(
        path,
        f"{path}: the config file is too large ({MAX_CONFIG_BYTES + 1} bytes; at most 1 MiB)",
    )


def test_a_file_of_exactly_one_mib_is_read(tmp_path: Path) -> None:
    path = tmp_path / "max.yaml"
    path.write_bytes(b"#" * (MAX_CONFIG_BYTES - 1) + b"\n")
    assert load_config(str(path), {}).source == str(path)


# --- trust: writable config files --------------------------------------------------------------

WRITABLE = (
    "writable by other users: its `use:` entries import code, so whoever can change it can run "
    "code as this user (chmod go-w)"
)


def test_a_group_writable_config_is_warned_about(tmp_path: Path) -> None:
    tmp_path.chmod(0o700)
    path = tmp_path / "c.yaml"
    path.write_text("v1: {mode: safe}\n")
    path.chmod(0o664)
    ran = check_config(path)
    assert ran.returncode == 0
    assert ran.stderr.decode() == f"acp-proxy: warning: {path} has mode -rw-rw-r--; {WRITABLE}\n"
    ran = start(path)
    assert ran.returncode == 0
    assert f"config file {WRITABLE}" in ran.stderr.decode()
    assert f"{path} has mode -rw-rw-r--" in ran.stderr.decode()


def test_a_world_writable_directory_is_warned_about_unless_sticky(tmp_path: Path) -> None:
    directory = tmp_path / "shared"
    directory.mkdir()
    path = directory / "c.yaml"
    path.write_text("v1: {mode: safe}\n")
    path.chmod(0o644)
    directory.chmod(0o777)
    ran = check_config(path)
    assert ran.stderr.decode() == (
        f"acp-proxy: warning: its directory {directory} has mode drwxrwxrwx; {WRITABLE}\n"
    )
    directory.chmod(0o777 | stat.S_ISVTX)  # like /tmp: others cannot replace the file
    ran = check_config(path)
    assert (ran.returncode, ran.stderr) == (0, b"")


def test_a_private_config_is_not_warned_about(tmp_path: Path) -> None:
    tmp_path.chmod(0o700)
    path = tmp_path / "c.yaml"
    path.write_text("v1: {mode: safe}\n")
    path.chmod(0o644)
    ran = check_config(path)
    assert (ran.returncode, ran.stderr) == (0, b"")


def test_check_config_does_not_guess_names_set_in_init(tmp_path: Path) -> None:
    """Two entries of a class that names itself in __init__ are distinct at run time: without
    building them, check-config cannot tell, so it accepts them as the run does."""
    path = tmp_path / "c.yaml"
    path.write_text(
        "middleware:\n"
        "  - use: custom_middleware:SelfNamed\n    with: {label: a}\n"
        "  - use: custom_middleware:SelfNamed\n    with: {label: b}\n"
    )
    for ran in (check_config(path), start(path)):
        assert ran.returncode == 0, ran.stderr


@pytest.mark.parametrize(("use", "name"), [("FixedName", "fixed"), ("Tag", "Tag")])
def test_check_config_finds_duplicate_names_it_can_know(
    tmp_path: Path, use: str, name: str
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        f"middleware:\n  - use: custom_middleware:{use}\n  - use: custom_middleware:{use}\n"
    )
    both_refuse(
        path,
        f'{path}:3: middleware[1].name: duplicate middleware name "{name}" (also middleware[0]); '
        'give one a distinct "name:"',
    )


def test_the_file_checks_in_process(tmp_path: Path) -> None:
    """The same refusals without a subprocess (the checks are in config.read_config_file)."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (MAX_CONFIG_BYTES + 1))
    cases = {
        "/dev/zero": "/dev/zero: the config file is a device, not a regular file",
        str(tmp_path): f"{tmp_path}: the config file is a directory, not a regular file",
        str(fifo): f"{fifo}: the config file is a FIFO (named pipe), not a regular file",
        str(big): f"{big}: the config file is too large (1048577 bytes; at most 1 MiB)",
        str(tmp_path / "missing.yaml"): f"{tmp_path / 'missing.yaml'}: cannot read the config "
        "file: No such file or directory",
    }
    for path, message in cases.items():
        with pytest.raises(ConfigError) as info:
            load_config(path, {})
        assert str(info.value) == message


def test_writable_by_others_in_process(tmp_path: Path) -> None:
    directory = tmp_path / "d"
    directory.mkdir(mode=0o755)
    directory.chmod(0o775)
    path = directory / "c.yaml"
    path.write_text("")
    path.chmod(0o646)
    assert writable_by_others(str(path)) == (
        f"{path} has mode -rw-r--rw-",
        f"its directory {directory} has mode drwxrwxr-x",
    )
    assert writable_by_others(str(tmp_path / "missing.yaml")) == ()
