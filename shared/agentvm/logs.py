"""Structured JSON logging to stderr (and, for `avm serve`, a rotating file; its stderr may be
readable console lines instead). Keys like turn_id and
container_id go in `extra`. Secrets are redacted from every line, ours and the libraries': extras
named like one (`token`, `api_key`, `password`, `authorization`, `*_secret`, ...) and, anywhere in the
text, API-key or Anthropic-key tokens, bearer credentials, credential headers (`Authorization: …`,
`x-api-key: …`), URL query values named like a credential (`?token=…`, `&sig=…`), a URL's
`user:password@`, and every value registered with `register_secrets` (the MCP servers' env values,
header values and URL query values, registered when a server starts). The HTTP client libraries'
own request logging (httpx prints every request's full URL at INFO) is turned down to WARNING too.

`JsonFormatter` stays hand-written (issue 19): on python-json-logger 4.2.0's `OrjsonFormatter` the same
lines (`ts` first with milliseconds and `Z`, the renamed `level`/`logger`/`msg`, `error_type` and
`exc` only at ERROR, every value redacted) took 22 lines of overrides (`add_fields`,
`process_log_record`, the reserved names) against 19 here, and ~6 ms more import on every Lambda's
cold path (this module is imported there); structlog would replace stdlib logging's records and
extras, which the libraries and powertools write, and imports in ~100 ms, most of a bare boto3."""

from __future__ import annotations

import logging
import logging.handlers
import os
import re
import sys
import time
import urllib.parse
from collections.abc import Iterable
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


# `?token=…`, `&api_key=…`, `;sig=…`: query (or matrix) values whose name says credential
_QUERY_SECRET = re.compile(r"(?i)([?&;][^=&?;\s\"'<>]*?(?:token|key|sig|secret|passw|pwd|auth|credential|session|"
                           r"code)[^=&?;\s\"'<>]*=)[^&#;\s\"'<>]+")
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@\"'<>]+@")
_HEADER_SECRET = re.compile(r"(?i)\b((?:proxy-)?authorization|x-api-key|api-key|x-auth-token|x-amz-security-token|"
                            r"(?:set-)?cookie)(\\?[\"']?\s*[:=,]\s*(?:b(?=\\?[\"']))?\\?[\"']?)[^\"'\\\r\n,}]+")
_SECRET_MIN_CHARS = 8  # shorter values are too likely to occur by chance (and to be no secret)
_SECRETS_MAX = 4096
_known: dict[str, None] = {}  # registered secret values, oldest first
_known_pattern: re.Pattern[str] | None = None


def register_secrets(values: Iterable[str]) -> None:
    """Redact these values (and their URL-encoded forms) wherever a log line holds them from now on
    (values shorter than 8 characters are ignored). The newest 4096 are kept."""
    global _known_pattern
    added = False
    for value in values:
        value = value.strip()
        if len(value) < _SECRET_MIN_CHARS:
            continue
        for form in {value, urllib.parse.quote(value, safe=""), urllib.parse.quote_plus(value)}:
            if form not in _known:
                _known[form] = None
                added = True
    if not added:
        return
    while len(_known) > _SECRETS_MAX:
        del _known[next(iter(_known))]
    _known_pattern = re.compile("|".join(re.escape(v) for v in sorted(_known, key=len, reverse=True)))


def redact(text: str) -> str:
    """`text` with the secret part of any credential replaced."""
    if _known_pattern is not None:
        text = _known_pattern.sub(REDACTED, text)
    if "avmk_" in text or "sk-ant-" in text or "Bearer " in text:
        text = _SECRET_TEXT.sub(lambda m: f"{m.group(1) or m.group(2) or ''}{'.' if m.group(1) else ''}{REDACTED}",
                                text)
    if "=" in text:
        text = _QUERY_SECRET.sub(lambda m: f"{m.group(1)}{REDACTED}", text)
    if "://" in text and "@" in text:
        text = _USERINFO.sub(lambda m: f"{m.group(1)}{REDACTED}@", text)
    return _HEADER_SECRET.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", text)


#: Libraries whose INFO/DEBUG lines may carry a request's URL, headers or body: WARNING and up only.
QUIET_LOGGERS = ("httpx", "httpx2", "httpcore", "httpcore2", "mcp", "anthropic", "urllib3", "botocore",
                 "aiobotocore", "boto3", "s3transfer", "websockets", "hpack", "h2", "sse_starlette")


def quiet_libraries() -> None:
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


class SecretFilter(logging.Filter):
    """On a handler: the record's message (its arguments merged in) and string extras redacted, for
    formatters other than ours (JsonFormatter redacts as well)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: the formatter reports it
            return True
        record.msg, record.args = redact(message), None
        for key, value in list(record.__dict__.items()):
            if key not in _STD and not key.startswith("_") and isinstance(value, str):
                setattr(record, key, REDACTED if _secret_name(key) else redact(value))
        return True


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
            if key not in _STD and not key.startswith("_") and key != CONSOLE_TEXT:
                out[key] = REDACTED if _secret_name(key) else redact(value) if isinstance(value, str) else value
        if record.exc_info and record.levelno >= logging.ERROR:
            out["error_type"] = record.exc_info[0].__name__ if record.exc_info[0] else None
            out["exc"] = redact(self.formatException(record.exc_info))
        return orjson.dumps(out, default=str).decode()


#: A record's `console` extra: the text a person reads on the console in place of its line (the
#: start-up banner). JSON lines leave it out: they carry the same facts as keys.
CONSOLE_TEXT = "console"
_LEVEL_COLOURS = {"DEBUG": "\x1b[2m", "INFO": "\x1b[32m", "WARNING": "\x1b[33m", "ERROR": "\x1b[31m",
                  "CRITICAL": "\x1b[1;31m"}


class ConsoleFormatter(logging.Formatter):
    """One readable line a record: `14:02:07 INFO  agentvm.serve  turn finished  turn_id=… cost=…`
    (local time), redacted as the JSON lines are; `colour`: the level in colour (a terminal)."""

    def __init__(self, *, colour: bool = False) -> None:
        super().__init__()
        self.colour = colour

    def format(self, record: logging.LogRecord) -> str:
        text = getattr(record, CONSOLE_TEXT, None)
        if isinstance(text, str):
            return redact(text)
        level = f"{record.levelname:<7}"
        if self.colour:
            level = f"{_LEVEL_COLOURS.get(record.levelname, '')}{level}\x1b[0m"
        fields = " ".join(f"{key}={REDACTED if _secret_name(key) else _console_value(value)}"
                          for key, value in record.__dict__.items()
                          if key not in _STD and not key.startswith("_") and key != "event")
        line = (f"{time.strftime('%H:%M:%S', time.localtime(record.created))} {level} {record.name}  "
                f"{redact(record.getMessage())}{'  ' + fields if fields else ''}")
        if record.exc_info and record.levelno >= logging.ERROR:
            line += "\n" + redact(self.formatException(record.exc_info))
        return line


def _console_value(value: object) -> str:
    text = redact(value) if isinstance(value, str) else str(value)
    return f'"{text}"' if not text or " " in text else text


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


class PrivateRotatingFileHandler(logging.handlers.RotatingFileHandler):
    """The rotating log file, readable by the server's user only (0o600, in a 0o700 directory): tools
    that run as other uids must not read it. Rotated files keep the mode (they are renamed)."""

    def _open(self) -> Any:
        fd = os.open(self.baseFilename, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        os.fchmod(fd, 0o600)  # a file made before with a wider mode
        return os.fdopen(fd, "a", encoding=self.encoding, errors=self.errors)


def setup_logging(level: str = "INFO", *, log_file: Path | None = None, max_bytes: int = LOG_FILE_MAX_BYTES,
                  backups: int = LOG_FILE_BACKUPS, console: bool = False) -> None:
    """JSON lines to stderr (`console`: readable lines, coloured on a terminal) and, with `log_file`,
    JSON lines to that file too, rotated at `max_bytes` with `backups` old files kept (`avm.log.1` the
    newest)."""
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
        if isinstance(h, logging.handlers.RotatingFileHandler):  # ours, from an earlier call: release the file
            h.close()
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file is not None:
        log_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(log_file.parent, 0o700)
        handlers.append(PrivateRotatingFileHandler(log_file, maxBytes=max_bytes, backupCount=backups,
                                                   encoding="utf-8"))
    for handler in handlers:
        handler.setFormatter(JsonFormatter())
        handler.addFilter(SecretFilter())
        root.addHandler(handler)
    if console:
        colour = sys.stderr.isatty() and not os.environ.get("NO_COLOR")
        handlers[0].setFormatter(ConsoleFormatter(colour=colour))
    root.setLevel(level.upper())
    # Per-request access lines are noise at INFO, cost money in the cloud and hold query strings
    # (`/ws?token=…`); so do the HTTP clients' request lines.
    quiet_libraries()
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)
    uvicorn_errors = logging.getLogger("uvicorn.error")
    uvicorn_errors.setLevel(logging.WARNING)
    if not any(isinstance(f, ClientFaultFilter) for f in uvicorn_errors.filters):
        uvicorn_errors.addFilter(ClientFaultFilter())
