"""The one place where a ``tokenrace_status`` becomes a Python exception.

INVALID_ARGUMENT and INVALID_CONFIG raise ``ValueError`` subclasses; every other failure a
``RuntimeError`` subclass. The message is the library's ``tokenrace_last_error()``, which names
the argument, row or ``TOKENRACE_*`` variable at fault. Every exception carries ``.status``.
"""

from __future__ import annotations

from . import _ffi


class TokenraceError(Exception):
    """Base of every error the library reports; ``status`` is the ``tokenrace_status`` code."""

    status = None

    def __init__(self, message, status=None):
        super().__init__(message)
        if status is not None:
            self.status = status


class InvalidArgumentError(TokenraceError, ValueError):
    status = _ffi.STATUS_INVALID_ARGUMENT


class InvalidConfigError(TokenraceError, ValueError):
    status = _ffi.STATUS_INVALID_CONFIG


class OutOfMemoryError(TokenraceError, RuntimeError):
    status = _ffi.STATUS_OUT_OF_MEMORY


class InternalError(TokenraceError, RuntimeError):
    status = _ffi.STATUS_INTERNAL


class UnsupportedError(TokenraceError, RuntimeError):
    status = _ffi.STATUS_UNSUPPORTED


class TokenraceTimeoutError(TokenraceError, RuntimeError):
    status = _ffi.STATUS_TIMEOUT


class ClosedError(TokenraceError, RuntimeError):
    status = _ffi.STATUS_CLOSED


_BY_STATUS = {cls.status: cls for cls in (InvalidArgumentError, InvalidConfigError, OutOfMemoryError,
                                          InternalError, UnsupportedError, TokenraceTimeoutError, ClosedError)}


def last_error() -> str:
    """The library's message for the last failed call on this thread."""
    raw = _ffi.lib().tokenrace_last_error()
    return raw.decode("utf-8", "replace") if raw else ""


def check(status: int) -> None:
    """Raises the exception for ``status`` (a ``tokenrace_status``) unless it is OK.

    Call it right after the C call, on the same thread (the message is thread-local).
    """
    if status == _ffi.STATUS_OK:
        return
    message = last_error() or f"tokenrace call failed with status {status}"
    cls = _BY_STATUS.get(status)
    if cls is None:
        raise TokenraceError(f"{message} (unknown status {status})", status)
    raise cls(message)
