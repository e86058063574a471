"""Log set-up for every subcommand: ``--log-format text`` (default) or ``json``.

JSON lines carry ``time``, ``level``, ``logger`` and ``message``, plus any
fields passed with ``extra={"fields": {...}}`` (e.g. ``claim`` as
``ns/name:uid``, ``operation``, ``reason``), so a log pipeline can filter one
claim's history without parsing messages.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            for key, value in fields.items():
                doc.setdefault(str(key), value)
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str, separators=(",", ":"))


class _OurHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Marks the handler we installed, so a second call replaces only it."""


def configure_logging(level: str, fmt: str = "text") -> None:
    """Log to stderr in ``fmt`` at ``level``; handlers others installed are kept."""
    handler = _OurHandler()
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _OurHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
