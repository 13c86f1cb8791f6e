"""The coalescing queue's tail run: its per-entity index, and how a waiting line joins it.

Contract: owns the index of the entries waiting after the last barrier (entity -> position of
its last waiting entry, and its spec), the text groups that merged lately (``hot``), and how one
line looked at by a merge pass joins the queue's waiting entries: merged into its entity's last
waiting entry of the tail run, or appended (a line that is not a mergeable ``session/update``
is a barrier and closes the run). A line's entity comes from its shape on the bytes path
(``coalesce_bytes``, with the C accelerator), else from its parse (``coalesce_keys.classify``);
two lines merge on the bytes path when it knows their merge, else by parsing
(``Group.absorb``). The queue hands it its entries for a pass (``begin``) and takes back what the
pass changed (``bytes``, ``count``, ``groups``, ``merged``). Pure: no I/O, no clock; never
mutates a line.
"""

from __future__ import annotations

from collections.abc import Sequence

import orjson

from acp_proxy.base.jsontypes import JsonObject
from acp_proxy.wire.coalesce.bytes_merge import group_of, merge
from acp_proxy.wire.coalesce.keys import Class, EntityKey, Spec, Table, classify
from acp_proxy.wire.coalesce.merge import Group
from acp_proxy.wire.coalesce.shape import FIELD_TABLE, FIELDS, IDENTS, Kinds, Shape, update_shape
from acp_proxy.wire.coalesce.take import FRAME_OVERHEAD, Run

_NEEDLE = b'"session/update"'
_HOT = 4  # text groups tried before a line is parsed

# A waiting entry: one line as it came (bytes), several lines as they came (a ``Run``: not merge
# candidates), or a group of one entity's lines.
Entry = bytes | Run | Group


class TailRun:
    """The tail run of one queue (owned by it): its index, and the lines a pass adds."""

    __slots__ = ("base", "bytes", "count", "done", "groups", "hot", "index", "interval", "merged")

    def __init__(self, interval: float) -> None:
        # entity -> (position of its last waiting entry, its spec); a position below the
        # queue's first waiting entry was written already.
        self.index: dict[EntityKey, tuple[int, Spec]] = {}
        # Text groups that merged a line lately (at most ``_HOT``): the next chunk of their
        # message merges without a parse (``_merge_hot``; the bytes path does not need them).
        self.hot: list[Group] = []
        self.interval = interval  # the rate limit: every new entry is a group
        # The pass in progress: the queue's waiting entries (appended to in place), the
        # position of the first, and what the lines added changed.
        self.done: list[Entry] = []
        self.base = 0
        self.bytes = self.count = self.groups = self.merged = 0

    def begin(self, done: list[Entry], base: int) -> None:
        """A pass over lines that join ``done`` (its first entry at position ``base``)."""
        self.done, self.base = done, base
        self.bytes = self.count = self.groups = self.merged = 0

    def forget(self) -> None:
        """A new run: no entry waits in it (a new version, everything taken)."""
        self.index.clear()
        self.hot = []

    def add(self, line: bytes, table: Table) -> None:
        """One line: merged into its entity's last waiting entry of the tail run, or appended."""
        if self.hot and self._merge_hot(line):
            return
        message: object = None
        if _NEEDLE in line:
            try:
                message = orjson.loads(line)
            except orjson.JSONDecodeError:
                message = None
        found = classify(message, table) if message is not None else None
        if found is None:
            if self.index:
                self.index.clear()  # a barrier closes the run: nothing merges across it
            self.done.append(line)
            self.bytes += len(line) + 1 + FRAME_OVERHEAD
            return
        spec, key = found
        target = self._target(spec, key)
        assert isinstance(message, dict)
        if target is None or not self._absorb(target, line, message):
            self._append(line, spec, key, None, None)

    def add_lines(self, lines: Sequence[bytes], table: Table, kinds: Kinds | None) -> None:
        """Each of ``lines`` in order, as ``add``; with ``kinds`` (the bytes path,
        ``coalesce_bytes``) a line's shape gives its entity, and its merge when the bytes path
        knows it (else the parse judges); a line without such a shape takes ``add``."""
        add = self.add
        if kinds is None:
            for line in lines:
                add(line, table)
            return
        index, done, base = self.index, self.done, self.base
        merged = change = 0  # (merges on the bytes path, counted once for all)
        for line in lines:
            shape = update_shape(line, FIELDS, IDENTS, FIELD_TABLE, kinds)
            key = shape[1] if shape is not None else None
            if key is None:
                add(line, table)
                continue
            assert shape is not None
            spec = shape[0].spec  # (never ``Class.OPAQUE``)
            hit = index.get(key)
            if hit is not None and hit[1] is spec and hit[0] >= base:
                pos = hit[0] - base
                target = done[pos]
                if type(target) is not Group:
                    target = self._grouped(pos, spec, key, kinds)
                fast = target.fast
                if fast is not None:
                    charge = merge(target, fast, line, shape)
                    if charge is not None:
                        change += charge
                        merged += 1
                        target.merged += 1
                        continue
                if self._absorb(target, line, orjson.loads(line)):  # (the shape found it valid)
                    continue
            self._append(line, spec, key, kinds, shape)
        self.bytes += change
        self.merged += merged
        self.count -= merged  # (a group on the bytes path writes one frame)

    def _target(self, spec: Spec, key: EntityKey) -> Group | None:
        """The entry a line of ``spec`` and ``key`` may merge into (its entity's last waiting
        entry of the tail run), made a group; None: none."""
        hit = self.index.get(key)
        if hit is None or hit[1] is not spec or spec.cls is Class.OPAQUE or hit[0] < self.base:
            return None  # (below ``base``: written already)
        pos = hit[0] - self.base
        target = self.done[pos]
        return target if type(target) is Group else self._grouped(pos, spec, key, None)

    def _grouped(self, pos: int, spec: Spec, key: EntityKey, kinds: Kinds | None) -> Group:
        """The line waiting at ``pos`` made a group (on the bytes path: ``kinds``)."""
        line = self.done[pos]
        assert isinstance(line, bytes)  # the index holds lines and groups, never runs
        group = group_of(line, spec, key, kinds)
        self.done[pos] = group
        self.groups += 1
        self.bytes += group.charge - (len(line) + 1 + FRAME_OVERHEAD)
        return group

    def _absorb(self, target: Group, line: bytes, message: JsonObject) -> bool:
        """``Group.absorb`` (the merge by parsing) and what it changed in the queue."""
        lines, charge = target.lines, target.charge
        merged = target.absorb(line, message) is not None
        # What the group holds changed even when it refused the line (its first line was
        # parsed to look): counted from its charge, before and after.
        self.bytes += target.charge - charge
        if merged:
            self.merged += 1
            target.merged += 1
            self.count += target.lines - lines - 1
            if target.tpl is not None and target not in self.hot:
                self.hot = [target, *self.hot[: _HOT - 1]]
        return merged

    def _append(
        self,
        line: bytes,
        spec: Spec,
        key: EntityKey,
        kinds: Kinds | None,
        shape: Shape | None,
    ) -> None:
        """``line`` waits after the others, its entity's last waiting entry."""
        self.index[key] = (self.base + len(self.done), spec)
        if self.interval:  # the rate limit holds entries by entity
            group = group_of(line, spec, key, kinds, shape)
            self.done.append(group)
            self.groups += 1
            self.bytes += group.charge
        else:
            self.done.append(line)
            self.bytes += len(line) + 1 + FRAME_OVERHEAD

    def _merge_hot(self, line: bytes) -> bool:
        """``line`` merged, without a parse, into a hot text group whose bytes it repeats
        around another text (``Group.text_of``), if that group is still its entity's last
        waiting entry of the tail run."""
        for group in self.hot:
            text = group.text_of(line)
            if text is None:
                continue
            hit = self.index.get(group.key)
            pos = -1 if hit is None else hit[0] - self.base
            if pos < 0 or self.done[pos] is not group:  # written, or behind a barrier
                self.hot.remove(group)
                return False
            self.bytes += group.add_text(line, text)
            self.merged += 1
            group.merged += 1
            self.count -= 1
            return True
        return False
