"""Progress display: one bar per process on a terminal, one log line per finished unit elsewhere.

``Progress`` wraps tqdm. The outermost progress of a process (a sweep's points, or a single
run's examples) draws a bar when stderr is a terminal; without a terminal (Slurm logs, CI,
files) it draws nothing and logs one line per finished unit instead, so logs hold no
escape codes. A progress opened inside another (a sweep point's examples) stays silent.
It knows nothing about what is counted.
"""

from __future__ import annotations

import logging
import sys
import weakref

#: Progresses open in this process; one left open by an exception goes away with its frame.
_open: weakref.WeakSet = weakref.WeakSet()


class Progress:
    """``update(n, **postfix)`` per finished unit, ``close()`` at the end (or use ``with``)."""

    def __init__(
        self,
        total: int,
        desc: str,
        unit: str,
        log: logging.Logger | None = None,
        enabled: bool = True,
    ):
        """``enabled=False``: shows and logs nothing, and leaves the outermost place to the next one."""
        from tqdm import tqdm

        self.enabled = enabled
        self.outer = enabled and not any(p.outer for p in list(_open))
        if enabled:
            _open.add(self)
        self.total, self.desc, self.unit, self.done = total, desc, unit, 0
        self.log = log or logging.getLogger(__name__)
        self.lines = self.outer and not sys.stderr.isatty()
        self.bar = tqdm(
            total=total,
            desc=desc,
            unit=unit,
            dynamic_ncols=True,
            disable=not self.outer or self.lines,
        )
        self._closed = False

    def note(self, text: str) -> None:
        """What is being worked on now (shown on the bar only)."""
        self.bar.set_postfix_str(text)

    def update(self, n: int = 1, **postfix) -> None:
        self.done += n
        self.bar.update(n)
        if postfix:
            self.bar.set_postfix(postfix)
        if self.lines:
            extra = " ".join(f"{k}={v}" for k, v in postfix.items())
            self.log.info(
                "%s: %d/%d %s%s",
                self.desc,
                self.done,
                self.total,
                self.unit,
                f" ({extra})" if extra else "",
            )

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            _open.discard(self)
            self.bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
