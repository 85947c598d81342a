"""Structured JSON logging to stderr (and, for `avm serve`, a rotating file). Keys like turn_id and
container_id go in `extra`. Secrets are redacted: extras named like one (`token`, `api_key`, `password`,
`authorization`, `*_secret`, ...), and API-key or Anthropic-key tokens anywhere in the text."""

from __future__ import annotations

import logging
import logging.handlers
import re
import sys
import time
from pathlib import Path
from typing import Any

import orjson

_STD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None)).keys()) | {"message", "asctime"}

LOG_FILE_MAX_BYTES = 10 * 1024 * 1024
LOG_FILE_BACKUPS = 5
REDACTED = "[redacted]"
_SECRET_NAMES = frozenset({"token", "secret", "password", "passwd", "authorization", "api_key", "apikey",
                           "llm_api_key", "secret_hash", "salt", "cookie"})
# an API key's secret half (its public key id is kept), an Anthropic key, a bearer credential
_SECRET_TEXT = re.compile(r"(avmk_[0-9a-f]{12})\.[A-Za-z0-9_\-]+|sk-ant-[A-Za-z0-9_\-]+|(Bearer )\S+")


def _secret_name(key: str) -> bool:
    k = key.lower()
    return k in _SECRET_NAMES or k.endswith(("_secret", "_token", "_password", "_api_key"))


def redact(text: str) -> str:
    """`text` with the secret part of any credential replaced."""
    if "avmk_" not in text and "sk-ant-" not in text and "Bearer " not in text:
        return text
    return _SECRET_TEXT.sub(lambda m: f"{m.group(1) or m.group(2) or ''}{'.' if m.group(1) else ''}{REDACTED}",
                            text)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": redact(record.getMessage()),
        }
        for key, value in record.__dict__.items():
            if key not in _STD and not key.startswith("_"):
                out[key] = REDACTED if _secret_name(key) else redact(value) if isinstance(value, str) else value
        if record.exc_info and record.levelno >= logging.ERROR:
            out["error_type"] = record.exc_info[0].__name__ if record.exc_info[0] else None
            out["exc"] = redact(self.formatException(record.exc_info))
        return orjson.dumps(out, default=str).decode()


class ClientFaultFilter(logging.Filter):
    """uvicorn logs a client's own protocol fault, a WebSocket text frame that is not UTF-8, as an
    ERROR with a traceback. The fault is the client's and uvicorn closes that connection (1007): it
    becomes one INFO line, so that a misbehaving client cannot fill the log with tracebacks."""

    MESSAGES = frozenset({"Invalid UTF-8 sequence received from client."})

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg in self.MESSAGES:
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.exc_info, record.exc_text = None, None
        return True


def setup_logging(level: str = "INFO", *, log_file: Path | None = None, max_bytes: int = LOG_FILE_MAX_BYTES,
                  backups: int = LOG_FILE_BACKUPS) -> None:
    """JSON lines to stderr and, with `log_file`, to that file too, rotated at `max_bytes` with
    `backups` old files kept (`avm.log.1` the newest)."""
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
        if isinstance(h, logging.handlers.RotatingFileHandler):  # ours, from an earlier call: release the file
            h.close()
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.handlers.RotatingFileHandler(log_file, maxBytes=max_bytes, backupCount=backups,
                                                             encoding="utf-8"))
    for handler in handlers:
        handler.setFormatter(JsonFormatter())
        root.addHandler(handler)
    root.setLevel(level.upper())
    # Per-request access lines are noise at INFO and cost money in the cloud.
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)
    uvicorn_errors = logging.getLogger("uvicorn.error")
    uvicorn_errors.setLevel(logging.WARNING)
    if not any(isinstance(f, ClientFaultFilter) for f in uvicorn_errors.filters):
        uvicorn_errors.addFilter(ClientFaultFilter())
