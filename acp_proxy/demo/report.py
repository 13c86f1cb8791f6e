"""The demo's report: the pairs, the stored metadata and the verdicts, as JSON and as text.

Contract: owns the report's structure (``build_report``, also ``acp-proxy demo --json``) and its
text rendering (``render_text``, colours only on a terminal, every line within ``WIDTH``
columns: long JSON is wrapped after a comma, under its own start). Pure: it formats what the
session, pairing and stored-metadata rooms computed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import orjson

from acp_proxy.base.jsontypes import OMITTED, Field, JsonObject, JsonValue
from acp_proxy.demo.pairing import pair_updates
from acp_proxy.demo.session import PROMPT_TEXT, Frame, SessionRecord
from acp_proxy.demo.stored import final_meta, naive_meta, naive_proxy_meta

WIDTH = 100  # columns: the report reads well in a 100-column terminal


def _wrap(text: str, indent: int, width: int = WIDTH) -> list[str]:
    """``text`` in pieces of at most ``width - indent`` characters. JSON (it starts with ``{`` or
    ``[``) is cut only after a comma that is followed by a key, an object or an array, so that a
    string is never split at a comma or a space of its own; prose is cut at a space. A cut that
    would leave a piece shorter than a third of the room, or find no such place, falls at the
    width."""
    room = max(width - indent, 20)
    is_json = text[:1] in "{["
    pieces: list[str] = []
    while len(text) > room:
        cut = -1
        if is_json:
            for i in range(room - 1, room // 3 - 1, -1):
                if text[i] == "," and text[i + 1 : i + 2] in ('"', "{", "["):
                    cut = i + 1
                    break
        else:
            space = text.rfind(" ", 0, room + 1)
            cut = space if space >= room // 3 else -1
        if cut < 0:
            cut = room
        pieces.append(text[:cut].rstrip(" "))
        text = text[cut:].lstrip(" ")
    pieces.append(text)
    return pieces


def _compact(value: JsonValue) -> str:
    return orjson.dumps(value).decode()


def _meta_changes(sent: Field, received: Field) -> list[str]:
    """Readable differences between two ``_meta`` fields (omitted, null or object)."""
    if received is OMITTED:
        return ["_meta dropped"] if sent is not OMITTED else []
    if received is None:
        return [] if sent is None else ["_meta: null (a clear)"]
    if not isinstance(received, dict):
        return [f"_meta: {_compact(received)}"]
    before = sent if isinstance(sent, dict) else {}
    out: list[str] = []
    if sent is OMITTED:
        out.append("the agent sent no _meta: a patch with only these keys leaves its keys alone")
    elif sent is None:
        out.append("the clear became an object: stale keys survive")
    for key, value in received.items():
        removal = " (removed)" if value is None else ""
        if key not in before:
            out.append(f"{'-' if removal else '+'} {key}: {_compact(value)}{removal}")
        elif before[key] != value:
            out.append(f"~ {key}: {_compact(before[key])} -> {_compact(value)}{removal}")
    out.extend(f"- {key} (dropped from the update)" for key in before if key not in received)
    return out


class _Style:
    def __init__(self, color: bool) -> None:
        self.color = color

    def _wrap(self, code: str, text: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.color else text

    def bold(self, text: str) -> str:
        return self._wrap("1", text)

    def dim(self, text: str) -> str:
        return self._wrap("2", text)

    def green(self, text: str) -> str:
        return self._wrap("32", text)

    def yellow(self, text: str) -> str:
        return self._wrap("33", text)

    def red(self, text: str) -> str:
        return self._wrap("31", text)


def _meta_text(value: JsonValue) -> str:
    return "(none)" if value is None else _compact(value)


def render_text(report: JsonObject, color: bool) -> str:
    """The terminal report of ``build_report``'s content (ANSI colors only when ``color``)."""
    s = _Style(color)
    lines: list[str] = []

    def add(line: str) -> None:
        lines.append(line)

    def block(head: str, text: str, paint: Callable[[str], str] = str) -> None:
        """``head`` then ``text`` wrapped under its start (``head`` sets the indent)."""
        for i, piece in enumerate(_wrap(text, len(head))):
            add((head if i == 0 else " " * len(head)) + paint(piece))

    add(s.bold("acp-proxy demo") + ": a scripted ACP v2 client and agent, acp-proxy in between")
    add(f"  rules  {report['config']}")
    for sentence in _as_list(report.get("rules", [])):
        block("         ", str(sentence))
    command = [str(word) for word in _as_list(report["proxy_command"])]
    cut = command.index("--") + 1 if "--" in command else len(command)
    if len(" ".join(command)) > WIDTH - 9 and cut < len(command):
        block("  run    ", " ".join(command[:cut]))  # the proxy's part, then the agent's
        block("         ", " ".join(command[cut:]))
    else:
        block("  run    ", " ".join(command))
    add("")
    add(f"initialize      protocolVersion {report['protocolVersion']}")
    add(f"session/new     {report['sessionId']}")
    add(f'session/prompt  "{PROMPT_TEXT}"')
    add("")
    add(s.bold("Updates") + "  (agent: what the agent wrote; client: what the client read)")
    rows = [_obj(r) for r in _as_list(report["updates"])]
    width = max((len(str(r["kind"])) for r in rows), default=10)
    for number, row in enumerate(rows, 1):
        add("")
        add(f"{number:>2}  {s.bold(str(row['kind']).ljust(width))}  {row['entity']}")
        for sent in _as_list(row["sent"]):
            block("    agent   ", _compact(sent))
        received = row["received"]
        status = row["status"]
        if status == "unchanged":
            note = "same bytes"
            if isinstance(received, dict) and received.get("_meta", OMITTED) is None:
                note += " (the clear is kept)"
            elif row["kind"] == "plan_update":
                note += " (plan_update is a snapshot, not a patch: left alone)"
            add(f"    client  {s.green(note)}")
        elif status == "missing":
            add(f"    client  {s.red('(not received)')}")
        elif status == "rewritten" and isinstance(received, dict):
            meta = _compact(received["_meta"]) if "_meta" in received else "omitted"
            add(f"    client  {s.yellow('same update, with this _meta:')}")
            block("            ", meta)
            for change in _as_list(row.get("meta_changes", [])):
                block("            ", str(change), s.yellow)
        else:
            block("    client  ", _compact(received))
            if status == "merged":
                merged = f"^ {len(_as_list(row['sent']))} agent updates coalesced into one"
                add(f"            {s.dim(merged)}")
        for inserted in _as_list(row["inserted"]):
            block("    client+ ", _compact(inserted))
            add(
                f"            {s.yellow('^ inserted by the proxy: its keys, after the kept clear')}"
            )
    add("")
    add(s.bold("Stored _meta per entity") + " (client model: acp_proxy.meta.state.ClientModel)")
    final = _obj(report["final_meta"])
    direct = _obj(report["direct_meta"])
    naive = _obj(report["naive_meta"])
    naive_proxy = _obj(report["naive_proxy_meta"])
    for entity, correct in final.items():
        add(f"  {s.bold(entity)}")
        block("    agent alone    ", _meta_text(direct.get(entity)))
        block("    via acp-proxy  ", _meta_text(correct), s.green)
        for label, other in (("naive client", naive), ("naive proxy ", naive_proxy)):
            verdict = _naive_verdict(correct, other.get(entity))
            block(f"    {label}   ", _meta_text(other.get(entity)))
            if verdict:
                block("                   ", verdict, s.red)
            else:
                lines[-1] += s.dim("  (same)")
    add("")
    add(
        s.dim("naive client: replaces the stored _meta whole with each object (the rule before the")
    )
    add(
        s.dim("  RFD), so the proxy's keys on an update sent without _meta erase the agent's keys.")
    )
    add(s.dim("naive proxy: writes its keys into the agent's `_meta: null` instead of keeping the"))
    add(s.dim("  clear and following it, so the keys the clear removed survive."))
    summary = _obj(report["summary"])
    add("")
    add(
        f"{summary['agent_updates']} updates from the agent, {summary['client_updates']} to the "
        f"client: {summary['unchanged']} byte-exact, {summary['rewritten']} annotated, "
        f"{summary['inserted']} inserted, {summary['merged']} coalesced."
    )
    return "\n".join(lines) + "\n"


def _naive_verdict(correct: JsonValue, naive: JsonValue) -> str:
    if correct == naive:
        return ""
    ok = correct if isinstance(correct, dict) else {}
    bad = naive if isinstance(naive, dict) else {}
    parts = [f"loses {k}" for k in ok if k not in bad]
    for key, value in bad.items():
        if key not in ok:
            parts.append(f"stores {key}: null" if value is None else f"keeps stale {key}")
        elif value != ok[key]:
            parts.append(f"wrong {key}")
    return "<- " + ", ".join(parts)


def _as_list(value: JsonValue) -> list[JsonValue]:
    return value if isinstance(value, list) else []


def _obj(value: JsonValue) -> JsonObject:
    return value if isinstance(value, dict) else {}


def build_report(
    config: str,
    proxy_command: Sequence[str],
    direct: SessionRecord,
    proxied: SessionRecord,
    rules: Sequence[str] = (),
) -> JsonObject:
    """The machine-readable transcript (``--json``); ``render_text`` prints the same content."""
    rows = pair_updates(direct, proxied)
    updates: list[JsonValue] = []
    for row in rows:
        sent: list[JsonValue] = [u for _raw, u in row.sent]
        received = row.received[1] if row.received is not None else None
        item: JsonObject = {
            "kind": row.kind,
            "entity": row.entity,
            "status": row.status,
            "sent": sent,
            "received": received,
            "inserted": list(row.inserted),
        }
        if row.status == "rewritten" and received is not None:
            before: Field = row.sent[0][1].get("_meta", OMITTED)
            item["meta_changes"] = list(_meta_changes(before, received.get("_meta", OMITTED)))
        updates.append(item)
    summary: JsonObject = {
        "agent_updates": sum(len(r.sent) for r in rows),
        "client_updates": sum((r.received is not None) + len(r.inserted) for r in rows),
        "unchanged": sum(r.status == "unchanged" for r in rows),
        "rewritten": sum(r.status == "rewritten" for r in rows),
        "inserted": sum(len(r.inserted) for r in rows),
        "merged": sum(len(r.sent) for r in rows if r.status == "merged"),
    }
    final = final_meta(proxied)
    return {
        "config": config,
        "rules": list(rules),
        "proxy_command": list(proxy_command),
        "protocolVersion": proxied.negotiated_version,
        "sessionId": proxied.session_id,
        "updates": updates,
        "final_meta": dict(final),
        "direct_meta": dict(final_meta(direct)),
        "naive_meta": dict(naive_meta(proxied)),
        "naive_proxy_meta": dict(naive_proxy_meta(proxied)),
        "summary": summary,
        "transcript": {
            "client_sent": list(proxied.sent),
            "agent_sent": [_frame_json(f) for f in direct.received],
            "client_received": [_frame_json(f) for f in proxied.received],
        },
        "proxy_exit_code": proxied.returncode,
    }


def _frame_json(frame: Frame) -> JsonValue:
    return frame.message if frame.message is not None else frame.raw.decode("utf-8", "replace")
