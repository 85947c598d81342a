"""What the cloud handlers posted to a WebSocket connection, read back from moto's in-process
management-API backend (the frames are concatenated JSON objects)."""

from __future__ import annotations

import json
import urllib.parse
from typing import Any

from moto.apigatewaymanagementapi.models import apigatewaymanagementapi_backends
from moto.core import DEFAULT_ACCOUNT_ID


def posted_frames(connection_id: str, region: str = "us-east-1") -> list[dict[str, Any]]:
    backend = apigatewaymanagementapi_backends[DEFAULT_ACCOUNT_ID][region]
    key = urllib.parse.quote(connection_id, safe="")  # moto keeps the id as it appears in the path
    data = backend.connections[key].data.decode() if key in backend.connections else ""
    frames, decoder, pos = [], json.JSONDecoder(), 0
    while pos < len(data):
        frame, pos = decoder.raw_decode(data, pos)
        frames.append(frame)
    return frames
