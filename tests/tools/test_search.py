"""search_documents: BM25 ranking, snippets, attachment filtering."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tools.base import Attachment, PermanentToolError
from tools.builtin.search import BM25Index, SearchDocumentsTool, snippet, tokenize
from tools.registry import ToolRegistry

from .conftest import make_context

DOCS = {
    "a": "The quick brown fox jumps over the lazy dog. Foxes are quick.",
    "b": "Kimi Linear uses KDA layers interleaved with MLA attention layers.",
    "c": "A recipe: flour, water, salt. Knead the dough and let it rest.",
}


def test_bm25_matches_the_formula() -> None:
    idx = BM25Index(list(DOCS.items()), k1=1.5, b=0.75)
    q = tokenize("quick fox")
    p = next(p for p in idx.passages if p.doc_id == "a")
    n, avg = len(idx.passages), idx.avg_len
    expected = 0.0
    for t in set(q):
        df = sum(1 for x in idx.passages if t in x.terms)
        idf = math.log((n - df + 0.5) / (df + 0.5) + 1)
        tf = p.terms[t]
        expected += idf * tf * 2.5 / (tf + 1.5 * (1 - 0.75 + 0.75 * p.length / avg))
    assert idx.score(q, p) == pytest.approx(expected)
    assert [p.doc_id for _, p in idx.search("quick fox", 3)] == ["a"]  # "foxes" is a different term
    assert idx.search("nothing matches this", 3) == []


def test_tool_ranks_and_snippets(tmp_path: Path) -> None:
    long_doc = ("filler words here. " * 200) + "The secret ingredient is saffron. " + ("more filler. " * 200)
    atts = (
        *(Attachment(id=k, media_type="text/plain", text=v) for k, v in DOCS.items()),
        Attachment(id="long", media_type="text/plain", text=long_doc),
        Attachment(id="img", media_type="image/png", path=tmp_path / "x.png"),
    )
    reg = ToolRegistry([SearchDocumentsTool()])
    ctx = make_context(tmp_path, atts)
    out = reg.execute("search_documents", {"query": "KDA attention layers", "top_k": 2}, ctx).content
    assert out["searched"] == 4
    assert out["results"][0]["attachment_id"] == "b"
    assert "KDA" in out["results"][0]["snippet"]
    out = reg.execute("search_documents", {"query": "saffron ingredient"}, ctx).content
    top = out["results"][0]
    assert top["attachment_id"] == "long" and "saffron" in top["snippet"]
    assert len(top["snippet"]) <= 240 + 2 and top["snippet"].startswith("…")
    assert long_doc[top["offset"] :].startswith(top["snippet"].strip("…")[:20])


def test_text_attachment_from_file_and_filter(tmp_path: Path) -> None:
    f = tmp_path / "notes.md"
    f.write_text("# Notes\nThe deploy key rotates every Tuesday.\n")
    atts = (
        Attachment(id="notes", media_type="text/markdown", path=f),
        Attachment(id="b", media_type="text/plain", text=DOCS["b"]),
    )
    reg = ToolRegistry([SearchDocumentsTool()])
    ctx = make_context(tmp_path, atts)
    out = reg.execute("search_documents", {"query": "deploy key", "attachment_ids": ["notes"]}, ctx).content
    assert [r["attachment_id"] for r in out["results"]] == ["notes"]
    with pytest.raises(PermanentToolError, match="unknown attachment ids: zzz"):
        reg.execute("search_documents", {"query": "x", "attachment_ids": ["zzz"]}, ctx)


def test_snippet_window() -> None:
    text = "alpha " * 100 + "needle haystack needle " + "omega " * 100
    s, off = snippet(text, 0, len(text), "needle", 60)
    assert "needle haystack needle" in s and s.startswith("…") and s.endswith("…")
    assert 0 < off < text.index("needle")
