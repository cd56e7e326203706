"""Errors the CLI turns into a one-line message and exit code 2 (bad input, never a traceback),
and the interruptions (SIGINT, SIGTERM) it turns into exit codes 130 and 143."""
from __future__ import annotations

import contextlib
import signal
from typing import Any, Iterator


class UsageError(Exception):
    """Bad input: a wrong flag value, a missing or corrupt file, weights that do not fit."""


class NotAttentionLayer(UsageError):
    """A checkpoint layer that is not softmax attention (a hybrid model's linear-attention,
    convolution or state-space layer): one line naming its type and the nearest attention
    layers; a run over every layer gives it its own row instead."""

    def __init__(self, message: str, layer: int, kind: str):
        super().__init__(message)
        self.layer, self.kind = layer, kind


class StageFailed(UsageError):
    """A library failed inside one stage of the work (torch.export, Inductor's compile, the
    ONNX builder): one line naming the stage and the layer; its trace (``__cause__``) under
    -v."""


@contextlib.contextmanager
def stage(name: str) -> Iterator[None]:
    """Any failure inside ``name`` (not bad input, not an interruption) as one StageFailed."""
    try:
        yield
    except (UsageError, MemoryError):
        raise
    except Exception as e:
        lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
        raise StageFailed(f"{name} failed: {type(e).__name__}: "
                          f"{(lines[0] if lines else '')[:300]} (-v shows the trace)") from e


def require_positive(name: str, value: Any) -> None:
    """A setting that must be a positive integer (a bool is not one)."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise UsageError(f"{name} must be a positive integer, got {value!r}")


class Interrupted(BaseException):
    """Ctrl-C or SIGTERM (timeouts, CI runners, container stops): unwinds past every
    ``except Exception``, so every staging folder is removed on the way out."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


_received: list[int] = []


def interrupt(signum: int, frame=None) -> None:
    """The CLI's handler for SIGINT and SIGTERM: remember the signal, then unwind."""
    _received.append(signum)
    raise Interrupted(signum)


def raise_if_interrupted() -> None:
    """Unwind if a signal arrived, even one a runtime swallowed: ONNX Runtime turns an
    interruption inside session creation into 'initialization failed' (a load error, or a
    runner SKIPPED), which must neither publish an artifact nor read as a verdict."""
    if _received:
        raise Interrupted(_received[0])
