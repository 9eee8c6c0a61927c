"""`search_documents`: BM25 (Okapi) over the task's text attachments, returning passages + snippets.

Documents are cut into overlapping passages of `PASSAGE_WORDS` words so a hit points at a place,
not at a whole book; BM25 statistics (document frequency, average length) are over passages.
"""

from __future__ import annotations

import hashlib
import math
import re
import threading
from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tools.base import Attachment, PermanentToolError, RetryPolicy, ToolContext, ToolResult, ToolSpec
from tools.config import SearchConfig

PASSAGE_WORDS = 120
PASSAGE_STRIDE = 60
MAX_DOC_BYTES = 8 * 1024 * 1024
TEXT_MEDIA_TYPES = ("text/", "application/json", "application/xml", "application/x-ndjson", "application/csv")
_TOKEN = re.compile(r"\w+", re.UNICODE)


def tokenize(text: str) -> list[str]:
    return [m.group().casefold() for m in _TOKEN.finditer(text)]


@dataclass(frozen=True, slots=True)
class Passage:
    doc_id: str
    start: int  # character offsets in the document
    end: int
    terms: Counter[str]
    length: int


class BM25Index:
    def __init__(self, docs: Sequence[tuple[str, str]], *, k1: float = 1.5, b: float = 0.75) -> None:
        self.k1, self.b = k1, b
        self.texts = dict(docs)
        self.passages: list[Passage] = []
        for doc_id, text in docs:
            self.passages.extend(_passages(doc_id, text))
        self.df: Counter[str] = Counter()
        for p in self.passages:
            self.df.update(p.terms.keys())
        n = len(self.passages)
        self.avg_len = sum(p.length for p in self.passages) / n if n else 0.0
        self.idf = {t: math.log((n - df + 0.5) / (df + 0.5) + 1.0) for t, df in self.df.items()}

    def score(self, query_terms: Sequence[str], p: Passage) -> float:
        s = 0.0
        norm = self.k1 * (1 - self.b + self.b * p.length / (self.avg_len or 1.0))
        for t in set(query_terms):
            tf = p.terms.get(t, 0)
            if tf:
                s += self.idf[t] * tf * (self.k1 + 1) / (tf + norm)
        return s

    def search(self, query: str, top_k: int) -> list[tuple[float, Passage]]:
        q = tokenize(query)
        scored = [(self.score(q, p), i) for i, p in enumerate(self.passages)]
        scored = sorted((x for x in scored if x[0] > 0), key=lambda x: (-x[0], x[1]))
        out: list[tuple[float, Passage]] = []
        for s, i in scored:  # overlapping passages of one document: keep the better one only
            p = self.passages[i]
            if any(o.doc_id == p.doc_id and o.start < p.end and p.start < o.end for _, o in out):
                continue
            out.append((s, p))
            if len(out) == top_k:
                break
        return out


def _passages(doc_id: str, text: str) -> list[Passage]:
    spans = [(m.start(), m.end(), m.group().casefold()) for m in _TOKEN.finditer(text)]
    out = []
    for i in range(0, max(1, len(spans)), PASSAGE_STRIDE):
        window = spans[i : i + PASSAGE_WORDS]
        if not window:
            break
        out.append(
            Passage(doc_id, window[0][0], window[-1][1], Counter(w for _, _, w in window), len(window))
        )
        if i + PASSAGE_WORDS >= len(spans):
            break
    return out


def snippet(text: str, start: int, end: int, query: str, width: int) -> tuple[str, int]:
    """The `width`-character window of `text[start:end]` holding the most query-term hits."""
    terms = set(tokenize(query))
    hits = [m.start() for m in _TOKEN.finditer(text, start, end) if m.group().casefold() in terms]
    best = start
    if hits:
        best_count = 0
        for i, h in enumerate(hits):
            count = sum(1 for x in hits[i:] if x < h + width)
            if count > best_count:
                best, best_count = h, count
        best = max(start, best - width // 4)  # a little context before the first hit
    stop = min(end, best + width)
    s = " ".join(text[best:stop].split())
    return ("…" if best > 0 else "") + s + ("…" if stop < len(text) else ""), best


class SearchDocumentsTool:
    _cache: OrderedDict[str, BM25Index]

    def __init__(self, config: SearchConfig | None = None) -> None:
        self.config = config or SearchConfig()
        self._cache = OrderedDict()
        self._lock = threading.Lock()  # the in-process dispatcher runs tools from a thread pool
        self.spec = ToolSpec(
            name="search_documents",
            description=(
                "Full-text search (BM25) over this task's text attachments. Returns the best matching "
                "passages with the attachment id, a score, a snippet and its character offset."
            ),
            parameters={
                "type": "object",
                "properties": {
                    "query": {"type": "string", "minLength": 1, "maxLength": 1000},
                    "top_k": {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": self.config.max_results,
                        "default": 5,
                    },
                    "attachment_ids": {
                        "type": "array",
                        "items": {"type": "string"},
                        "maxItems": 100,
                        "description": "restrict to these attachments",
                    },
                },
                "required": ["query"],
                "additionalProperties": False,
            },
            result_schema={
                "type": "object",
                "properties": {
                    "results": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "attachment_id": {"type": "string"},
                                "score": {"type": "number"},
                                "snippet": {"type": "string"},
                                "offset": {"type": "integer"},
                            },
                            "required": ["attachment_id", "score", "snippet", "offset"],
                        },
                    },
                    "searched": {"type": "integer"},
                },
                "required": ["results", "searched"],
            },
            retry=RetryPolicy(max_attempts=2, timeout_s=20.0),
            idempotent=True,
            resources=("attachments",),
        )

    def run(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        wanted = set(arguments.get("attachment_ids") or ())
        docs = [
            (a.id, t) for a in context.attachments if (not wanted or a.id in wanted) and (t := _text_of(a))
        ]
        if wanted - {a.id for a in context.attachments}:
            missing = sorted(wanted - {a.id for a in context.attachments})
            raise PermanentToolError(f"unknown attachment ids: {', '.join(missing)}")
        index = self._index(docs)
        top = index.search(arguments["query"], arguments.get("top_k", 5))
        results = []
        for s, p in top:
            text, offset = snippet(
                index.texts[p.doc_id], p.start, p.end, arguments["query"], self.config.snippet_chars
            )
            results.append(
                {"attachment_id": p.doc_id, "score": round(s, 4), "snippet": text, "offset": offset}
            )
        return ToolResult(content={"results": results, "searched": len(docs)})

    def _index(self, docs: list[tuple[str, str]]) -> BM25Index:
        h = hashlib.sha256()
        for doc_id, text in docs:
            h.update(doc_id.encode() + b"\0" + hashlib.sha256(text.encode()).digest())
        key = h.hexdigest()
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        index = BM25Index(docs, k1=self.config.k1, b=self.config.b)
        with self._lock:
            self._cache[key] = index
            while len(self._cache) > 16:
                self._cache.popitem(last=False)
        return index


def _text_of(a: Attachment) -> str | None:
    if a.text is not None:
        return a.text
    if a.path is None or not a.media_type.startswith(TEXT_MEDIA_TYPES):
        return None
    try:
        with open(a.path, "rb") as f:
            return f.read(MAX_DOC_BYTES).decode("utf-8", errors="replace")
    except OSError as exc:
        raise PermanentToolError(f"cannot read attachment {a.id}: {exc.strerror}") from None
