"""SQLite FTS5, the full-text engine of message search (domain/message_text.py says what is searched
and how a query and a snippet read): the tokenizer, the `snippet()` call, and an in-memory index
that ranks texts (the DynamoDB store ranks a window of messages with it; the SQLite store keeps
its index in the database, created by its migrations with the same tokenizer)."""

from __future__ import annotations

from collections.abc import Sequence

from agentvm.domain.message_text import ELLIPSIS, MARK_CLOSE, MARK_OPEN, SNIPPET_TOKENS, render_snippet

#: The FTS5 tokenizer of every search index (the SQLite store's and the in-memory one).
TOKENIZE = "porter unicode61"


def snippet_sql(table: str) -> str:
    """The FTS5 `snippet()` call of a search (its text column is the first); four parameters:
    MARK_OPEN, MARK_CLOSE, ELLIPSIS, SNIPPET_TOKENS."""
    return f"snippet({table}, 0, ?, ?, ?, ?)"


SNIPPET_ARGS = (MARK_OPEN, MARK_CLOSE, ELLIPSIS, SNIPPET_TOKENS)


def rank_texts(texts: Sequence[str], match: str) -> list[tuple[int, float, str]]:
    """Rank texts against a MATCH expression with an in-memory FTS5 index (BM25, the same tokenizer
    as the stored index): (index into `texts`, relevance (higher is better), HTML snippet) of each
    matching text, best first; equal relevance keeps the order of `texts`."""
    import sqlite3  # here: the DynamoDB store's cold start does not load it

    db = sqlite3.connect(":memory:")
    try:
        db.execute(f"CREATE VIRTUAL TABLE w USING fts5(text, tokenize='{TOKENIZE}')")
        db.executemany("INSERT INTO w (rowid, text) VALUES (?, ?)", enumerate(texts, 1))
        rows = db.execute(f"SELECT rowid, bm25(w), {snippet_sql('w')} FROM w WHERE w MATCH ? "
                          "ORDER BY bm25(w), rowid", (*SNIPPET_ARGS, match)).fetchall()
    finally:
        db.close()
    return [(int(r[0]) - 1, -float(r[1]), render_snippet(str(r[2]))) for r in rows]
