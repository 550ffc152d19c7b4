"""An image build's progress as a person wants it: named steps with a bar on a terminal,
the step lines alone in a pipe or a log.

The build (images.py) reports everything as lines: ``step 2/5: downloading and installing
7 packages`` for each step, and pip's own chatter in between. On a terminal a tqdm bar
counts the steps and shows the latest chatter after it; elsewhere (a pipe, the embedded
server's log that the kernel's status line shows) only the estimate, the steps and the
result are written, so the last line of the log is always the step under way.
"""

from __future__ import annotations

import typing as t

from .images import STEP_RE

if t.TYPE_CHECKING:
    from tqdm import tqdm


class BuildProgress:
    """A ``progress`` callable for ImageStore.build; use it as a context manager."""

    def __init__(self, stream: t.TextIO, bar: bool | None = None) -> None:
        self.stream = stream
        self.bar_wanted = stream.isatty() if bar is None else bar
        self.bar: tqdm | None = None
        self.steps_seen = False

    def __call__(self, line: str) -> None:
        match = STEP_RE.match(line)
        if match:
            number, total, name = int(match[1]), int(match[2]), match[3]
            self.steps_seen = True
            if not self.bar_wanted:
                print(line, file=self.stream, flush=True)
                return
            if self.bar is None:
                from tqdm import tqdm  # here: a bar only on a terminal; the server never draws one

                self.bar = tqdm(total=total, file=self.stream, unit="step", leave=True,
                                bar_format="{desc} {bar} {n_fmt}/{total_fmt} steps, {elapsed}{postfix}")
            self.bar.set_description_str(name)
            self.bar.update(number - 1 - self.bar.n)
        elif self.bar is not None:
            self.bar.set_postfix_str(line[:60])
        elif not self.steps_seen or line.startswith(("image ", "warning", "error")):
            print(line, file=self.stream, flush=True)  # the estimate, the result, warnings; not pip's chatter

    def __enter__(self) -> BuildProgress:
        return self

    def __exit__(self, *exc_info: t.Any) -> None:
        if self.bar is not None:
            if exc_info[0] is None:
                self.bar.update(self.bar.total - self.bar.n)
            self.bar.close()
