"""The ``budgets:`` section of the config file, validated once into ``Budgets``.

Contract: reads the section's YAML nodes with the config's ``NodeReader`` (so every error names
the file, the line and the path inside it, ``budgets.limits[1].window``, with what would be
valid) and records every independent error. Checked here: the keys, the choices, ``max`` (a
number >= 0), ``window`` (an ISO 8601 duration of weeks, days, hours, minutes and seconds:
months and years have no fixed length), ``warn_at`` (fractions between 0 and 1), ``label``
(given exactly for ``per: label``, not empty once ``${VAR}`` is expanded) and unique names.
No I/O: the directory that a relative ``state`` path is read from is given.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any, Final

from yaml.nodes import Node, ScalarNode, SequenceNode

from acp_proxy.budget.model import Action, Budgets, Limit, Meter, Per
from acp_proxy.config.nodes import NodeReader, _join

BUDGETS_KEYS: Final = ("state", "limits")
LIMIT_KEYS: Final = ("name", "per", "meter", "max", "window", "warn_at", "action", "label")
DEFAULT_STATE: Final = "budgets.json"
_DURATION = re.compile(
    r"P(?:(?P<w>\d+)W)?(?:(?P<d>\d+)D)?"
    r"(?:T(?=\d)(?:(?P<h>\d+)H)?(?:(?P<m>\d+)M)?(?:(?P<s>\d+(?:\.\d+)?)S)?)?"
)
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"


def duration_seconds(text: str) -> float | None:
    """The seconds of an ISO 8601 duration such as ``P1D``, ``PT12H``, ``P1W``, ``P1DT6H``;
    ``None`` when it is not one (or is zero, or names months or years)."""
    found = _DURATION.fullmatch(text)
    if found is None or text in ("P", "PT"):
        return None
    parts = found.groupdict()
    seconds = (
        int(parts["w"] or 0) * 7 * 86400
        + int(parts["d"] or 0) * 86400
        + int(parts["h"] or 0) * 3600
        + int(parts["m"] or 0) * 60
        + float(parts["s"] or 0)
    )
    return seconds if seconds > 0 else None


class BudgetsReader:
    """Reads one ``budgets:`` section with the config file's ``reader`` (its errors go there);
    a relative ``state`` is taken from ``base_dir`` (the config file's directory)."""

    def __init__(self, reader: NodeReader, base_dir: str) -> None:
        self.r = reader
        self.base_dir = base_dir

    def budgets(self, node: Node, path: str = "budgets") -> Budgets | None:
        r = self.r
        before = len(r.errors)
        entries = r.mapping(node, path, BUDGETS_KEYS)
        state = DEFAULT_STATE
        if "state" in entries:
            with r.collecting():
                state = r.string(entries["state"][1], _join(path, "state"), expected="a file path")
                if not state:
                    raise r.error(entries["state"][1], _join(path, "state"), "must not be empty")
        limits: list[Limit] = []
        if "limits" in entries:
            limits = self.limits(entries["limits"][1], _join(path, "limits"))
        if len(r.errors) > before:
            return None
        return Budgets(os.path.normpath(os.path.join(self.base_dir, state)), tuple(limits))

    def limits(self, node: Node, path: str) -> list[Limit]:
        r = self.r
        out: list[Limit] = []
        names: dict[str, int] = {}
        for i, item in enumerate(r.sequence(node, path, "a list of limits")):
            ipath = f"{path}[{i}]"
            limit = None
            with r.collecting():
                limit = self.limit(item, ipath)
            if limit is None:
                continue
            if limit.name in names:
                r.errors.append(
                    r.error(
                        item,
                        _join(ipath, "name"),
                        f'duplicate limit name "{limit.name}" (also {path}[{names[limit.name]}])',
                    )
                )
                continue
            names[limit.name] = i
            out.append(limit)
        return out

    def limit(self, node: Node, path: str) -> Limit | None:
        r = self.r
        before = len(r.errors)
        entries = r.mapping(node, path, LIMIT_KEYS, allow_null=False)
        for key, what in (("name", "a name"), ("meter", "a meter"), ("max", "a maximum")):
            if key not in entries:
                raise r.error(node, path, f'a limit needs "{key}:" ({what})')
        out: dict[str, Any] = {}
        with r.collecting():
            name = r.string(entries["name"][1], _join(path, "name"))
            if not name:
                raise r.error(entries["name"][1], _join(path, "name"), "must not be empty")
            out["name"] = name
        with r.collecting():
            out["meter"] = r.choice(entries["meter"][1], _join(path, "meter"), Meter)
        with r.collecting():
            out["max"] = self._number(entries["max"][1], _join(path, "max"))
        if "per" in entries:
            with r.collecting():
                out["per"] = r.choice(entries["per"][1], _join(path, "per"), Per)
        if "action" in entries:
            with r.collecting():
                out["action"] = r.choice(entries["action"][1], _join(path, "action"), Action)
        if "window" in entries:
            with r.collecting():
                wnode = entries["window"][1]
                text = r.string(wnode, _join(path, "window"), expected="an ISO 8601 duration")
                seconds = duration_seconds(text)
                if seconds is None:
                    raise r.error(
                        wnode,
                        _join(path, "window"),
                        f"expected an ISO 8601 duration of weeks, days, hours, minutes or "
                        f'seconds such as "P1D", "PT12H" or "P1W" (months and years have no '
                        f"fixed length: use days), got {text!r}",
                    )
                out["window"], out["window_text"] = seconds, text
        if "warn_at" in entries:
            with r.collecting():
                out["warn_at"] = self._fractions(entries["warn_at"][1], _join(path, "warn_at"))
        per = out.get("per", Per.SESSION)
        if "label" in entries:
            with r.collecting():
                lnode = entries["label"][1]
                if per is not Per.LABEL:
                    raise r.error(lnode, _join(path, "label"), 'only a "per: label" limit has one')
                label = r.string(lnode, _join(path, "label"), expected="a label")
                if not label:
                    raise r.error(lnode, _join(path, "label"), "is empty (is its ${VARIABLE} set?)")
                out["label"] = label
        elif per is Per.LABEL:
            r.errors.append(
                r.error(node, path, 'a "per: label" limit needs "label:" (e.g. "${TEAM}")')
            )
        if len(r.errors) > before:
            return None
        return Limit(**out, line=node.start_mark.line + 1)

    def _number(self, node: Node, path: str) -> float:
        r = self.r
        if not isinstance(node, ScalarNode) or node.tag not in (_INT, _FLOAT):
            raise r.wrong_type(node, path, "a number >= 0")
        number = float(
            r.loader.construct_yaml_int(node)
            if node.tag == _INT
            else r.loader.construct_yaml_float(node)
        )
        if not math.isfinite(number) or number < 0:
            raise r.error(node, path, f"expected a number >= 0, got {node.value}")
        return number

    def _fractions(self, node: Node, path: str) -> tuple[float, ...]:
        r = self.r
        items = node.value if isinstance(node, SequenceNode) else [node]
        out: list[float] = []
        for i, item in enumerate(items):
            ipath = f"{path}[{i}]" if isinstance(node, SequenceNode) else path
            value = self._number(item, ipath)
            if not 0 < value < 1:
                raise r.error(
                    item, ipath, f"expected a fraction of max between 0 and 1, got {item.value}"
                )
            out.append(value)
        return tuple(sorted(set(out)))
