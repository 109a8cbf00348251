"""The processes' logs: one format for ``serve`` (uvicorn's lines and the service's own) and ``worker`` (Celery's
lines and the worker's own), as text or as one JSON object a line, with secrets masked in every record.

Text lines start with their time; a line written while a request is served ends with the request's id (its answer's
``X-Request-ID``), an access line always. JSON lines (``--log-format json``, for a log pipeline) carry ``time``
(ISO 8601, UTC), ``level``, ``logger``, ``message`` and ``request_id`` (``-`` outside a request), an access line its
``client``, ``method``, ``path``, ``http_version`` and ``status`` too, an error its masked ``exc_info``.
"""

from __future__ import annotations

import copy
import logging
from datetime import UTC, datetime
from typing import Any

from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter

from atlas.redaction import redact_secrets
from service.request_ids import REQUEST_ID

LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
"""uvicorn's log levels (``--log-level``)."""
LOG_FORMATS = ("text", "json")
"""``--log-format``: lines for people, or one JSON object a line for a log pipeline."""
APP_LOGGERS = ("atlas", "workers", "service", "fisher_atlas")
"""The packages whose loggers ``serve`` and ``worker`` write to stderr beside uvicorn's or Celery's."""
LOG_TIME = "%(asctime)s "
"""Every text line starts with its time (none did: an operator could not tell when anything happened; an operations
review, 2026-12-07)."""
TEXT_FORMAT = f"{LOG_TIME}%(levelname)s:     %(name)s: %(message)s%(request_tag)s"
"""The service's and the worker's own lines (uvicorn's keep their own format, with the time in front)."""
CLIENT_ERROR_LOGGERS = ("python_multipart", "multipart")
"""Libraries that log a client's malformed body (already answered 422) as a warning: written at ERROR only (their
lines reached stderr bare, without time or level, through Python's last-resort handler: an API fuzz, 2026-12-07)."""
_ACCESS_FIELDS = ("client", "method", "path", "http_version", "status")
"""What an access line's arguments are (uvicorn's ``client_addr, method, full_path, http_version, status_code``)."""


class RequestTagFilter(logging.Filter):
    """Gives every record ``request_id`` (``-`` outside a request) and ``request_tag`` (`` [id]`` in a request, else
    empty): an app line written while a request is served (a 500's traceback, a database outage) can be matched to
    the client's ``X-Request-ID`` (only the access line carried it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        rid = REQUEST_ID.get()
        record.request_id = rid
        record.request_tag = "" if rid == "-" else f" [{rid}]"
        return True


class JsonLogFormatter(JsonFormatter):
    """One JSON object a line (see the module's docstring for its fields); the traceback masked like a text line's."""

    def __init__(self) -> None:
        super().__init__(["asctime", "levelname", "name", "message", "request_id"],
                         rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
                         reserved_attrs=[*RESERVED_ATTRS, "color_message", "request_tag"])

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds")

    def formatException(self, ei: Any) -> str | list[str]:  # type: ignore[override]  # (as its base has it)
        # the record factory masks ``exc_text``, but this formatter formats ``exc_info`` anew
        text = super().formatException(ei)
        return redact_secrets(text) if isinstance(text, str) else [redact_secrets(line) for line in text]

    def add_fields(self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]) -> None:
        super().add_fields(log_data, record, message_dict)
        if log_data.get("request_id") is None:  # a record no handler filter saw
            log_data["request_id"] = "-"
        if record.name == "uvicorn.access" and isinstance(record.args, tuple) and len(record.args) == 5:
            log_data.update(zip(_ACCESS_FIELDS, record.args, strict=True))


def uvicorn_log_config(log_format: str = "text") -> dict[str, Any]:
    """uvicorn's logging configuration in ``log_format``: as text, its own lines with the time in front and an access
    line ending with its request's id (the ``X-Request-ID`` of its answer); as JSON, :class:`JsonLogFormatter`."""
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    if log_format == "json":
        config["formatters"] = {name: {"()": JsonLogFormatter} for name in config["formatters"]}
    else:
        for formatter in config["formatters"].values():
            formatter["fmt"] = LOG_TIME + formatter["fmt"]
        config["formatters"]["access"]["fmt"] += " [%(request_id)s]"
    config.setdefault("filters", {})["request_id"] = {"()": RequestTagFilter}
    for handler in config["handlers"].values():
        handler["filters"] = ["request_id"]
    return config


def log_handler(log_format: str) -> logging.Handler:
    """A stderr handler writing the service's and the worker's own lines in ``log_format``."""
    handler = logging.StreamHandler()
    handler.addFilter(RequestTagFilter())
    handler.setFormatter(JsonLogFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    return handler


def numeric_level(level: str) -> int:
    """``--log-level``'s name as :mod:`logging`'s number (``trace``, uvicorn's, is ``DEBUG``)."""
    numeric = logging.DEBUG if level.lower() == "trace" else logging.getLevelName(level.upper())
    return numeric if isinstance(numeric, int) else logging.INFO


def app_logging(level: str, log_format: str = "text") -> None:
    """Write the service's own loggers (:data:`APP_LOGGERS`) to stderr at uvicorn's ``--log-level``, in
    ``log_format``. uvicorn configures its loggers only: an index rebuilt at start from a corrupt file, a job's outcome
    and the sweep's re-queued jobs went unsaid (warnings reached stderr bare, through Python's last-resort handler)."""
    handler = log_handler(log_format)
    for name in (*APP_LOGGERS, *CLIENT_ERROR_LOGGERS):
        logger = logging.getLogger(name)
        logger.handlers = [handler]
        logger.setLevel(max(numeric_level(level), logging.ERROR if name in CLIENT_ERROR_LOGGERS else 0))
        logger.propagate = False


def worker_logging(level: str, log_format: str = "text") -> None:
    """The worker's logging, set before it loads its model: the root logger (Celery's lines and the worker's own) to
    stderr in ``log_format`` at ``level``, and Celery told not to set up its own. Celery set up logging only once it
    started consuming, so the worker's first lines (the model it serves, on which queue) were dropped, and its lines
    could be had as text only."""
    from celery import signals

    install_log_redaction()
    root = logging.getLogger()
    root.handlers = [log_handler(log_format)]
    root.setLevel(numeric_level(level))
    for name in APP_LOGGERS:  # as ``serve`` may have left them in this process (tests): through the root
        logging.getLogger(name).handlers = []
        logging.getLogger(name).propagate = True
    logging.captureWarnings(True)  # Celery's warnings (root user, ...) as log lines too, not bare stderr text
    signals.setup_logging.connect(_keep_logging, weak=False)


def _keep_logging(**_: Any) -> None:
    """Celery's ``setup_logging`` receiver: with one connected, Celery leaves the logging set up above as it is."""


_installed = False


def _masked_args(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """A log record's arguments with the secrets of its strings masked (the others as they are)."""
    return tuple(redact_secrets(a) if isinstance(a, str) else a for a in args)


def _redact_record(record: logging.LogRecord, clean: str) -> None:
    """Mask the secrets of ``record`` whose formatted message is ``clean`` once masked. Its arguments are masked one by
    one and kept, since a formatter may read them (uvicorn's access lines take the client, method, path and status
    from ``args``: collapsed into the message, each such line was a "--- Logging error ---" with a traceback, and the
    exception being handled printed the secret unmasked); a secret that only their formatting makes is masked in the
    message, with the arguments dropped, except for an access line, which must keep them."""
    if isinstance(record.args, tuple) and record.args:
        record.args = _masked_args(record.args)
        try:
            kept = redact_secrets(record.getMessage()) == record.getMessage()
        except (TypeError, ValueError):
            kept = False
        if kept or record.name == "uvicorn.access":
            return
    record.msg, record.args = clean, None


def install_log_redaction() -> None:
    """Mask secrets (URL passwords, API keys, tokens) in every log record of this process, once.

    A log-record factory formats the message eagerly and masks it, and masks the traceback text, so
    handlers configured by anyone (uvicorn, Celery, the root) only ever see redacted text.
    """
    global _installed
    if _installed:
        return
    _installed = True
    previous = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        try:
            try:
                message = record.getMessage()
            except (TypeError, ValueError):  # arguments the message cannot take: the handler prints them raw
                if isinstance(record.args, tuple):
                    record.args = _masked_args(record.args)
                raise
            clean = redact_secrets(message)
            if clean != message:
                _redact_record(record, clean)
            if record.exc_info and record.exc_info[0] is not None:
                record.exc_text = redact_secrets(logging.Formatter().formatException(record.exc_info))
        except Exception:  # never let redaction break logging
            pass
        return record

    logging.setLogRecordFactory(factory)
