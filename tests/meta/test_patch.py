"""The metadata-patch algebra: the RFD's conformance table, the published vectors, and laws."""

from __future__ import annotations

import json
from functools import reduce
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from patch_fixtures import frozen, has_null_key, meta_fields, stored_meta
from proxy_harness import TESTS

from acp_proxy.base.jsontypes import OMITTED, Field, JsonObject
from acp_proxy.meta.patch import (
    MetaPatch,
    apply_meta_patches,
    apply_meta_update,
    as_patch,
    compose,
    normalize_stored,
)

VECTORS = TESTS / "vectors" / "meta_patches.json"

# The RFD's "Conformance cases" table, verbatim (v2-metadata-patches.md).
RFD_TABLE = """
| Stored `_meta` | Incoming `_meta` | Result |
| - | - | - |
| `{"a": 1, "b": 2}` | omitted | `{"a": 1, "b": 2}` |
| `{"a": 1, "b": 2}` | `null` | no metadata |
| `{"a": 1, "b": 2}` | `{}` | `{"a": 1, "b": 2}` |
| `{"a": 1, "b": 2}` | `{"a": 3}` | `{"a": 3, "b": 2}` |
| `{"a": 1, "b": 2}` | `{"a": null}` | `{"b": 2}` |
| no metadata | `{"a": null}` | no metadata |
| `{"a": {"x": 1, "y": 2}}` | `{"a": {"x": 3}}` | `{"a": {"x": 3}}` |
| `{"a": [1, 2]}` | `{"a": [3]}` | `{"a": [3]}` |
| no metadata | `{"a": {"x": null}}` | `{"a": {"x": null}}` |
"""

SETTINGS = settings(max_examples=250, deadline=None)


def _cell(text: str) -> Any:
    """Parse one table cell: ``omitted``, ``no metadata`` or a backquoted JSON value."""
    text = text.strip()
    if text == "omitted":
        return OMITTED
    if text == "no metadata":
        return None
    assert text.startswith("`") and text.endswith("`"), text
    return json.loads(text[1:-1])


def _table_rows() -> list[tuple[Any, Any, Any]]:
    rows = []
    for line in RFD_TABLE.strip().splitlines()[2:]:
        cells = line.strip().strip("|").split("|")
        stored, incoming, result = (_cell(c) for c in cells)
        rows.append((stored, incoming, result))
    return rows


def _load_vectors() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(VECTORS.read_text(encoding="utf-8"))
    return doc


def _from_vector(value: Any) -> Any:
    return OMITTED if value == "omitted" else value


def test_rfd_table_has_nine_rows() -> None:
    assert len(_table_rows()) == 9


@pytest.mark.parametrize(("stored", "incoming", "result"), _table_rows())
def test_rfd_conformance_table(stored: Any, incoming: Field, result: Any) -> None:
    assert apply_meta_update(stored, incoming) == result


def test_vectors_contain_the_rfd_table_verbatim() -> None:
    conformance = [c for c in _load_vectors()["cases"] if c["group"] == "conformance"]
    as_rows = [
        (c["stored"], c["incoming"][0].get("_meta", OMITTED), c["result"]) for c in conformance
    ]
    assert as_rows == _table_rows()


def test_vectors_cover_the_cases_the_rfd_names() -> None:
    groups = {c["group"] for c in _load_vectors()["cases"]}
    assert {"conformance", "unknown-keys", "clear-then-object", "replay"} <= groups


@pytest.mark.parametrize("case", _load_vectors()["cases"], ids=lambda c: c["name"])
def test_vector(case: dict[str, Any]) -> None:
    before = frozen(case)
    patches = tuple(u.get("_meta", OMITTED) for u in case["incoming"])
    assert apply_meta_patches(case["stored"], patches) == case["result"]
    assert case == before


@pytest.mark.parametrize("case", _load_vectors()["compose"], ids=str)
def test_compose_vector(case: dict[str, Any]) -> None:
    a, b = _from_vector(case["a"]), _from_vector(case["b"])
    expected = tuple(_from_vector(p) for p in case["result"])
    assert compose(a, b) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (OMITTED, OMITTED),
        (None, None),
        ({"a": None}, {"a": None}),
        ("s", OMITTED),
        (3, OMITTED),
        (1.5, OMITTED),
        (True, OMITTED),
        ([], OMITTED),
        ([{"a": 1}], OMITTED),
    ],
)
def test_as_patch(raw: Field, expected: MetaPatch) -> None:
    assert as_patch(raw) == expected


def test_normalize_stored() -> None:
    assert normalize_stored(None) is None
    assert normalize_stored({}) is None
    assert normalize_stored({"a": None}) is None
    assert normalize_stored({"a": None, "b": {"c": None}}) == {"b": {"c": None}}


def test_apply_never_aliases_stored() -> None:
    stored: JsonObject = {"a": 1}
    patches: list[Any] = [OMITTED, {}, {"b": 2}]
    for patch in patches:
        result = apply_meta_update(stored, patch)
        assert result == {"a": 1, **({"b": 2} if patch == {"b": 2} else {})}
        assert result is not stored


# --- properties ---------------------------------------------------------------------------


@SETTINGS
@given(stored=stored_meta, patch=meta_fields)
def test_results_are_normalized_and_inputs_untouched(stored: Any, patch: Any) -> None:
    before = frozen((stored, patch))
    result = apply_meta_update(stored, patch)
    assert result != {}
    assert not has_null_key(result)
    assert (stored, patch) == before


@SETTINGS
@given(stored=stored_meta)
def test_empty_object_and_omitted_are_no_ops(stored: Any) -> None:
    assert apply_meta_update(stored, {}) == stored
    assert apply_meta_update(stored, OMITTED) == stored


@SETTINGS
@given(stored=stored_meta, patch=meta_fields)
def test_key_rule(stored: Any, patch: Any) -> None:
    """Each key of an object patch: null removes, a value replaces whole; others unchanged."""
    result = apply_meta_update(stored, patch) or {}
    if not isinstance(patch, dict):
        expected = {} if patch is None else (stored or {})
        assert result == expected
        return
    for key in {*(stored or {}), *patch}:
        if key in patch:
            assert result.get(key) == patch[key]  # None when removed
            assert (key in result) == (patch[key] is not None)
        else:
            assert result.get(key) == (stored or {}).get(key)


@SETTINGS
@given(stored=stored_meta, a=meta_fields, b=meta_fields)
def test_composition_law(stored: Any, a: Any, b: Any) -> None:
    before = frozen((stored, a, b))
    composed = compose(a, b)
    assert (stored, a, b) == before
    assert apply_meta_patches(stored, composed) == apply_meta_update(
        apply_meta_update(stored, a), b
    )
    # One patch unless a clear is followed by an object that still sets something.
    two = as_patch(a) is None and isinstance(b, dict) and any(v is not None for v in b.values())
    assert len(composed) == (2 if two else 1)
    if two:
        assert composed[0] is None
        assert isinstance(composed[1], dict) and None not in composed[1].values()


@SETTINGS
@given(stored=stored_meta, patches=st.lists(meta_fields, max_size=6))
def test_compose_folds_any_sequence(stored: Any, patches: list[Any]) -> None:
    """Folding compose over a sequence (as a coalescing queue does) never changes the result."""

    def push(acc: tuple[MetaPatch, ...], nxt: Any) -> tuple[MetaPatch, ...]:
        return (*acc[:-1], *compose(acc[-1], nxt)) if acc else (as_patch(nxt),)

    empty: tuple[MetaPatch, ...] = ()
    folded = reduce(push, patches, empty)
    assert apply_meta_patches(stored, folded) == apply_meta_patches(stored, tuple(patches))
