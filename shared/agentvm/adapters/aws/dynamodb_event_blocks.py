"""A session's events as compressed block items (the format: `dynamodb_table`, "An event block")."""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from agentvm.adapters.aws.dynamodb_items import _ZLIB_LEVEL, TTL_ATTRIBUTE, Item, _key, _n, _opt_int, _s

_EVB = "EVB#"
_EVB_HI = "EVB#~"  # "~" sorts after every digit and "#"
_EVB_HEAD_LEN = len(f"{_EVB}{0:020d}")  # a block's head item; its parts' keys are longer
#: Compressed bytes per item: a block holds at most this much, and the compressed data of a single
#: event above it is continued in part items. DynamoDB's item limit is 400 KB, names included.
_BLOCK_BYTES = 300_000


def _evb_sk(last_seq: int) -> str:
    return f"{_EVB}{last_seq:020d}"


def _part_sk(block_sk: str, part: int) -> str:
    return f"{block_sk}#{part:04d}"


_Row = tuple[int, str, str, int]  # seq, type, payload (an encoded JSON envelope), created_at


def _event_blocks(rows: list[_Row]) -> list[tuple[list[_Row], bytes]]:
    """Rows (in seq order) as compressed blocks of at most `_BLOCK_BYTES`, halved by raw size until
    they fit. A single event above it stays one block; `_event_block_items` continues it in parts."""
    data = zlib.compress(orjson.dumps(rows), _ZLIB_LEVEL)
    if len(data) <= _BLOCK_BYTES or len(rows) == 1:
        return [(rows, data)]
    sizes = list(itertools.accumulate(len(r[1]) + len(r[2]) for r in rows))  # sizes[k - 1]: rows[:k]
    cut = min(range(1, len(rows)), key=lambda k: abs(2 * sizes[k - 1] - sizes[-1]))
    return _event_blocks(rows[:cut]) + _event_blocks(rows[cut:])


def _event_block_items(pk: Item, rows: list[_Row], expires: int) -> list[Item]:
    """The items of the rows' blocks: per block a head (keyed by its last seq), and for data above
    `_BLOCK_BYTES` (one big event) part items `EVB#{last}#0001`… that sort right after it."""
    items: list[Item] = []
    for block, data in _event_blocks(rows) if rows else []:
        sk = _evb_sk(block[-1][0])
        created = [r[3] for r in block]
        head: Item = {"PK": pk, "SK": _s(sk), "first_seq": _n(block[0][0]), "last_seq": _n(block[-1][0]),
                      "n": _n(len(block)), "created_at": _n(max(created)), "oldest_created_at": _n(min(created)),
                      "data": {"B": data[:_BLOCK_BYTES]}, TTL_ATTRIBUTE: _n(expires)}
        items.append(head)
        parts = [data[i:i + _BLOCK_BYTES] for i in range(_BLOCK_BYTES, len(data), _BLOCK_BYTES)]
        if parts:
            head["parts"] = _n(1 + len(parts))
            items.extend({"PK": pk, "SK": _s(_part_sk(sk, i)), "data": {"B": chunk}, TTL_ATTRIBUTE: _n(expires)}
                         for i, chunk in enumerate(parts, 1))
    return items


def _block_seq(item: Mapping[str, Any]) -> int:
    """The last seq of the block an item (head or part) belongs to, read from its key."""
    return int(item["SK"]["S"][len(_EVB):_EVB_HEAD_LEN])


def _block_keys(pk: str, head: Mapping[str, Any]) -> list[Item]:
    sk = head["SK"]["S"]
    return [_key(pk, sk)] + [_key(pk, _part_sk(sk, i)) for i in range(1, _opt_int(head, "parts") or 1)]


@dataclass(frozen=True, slots=True)
class _Block:
    head: Item
    data: bytes  # the compressed rows, parts joined

    def rows(self) -> list[_Row]:
        return [(int(seq), str(type_), str(payload), int(created))
                for seq, type_, payload, created in orjson.loads(zlib.decompress(self.data))]


class _BlockAssembler:
    """Joins each block head with its parts, which a Query returns right after it (across pages).

    A block missing a part (still being written, or a part already deleted by TTL) and a part
    without its head (its block ends at the `after_seq` of a read, or the head expired) are skipped.
    """

    def __init__(self) -> None:
        self._head: Item | None = None
        self._chunks: list[bytes] = []

    def missing(self) -> int:
        """Parts the pending block still needs."""
        return 0 if self._head is None else (_opt_int(self._head, "parts") or 1) - len(self._chunks)

    def feed(self, item: Item) -> _Block | None:
        sk = item["SK"]["S"]
        if len(sk) == _EVB_HEAD_LEN:
            self._head, self._chunks = item, [item["data"]["B"]]
        elif self._head is not None and sk == _part_sk(self._head["SK"]["S"], len(self._chunks)):
            self._chunks.append(item["data"]["B"])
        else:
            return None
        if self.missing():
            return None
        block = _Block(self._head, b"".join(self._chunks))
        self._head, self._chunks = None, []
        return block
