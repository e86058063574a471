"""gpu-check's I/O basics: one command run (:class:`Ran`, :func:`run_command`) and the
transcript the steps write (:class:`Transcript`)."""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from dra_driver.app.gpu_check.decide import Outcome


@dataclass(frozen=True)
class Ran:
    """One command's result; ``returncode`` 124 when it ran past its timeout."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    stdin: str | None = None

    def shown(self) -> str:
        line = shlex.join(self.argv)
        return f"echo {shlex.quote(self.stdin.strip())} | {line}" if self.stdin else line


Runner = Callable[[Sequence[str], Mapping[str, str], "str | None", float], Ran]
"""``(argv, env, stdin, timeout_s) -> Ran``: the check's one way to run a command."""


def run_command(
    argv: Sequence[str], env: Mapping[str, str], stdin: str | None, timeout_s: float
) -> Ran:
    try:
        done = subprocess.run(
            list(argv), input=stdin, env=dict(env), capture_output=True, text=True,
            timeout=timeout_s, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired as expired:
        return Ran(tuple(argv), 124, _text(expired.stdout), f"timed out after {timeout_s} s", stdin)
    except OSError as err:
        return Ran(tuple(argv), 127, "", f"cannot run: {err}", stdin)
    return Ran(tuple(argv), done.returncode, done.stdout, done.stderr, stdin)


def _text(data: str | bytes | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


@dataclass
class Transcript:
    """The steps as they ran; each line is also emitted at once (a timeout keeps them)."""

    emit: Callable[[str], None] = print
    lines: list[str] = field(default_factory=list)
    outcomes: dict[str, Outcome] = field(default_factory=dict)

    def say(self, text: str) -> None:
        for line in text.rstrip("\n").splitlines() or [""]:
            self.lines.append(line)
            self.emit(line)

    def step(self, name: str) -> None:
        self.say(f"== {name}")

    def command(self, ran: Ran) -> None:
        self.say(f"$ {ran.shown()}")
        for stream in (ran.stdout, ran.stderr):
            if stream.strip():
                self.say("  " + stream.strip().replace("\n", "\n  "))
        self.say(f"  (exit status {ran.returncode})")

    def outcome(self, name: str, outcome: Outcome, why: str) -> Outcome:
        self.outcomes[name] = outcome
        self.say(f"-- {name}: {outcome.value}: {why}")
        return outcome

    @property
    def failed(self) -> bool:
        return Outcome.FAIL in self.outcomes.values()
