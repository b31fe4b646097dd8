"""Structured logs (structlog) for every process: JSON lines in production, console in dev."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from typing import Any

import structlog

# The shape of an API token (tierpoint.auth): masked wherever one would end up in a log line.
_TOKEN = re.compile(r"tp_[A-Za-z0-9_-]{43}")
MASK = "tp_***"


def mask_secrets(text: str) -> str:
    return _TOKEN.sub(MASK, text)


def _mask(value: Any) -> Any:
    if isinstance(value, str):
        return mask_secrets(value)
    if isinstance(value, dict):
        return {k: _mask(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_mask(v) for v in value)
    return value


def _mask_processor(
    logger: Any, method: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """Tokens are never logged on purpose; this catches one passed where it should not be (an
    exception message quoting a header, a URL with one in it)."""
    for key, value in event_dict.items():
        event_dict[key] = _mask(value)
    return event_dict


class _MaskFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = mask_secrets(message)
        if masked != message:
            record.msg, record.args = masked, None
        return True


def _colour(stream: Any) -> bool:
    if os.environ.get("NO_COLOR"):  # https://no-color.org
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def configure(level: str = "INFO", json: bool = False) -> None:
    processors: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
        structlog.processors.format_exc_info,
        _mask_processor,
    ]
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer()
        if json
        # Colour codes only where a terminal shows them, not in a file or a pipe.
        else structlog.dev.ConsoleRenderer(colors=_colour(sys.stderr))
    )
    structlog.configure(
        processors=[*processors, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    logging.basicConfig(level=level.upper(), stream=sys.stderr)
    # Libraries' records (stdlib logging) come out as our own lines do: JSON in production, no
    # colour codes off a terminal.
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[structlog.stdlib.add_logger_name, *processors],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
    )
    for handler in logging.getLogger().handlers:
        handler.setFormatter(formatter)
        if not any(isinstance(f, _MaskFilter) for f in handler.filters):
            handler.addFilter(_MaskFilter())
    # Python's warnings (a library's deprecation, say) too, rather than bare lines on stderr.
    logging.captureWarnings(True)
    # Third-party chatter stays at warnings.
    for noisy in ("botocore", "boto3", "urllib3", "temporalio", "alembic", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    _forward_temporal_core()


_core_forwarded = False


def _forward_temporal_core() -> None:
    """Temporal's core (Rust) writes its warnings straight to stdout, with colour codes whatever
    the stream is. Forwarded to the `temporalio.core` logger they are lines like any other.

    Must run before the process's first Temporal client or worker: those keep the runtime they
    started on."""
    global _core_forwarded
    if _core_forwarded:
        return
    from temporalio.runtime import (
        LogForwardingConfig,
        LoggingConfig,
        Runtime,
        TelemetryConfig,
        TelemetryFilter,
    )

    forwarding = LogForwardingConfig(logger=logging.getLogger("temporalio.core"))
    levels = TelemetryFilter(core_level="WARN", other_level="ERROR")  # the SDK's default
    telemetry = TelemetryConfig(logging=LoggingConfig(filter=levels, forwarding=forwarding))
    # Where a runtime already serves this process's clients, a second would not replace it.
    with contextlib.suppress(RuntimeError):
        Runtime.set_default(Runtime(telemetry=telemetry))
    _core_forwarded = True


def get(name: str | None = None) -> structlog.stdlib.BoundLogger:
    return structlog.get_logger(name)  # type: ignore[no-any-return]


@contextmanager
def checkpoint_context(
    *, job: str, step: int, tier: str | None = None, node: str | None = None
) -> Iterator[None]:
    """Every line logged inside (on this thread or task) carries the checkpoint's job, step, tier
    and node, so one checkpoint's lines can be followed across processes. `node` is None on lines
    about all of a checkpoint's nodes (a plan, a promotion), `tier` on lines about all tiers.

    Bind it inside the code that runs on the thread: Temporal runs each sync activity in a copy
    of the worker's context, so a binding made outside is not seen there."""
    with structlog.contextvars.bound_contextvars(job=job, step=step, tier=tier, node=node):
        yield


def bind_checkpoint(*, job: str, step: int, tier: str | None = None) -> None:
    """For the rest of the current task (an API request: its access line and the background
    tasks after its response), lines carry the checkpoint's job, step and tier. The API's request
    middleware drops these when the request is done."""
    structlog.contextvars.bind_contextvars(job=job, step=step, tier=tier, node=None)
