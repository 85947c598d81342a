"""`knowledge_search`: ranked, cited passages from the knowledge resources an image pinned.

A knowledge resource's content is `{"documents": [{"id", "title"?, "text"}]}`. Each document is cut
into passages (paragraphs, merged up to ~800 characters); passages are indexed with SQLite FTS5
(porter stemming) and ranked with BM25. The index of a version is built in memory when first
searched and kept per content hash: versions never change, and a version's content is at most
256 KB (a few milliseconds to index), so building is cheaper than fetching a stored index — in the
function tier locally and in the cloud alike. The tool needs no sandbox: it runs where the turn is.
"""

from __future__ import annotations

import re
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentvm.domain.models import ResourceVersion
from agentvm.domain.resource_uri import choose_version, parse_resource_uri, resource_uri
from agentvm.drivers.base import ToolOutcome
from agentvm.engine.tools import unavailable
from agentvm.ports import Store

JSON = dict[str, Any]
TOOL = "knowledge_search"
PASSAGE_CHARS = 800
MAX_RESULTS = 10
_WORD = re.compile(r"\w+", re.UNICODE)

SCHEMA: JSON = {
    "name": TOOL,
    "description": ("Search the agent's knowledge base. Returns the most relevant passages, best first, each "
                    "with its source [document id and title] to cite."),
    "input_schema": {"type": "object", "additionalProperties": False, "required": ["query"], "properties": {
        "query": {"type": "string", "description": "What to look for, in words."},
        "limit": {"type": "integer", "minimum": 1, "maximum": MAX_RESULTS, "description": "How many passages."}}},
}


def check_content(content: Mapping[str, Any]) -> None:
    """A knowledge resource's content: ValueError naming the problem."""
    docs = content.get("documents")
    if not isinstance(docs, list) or not docs:
        raise ValueError("documents: a non-empty list of {id, title?, text}")
    seen: set[str] = set()
    for i, doc in enumerate(docs):
        if not isinstance(doc, dict) or not isinstance(doc.get("text"), str) or not doc["text"].strip():
            raise ValueError(f"documents[{i}].text: a non-empty string")
        doc_id = doc.get("id", str(i + 1))
        if not isinstance(doc_id, str | int) or str(doc_id) in seen:
            raise ValueError(f"documents[{i}].id: a unique string")
        seen.add(str(doc_id))
        if "title" in doc and not isinstance(doc["title"], str):
            raise ValueError(f"documents[{i}].title: a string")


@dataclass(frozen=True, slots=True)
class Passage:
    source: str  # the pinned resource URI
    doc_id: str
    title: str
    text: str
    score: float  # BM25 (lower is better, as SQLite reports it)


def passages(text: str) -> list[str]:
    """Paragraphs, short ones merged up to PASSAGE_CHARS, long ones cut at sentence ends."""
    out: list[str] = []
    current = ""
    for para in (p.strip() for p in re.split(r"\n\s*\n", text)):
        if not para:
            continue
        while len(para) > PASSAGE_CHARS:
            cut = para.rfind(". ", 0, PASSAGE_CHARS)
            cut = cut + 1 if cut > PASSAGE_CHARS // 2 else PASSAGE_CHARS
            out.append(para[:cut].strip())
            para = para[cut:].strip()
        if current and len(current) + len(para) + 2 > PASSAGE_CHARS:
            out.append(current)
            current = ""
        current = f"{current}\n\n{para}" if current else para
    if current:
        out.append(current)
    return out


class KnowledgeIndex:
    """An FTS5 index of one knowledge version (in memory; SQLite calls under a lock, off the loop)."""

    def __init__(self, source: str, content: Mapping[str, Any]) -> None:
        self.source = source
        self._lock = threading.Lock()
        self._db = sqlite3.connect(":memory:", check_same_thread=False)
        self._db.execute("CREATE VIRTUAL TABLE p USING fts5(doc_id UNINDEXED, title, text, "
                         "tokenize='porter unicode61')")
        rows = []
        for i, doc in enumerate(content.get("documents") or []):
            for part in passages(str(doc.get("text", ""))):
                rows.append((str(doc.get("id", i + 1)), str(doc.get("title", "")), part))
        self._db.executemany("INSERT INTO p(doc_id, title, text) VALUES (?, ?, ?)", rows)

    def search(self, query: str, limit: int) -> list[Passage]:
        words = _WORD.findall(query.lower())
        if not words:
            return []
        match = " OR ".join(f'"{w}"' for w in dict.fromkeys(words))  # quoted: no FTS syntax from users
        with self._lock:
            rows = self._db.execute("SELECT doc_id, title, text, bm25(p) FROM p WHERE p MATCH ? "
                                    "ORDER BY bm25(p) LIMIT ?", (match, limit)).fetchall()
        return [Passage(self.source, r[0], r[1], r[2], float(r[3])) for r in rows]


_indexes: OrderedDict[str, KnowledgeIndex] = OrderedDict()
_CACHED = 64


def index_for(rv: ResourceVersion) -> KnowledgeIndex:
    key = rv.content_hash
    index = _indexes.get(key)
    if index is None:
        index = KnowledgeIndex(resource_uri(rv.kind, rv.name, rv.version), rv.content)
        _indexes[key] = index
        while len(_indexes) > _CACHED:
            _indexes.popitem(last=False)
    else:
        _indexes.move_to_end(key)
    return index


class KnowledgeTools:
    """The `knowledge_search` tool of one image (`ToolRunner`), over its pinned knowledge resources."""

    def __init__(self, store: Store, tenant_id: str, sources: list[str]) -> None:
        self.store = store
        self.tenant_id = tenant_id
        self.sources = sources

    def schemas(self) -> list[JSON]:
        return [SCHEMA]

    def needs_sandbox(self, name: str) -> bool:
        return False

    async def run(self, name: str, input_: JSON) -> ToolOutcome:
        if name != TOOL:
            return unavailable(name)
        query, limit = input_.get("query"), input_.get("limit", 5)
        if not isinstance(query, str) or not query.strip():
            return ToolOutcome(f"{TOOL}: query: must be a non-empty string", is_error=True)
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_RESULTS:
            return ToolOutcome(f"{TOOL}: limit: must be an integer from 1 to {MAX_RESULTS}", is_error=True)
        import asyncio

        found: list[Passage] = []
        for uri in self.sources:
            rv = await self._version(uri)
            if rv is None:
                return ToolOutcome(f"{TOOL}: {uri} is no longer available", is_error=True)
            index = await asyncio.to_thread(index_for, rv)
            found += await asyncio.to_thread(index.search, query, limit)
        found.sort(key=lambda p: p.score)
        if not found:
            return ToolOutcome(f"No passage matches '{query}'.")
        lines = []
        for n, p in enumerate(found[:limit], 1):
            title = f" ({p.title})" if p.title else ""
            lines.append(f"[{n}] {p.source} › {p.doc_id}{title}\n{p.text}")
        return ToolOutcome("\n\n".join(lines))

    async def _version(self, uri: str) -> ResourceVersion | None:
        ref = parse_resource_uri(uri)
        return choose_version(await self.store.find_resource(self.tenant_id, ref.kind, ref.name), ref.spec)


def knowledge_tools(store: Store | None, tenant_id: str, config: Mapping[str, Any]) -> KnowledgeTools | None:
    """The image's `knowledge_search`, when its snapshot pinned knowledge (and a store is at hand)."""
    sources = [str(u) for u in config.get("knowledge") or ()]
    return KnowledgeTools(store, tenant_id, sources) if sources and store is not None else None
