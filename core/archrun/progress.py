"""Progress display for slow steps (loading, kernel compilation): a tqdm bar on stderr.

Callers receive a plain callable `progress(stage, done, total)`; the library never prints
by itself, the CLI passes a LoadProgress. Bars are hidden when stderr is not a terminal.
"""

from __future__ import annotations

import sys
from typing import Any


class LoadProgress:
    """Context manager; calling it updates one tqdm bar per stage."""

    def __init__(self, file: Any = None):
        self.file = file or sys.stderr
        self._bar = None
        self._stage = None

    def __call__(self, stage: str, done: int, total: int) -> None:
        from tqdm import tqdm

        if stage != self._stage:
            self.close()
            self._stage = stage
            self._bar = tqdm(total=total, desc=stage, file=self.file, leave=False, disable=None,
                             unit="step", dynamic_ncols=True)
        if self._bar is not None:
            self._bar.n = done
            self._bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> LoadProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
