"""The vocabulary the config file's declarations are written in: what a setting holds (``Kind``),
one declared key (``Setting``) and the grammar of a size ("64MiB").

Contract: types and constants only, no behaviour; ``config.schema`` declares every key with
them, ``config.nodes`` validates a value by its kind, ``config.reference`` describes it.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Final


class Kind(enum.Enum):
    """What a setting holds; picks its validation, its JSON schema and its documented default."""

    BOOL = "bool"
    INT = "int"
    SIZE = "size"  # bytes: an integer or "64MiB"
    SECONDS = "seconds"
    CHOICE = "choice"  # one value of an enum
    ADDRESS = "address"  # tcp://HOST:PORT or unix:///PATH
    ENV = "env"  # a mapping of environment variable names to strings
    SECTION = "section"  # a mapping of further settings
    RULES = "rules"  # the rules list (validated by _Parser.rules)
    MIDDLEWARE = "middleware"  # the middleware list (validated by _Parser.middleware)
    POLICY = "policy"  # the permission policy (validated by acp_proxy.policy.policy_parse)
    BUDGETS = "budgets"  # the budgets (validated by acp_proxy.budget.budget_parse)
    # Inside a rule or a middleware entry (validated by _Parser.rule / _Parser.middleware_entry):
    STRING = "string"  # a non-empty string
    UPDATE = "update"  # a sessionUpdate kind, "upserts", or a list of them
    META_MAP = "meta_map"  # metadata keys to JSON values (not null)
    META_LIST = "meta_list"  # a list of metadata keys
    OPTIONS = "options"  # keyword arguments (any JSON mapping)
    USE = "use"  # "rules" or "package.module:Class"
    STRINGS = "strings"  # a list of non-empty strings
    REGEXES = "regexes"  # a list of regular expressions (Python syntax)
    DIRECTORIES = "directories"  # a list of directories, relative to the config file's


@dataclass(frozen=True, slots=True)
class Setting:
    """One key of the config file, declared once: the parser validates it from this,
    ``json_schema()`` describes it, and ``settings_table()`` is the docs' Settings table."""

    key: str
    kind: Kind
    doc: str  # the settings table's "meaning" column and the schema's description
    # The dataclass field it fills: on Config, or on the section's dataclass (a section with no
    # attr, like v1, fills Config's fields directly).
    attr: str | None = None
    minimum: int = 0  # INT
    positive: bool = False  # SECONDS: > 0 instead of >= 0
    choices: type[enum.StrEnum] | None = None  # CHOICE
    listen: bool = False  # ADDRESS: port 0 allowed
    # ADDRESS of an HTTP endpoint (metrics, the live view): also HOST:PORT and http://HOST:PORT,
    # the forms of telemetry.endpoint, one syntax for both.
    http: bool = False
    children: tuple[Setting, ...] = ()  # SECTION
    default_doc: str | None = None  # the documented default where the value says little
    required: str | None = None  # a rule or middleware field that must be given: the error


# Sizes: a byte count with an optional unit, in any case and with or without a space ("64MiB",
# "64mb", "64 MB", "64k"). KB/MB/GB are powers of 1000, KiB/MiB/GiB powers of 1024, and the
# one-letter k/m/g mean KiB/MiB/GiB as in most command-line tools.
_SIZE = re.compile(r"\s*(\d+)\s*([A-Za-z]*)\s*")
_SIZE_UNITS: Final = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kb": 1000,
    "kib": 1024,
    "m": 1024**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1024**3,
    "gb": 1000**3,
    "gib": 1024**3,
}
SIZE_HELP: Final = (
    'a size in bytes: a positive integer or a string such as "64MiB" (units B, KB, KiB, MB, '
    "MiB, GB, GiB, or k, m, g for KiB, MiB, GiB; any case)"
)
# The same grammar for the JSON schema (ECMAScript regex, no flags).
SIZE_PATTERN: Final = r"^\s*[0-9]+\s*([bB]|[kKmMgG]|[kKmMgG][bB]|[kKmMgG][iI][bB])?\s*$"
