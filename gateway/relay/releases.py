"""What a request holds, let go of once (relay -> *releases* -> run).

``Releases`` keeps ``contextlib.ExitStack``'s promise for plain callbacks:
they run in reverse order of taking, each exactly once, every one of them
even when an earlier one fails (the first failure is raised after the
rest have run, any later ones logged). It costs a tuple per callback where
``ExitStack`` builds a wrapper function; a request takes five of them and
lets go of them all.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import TracebackType
from typing import Any

from core import loggers

log = logging.getLogger(loggers.RELAY)


class Releases:
    __slots__ = ("_callbacks",)

    def __init__(self) -> None:
        self._callbacks: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []

    def callback(self, release: Callable[..., Any], *args: Any) -> None:
        self._callbacks.append((release, args))

    def take_over(self, other: Releases) -> None:
        """Hold what ``other`` holds, let go of after what this held before
        (as ``ExitStack.enter_context(other.pop_all())``); ``other`` is left
        holding nothing."""
        self._callbacks += other._callbacks
        other._callbacks = []

    def close(self) -> None:
        callbacks, self._callbacks = self._callbacks, []
        failure: BaseException | None = None
        while callbacks:
            release, args = callbacks.pop()
            try:
                release(*args)
            except BaseException as error:
                if failure is None:
                    failure = error
                else:  # raised is the first; the others are not lost without a word
                    log.error("releasing %r failed as well", release, exc_info=error)
        if failure is not None:
            raise failure

    def __enter__(self) -> Releases:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()
