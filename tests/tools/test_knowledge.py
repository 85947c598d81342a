"""`knowledge_search`: a knowledge resource pinned by an image, searched with BM25 (SQLite FTS5) in
the function tier, the relevant passage first, with its citation."""

from __future__ import annotations

from pathlib import Path

import httpx

from agentvm.drivers.scripted import ScriptedDriver, parse_script
from agentvm.tools.knowledge import KnowledgeIndex, passages
from tests.support.servers import in_process
from tests.support.stock_client import StockClient

CORPUS = {"documents": [
    {"id": "shipping", "title": "Shipping", "text": "Orders ship within two business days. Express delivery "
     "arrives the next day in most cities.\n\nInternational parcels may take up to three weeks."},
    {"id": "refunds", "title": "Refund policy", "text": "You can return any item within 30 days for a full "
     "refund. Refunds are paid back to the original card within five days of receiving the return."},
    {"id": "warranty", "title": "Warranty", "text": "Electronics carry a two-year warranty covering defects. "
     "Accidental damage is not covered by the warranty."},
    {"id": "privacy", "title": "Privacy", "text": "We never sell personal data. Card numbers are stored by our "
     "payment processor, not by us."},
]}

SCRIPT = """
rules:
  - match: "^can I get my money back"
    responses:
      - tool_calls: [{id: toolu_k, name: knowledge_search, input: {query: "refund money back return", limit: 2}}]
      - text: ["Yes, within 30 days [1]."]
"""


def test_passages_merge_short_paragraphs_and_cut_long_ones() -> None:
    assert passages("a\n\nb\n\n\nc") == ["a\n\nb\n\nc"]
    long = "Sentence one is here. " * 80
    parts = passages(long)
    assert all(len(p) <= 800 for p in parts) and "".join(parts).replace(" ", "") == long.replace(" ", "")


def test_bm25_ranks_the_relevant_passage_first_and_ignores_query_syntax() -> None:
    index = KnowledgeIndex("resource://knowledge/handbook@1.0.0", CORPUS)
    assert index.search("how long does delivery take", 5)[0].doc_id == "shipping"
    assert index.search("returned items refunded", 5)[0].doc_id == "refunds"  # stemming
    # FTS syntax in a query is searched as words, never run: no error, "not" matches as a word
    assert [p.doc_id for p in index.search('warranty" OR NOT (*', 5)] == ["warranty", "privacy"]
    assert index.search("...", 5) == []


async def test_a_turn_searches_the_pinned_knowledge_in_the_function_tier(tmp_path: Path) -> None:
    driver = ScriptedDriver(parse_script(SCRIPT))
    async with in_process(tmp_path / "data", driver=driver) as srv, \
            httpx.AsyncClient(base_url=srv.http) as http, StockClient(srv.url) as ws:
        bad = await http.post("/v1/resources", json={"kind": "knowledge", "name": "empty", "version": "1.0.0",
                                                      "content": {"documents": []}})
        assert bad.status_code == 400
        assert bad.json()["error"]["message"] == "content.documents: a non-empty list of {id, title?, text}"
        created = await http.post("/v1/resources", json={"kind": "knowledge", "name": "handbook", "version": "1.0.0",
                                                          "content": CORPUS})
        assert created.status_code == 201, created.text
        agent = await http.post("/v1/resources", json={
            "kind": "agent", "name": "support", "version": "1.0.0",
            "content": {"systemPrompt": "Answer from the handbook.", "knowledge": ["resource://knowledge/handbook@^1"]},
            "dependencies": ["resource://knowledge/handbook@^1"]})
        assert agent.status_code == 201, agent.text
        image = await ws.new_image("c-support", agent="resource://agents/support")
        events = await ws.turn(image["imageId"], "can I get my money back?")
        [result] = [e["data"] for e in events if e["type"] == "tool_result"]
        assert result["isError"] is False
        first = result["result"].split("\n\n[2]")[0]
        assert first.startswith("[1] resource://knowledge/handbook@1.0.0 › refunds (Refund policy)\n"
                                "You can return any item within 30 days for a full refund.")
        done = events[-1]["data"]
        assert (done["status"], done["tier"]) == ("completed", "function")  # no sandbox needed
        assert srv.runtime.container_tier.dispatches == 0
        history = (await ws.request("image_messages_request", {"imageId": image["imageId"]}))["data"]["messages"]
        stored = [m for m in history if m["subtype"] == "tool-result"]
        assert stored[0]["toolResult"]["output"]["value"] == result["result"]
