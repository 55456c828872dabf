# SPDX-License-Identifier: Apache-2.0
"""Progress of long work, as molmoact's own (src/core/progress.c): on a terminal one line redrawn
in place (a bar, counts, bytes, elapsed and remaining time) at most ten times a second; when
stderr is not a terminal a plain line at every tenth of the work (at least every 30 s); nothing
when quiet (--quiet, or MOLMOACT_QUIET=1). Everything goes to stderr."""
import os
import sys
import time

QUIET = bool(os.environ.get("MOLMOACT_QUIET"))


def set_quiet(q):
    global QUIET
    QUIET = bool(q)


def _bytes(b):
    if b >= 2**30:
        return f"{b / 2**30:.2f} GiB"
    if b >= 2**20:
        return f"{b / 2**20:.1f} MiB"
    return f"{b / 1024:.1f} KiB"


def _time(s):
    if s < 60:
        return f"{s:.0f} s"
    if s < 3600:
        return f"{int(s // 60)}m{int(s) % 60:02d}s"
    return f"{int(s // 3600)}h{int(s // 60) % 60:02d}m"


class Progress:
    def __init__(self, what, total_bytes=0, total_items=0, unit="", stream=None):
        self.what, self.total_bytes, self.total_items, self.unit = what, total_bytes, total_items, unit
        self.bytes = self.items = 0
        self.stream = stream or sys.stderr
        self.mode = 0 if QUIET else (2 if self.stream.isatty() else 1)
        self.t0 = self.last = time.monotonic()
        self.tenth = 0
        if self.mode:
            self._draw(False)

    def fraction(self):
        if self.total_bytes:
            return min(1.0, self.bytes / self.total_bytes)
        if self.total_items:
            return min(1.0, self.items / self.total_items)
        return 0.0

    def _line(self, final):
        f, el = self.fraction(), time.monotonic() - self.t0
        parts = []
        if self.total_items:
            parts.append(f"{self.items}/{self.total_items} {self.unit}")
        elif self.items:
            parts.append(f"{self.items} {self.unit}")
        if self.total_bytes:
            parts.append(f"{_bytes(self.bytes)} of {_bytes(self.total_bytes)}")
        if self.total_bytes or self.total_items:
            parts[-1] += f" ({100 * f:.0f}%)"
        parts.append(_time(el) + (" in all" if final else ""))
        if not final and 0.02 < f < 1.0:
            parts.append(f"about {_time(el * (1 - f) / f)} left")
        return f"{self.what}: " + ", ".join(parts)

    def _draw(self, final):
        text = self._line(final)
        if self.mode == 2:
            filled = int(self.fraction() * 24 + 0.5)
            bar = "#" * filled + "." * (24 - filled)
            self.stream.write(f"\r\033[K[{bar}] {text}" + ("\n" if final else ""))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def add(self, nbytes=0, items=0):
        self.bytes += nbytes
        self.items += items
        if not self.mode:
            return
        t = time.monotonic()
        tenth = int(self.fraction() * 10)
        known = self.total_bytes or self.total_items
        if self.mode == 2:
            due = t - self.last >= 0.1
        else:
            due = (known and self.tenth < tenth < 10) or t - self.last >= (30.0 if known else 10.0)
        if due:
            self.last, self.tenth = t, tenth
            self._draw(False)

    def end(self, ok=True):
        if not self.mode:
            return
        if ok:
            self._draw(True)
        elif self.mode == 2:
            self.stream.write("\n")
        self.mode = 0
