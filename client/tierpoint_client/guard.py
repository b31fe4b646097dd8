"""A training loop's guard after a load: it watches the next steps' loss and gradient norm against
what the loaded checkpoint's writer recorded at save (`metadata={"loss": ..., "grad_norm": ...}`).
NaN, Inf, or a value over `spike` times the recorded one marks the loaded checkpoint bad (the
server quarantines it, so no restart loads it again) and ends the process with GUARD_EXIT_CODE;
`steps` healthy steps in a row mark it good (what `TierpointReader(job, health="good")` loads).

    reader = TierpointReader(job)
    reader.load(state)
    guard = TrainingGuard(reader.loaded)
    for step in ...:
        ...
        guard.check(step, loss=loss.item(), grad_norm=norm.item())
"""

from __future__ import annotations

import math
import os
import sys
from typing import Any

from tierpoint_client.client import Client
from tierpoint_client.errors import ConflictError, TierpointError
from tierpoint_client.timeline import Loaded

# EX_TEMPFAIL: the run failed, and a restart can succeed (it will not load this checkpoint).
GUARD_EXIT_CODE = 75
METRICS = ("loss", "grad_norm")


class TrainingDiverged(TierpointError):
    """The steps after a load diverged (NaN, Inf or a spike), and the loaded checkpoint was
    marked bad. Raised by `TrainingGuard.check` made with `exit=False`."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class TrainingGuard:
    """Watch the `steps` training steps after loading `loaded` (`TierpointReader.loaded`; None,
    a run that loaded nothing, is watched by no one).

    Every rank may check its own values: any rank that sees a failure marks the checkpoint bad
    (the same verdict again changes nothing) and exits, and torchrun stops the others; only the
    coordinator (rank 0 of the default group, or `coordinator`) marks it good. With `exit=False`
    a failure raises TrainingDiverged instead of ending the process: the caller then exits with
    its `exit_code` itself."""

    def __init__(
        self,
        loaded: Loaded | None,
        *,
        steps: int = 50,
        spike: float = 5.0,
        client: Client | None = None,
        exit: bool = True,
        exit_code: int = GUARD_EXIT_CODE,
        coordinator: bool | None = None,
    ) -> None:
        if steps < 1 or not spike > 1.0:
            raise ValueError("a guard watches 1 step or more, for a spike factor over 1")
        self.loaded = loaded
        self.steps = steps
        self.spike = spike
        self.exit = exit
        self.exit_code = exit_code
        self._client = client
        self._coordinator = coordinator
        self.healthy = 0
        # The verdict this guard gave (None: still watching, or nothing to watch).
        self.verdict: str | None = None

    @property
    def watching(self) -> bool:
        return self.loaded is not None and self.verdict is None

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = Client.from_env()
        return self._client

    def check(self, step: int, loss: Any, grad_norm: Any = None) -> None:
        """One training step's values (numbers, or one-element tensors)."""
        if not self.watching:
            return
        for metric, raw in (("loss", loss), ("grad_norm", grad_norm)):
            if raw is None:
                continue
            value = float(raw)
            why = self._why(metric, value)
            if why is not None:
                self._fail(step, metric, value, why)
        self.healthy += 1
        if self.healthy < self.steps:
            return
        if self._is_coordinator():
            self._good(step)
        else:
            self.verdict = "good"  # watched to the end; the coordinator tells the server

    def _why(self, metric: str, value: float) -> str | None:
        # guard: guard-nan-inf-is-a-failure
        if not math.isfinite(value):
            return f"{metric} is {value}"
        recorded = self.loaded.metadata.get(metric) if self.loaded is not None else None
        if not isinstance(recorded, (int, float)) or not math.isfinite(recorded) or recorded <= 0:
            return None  # nothing recorded to compare with (or a loss that can be negative)
        if value > self.spike * recorded:
            return (
                f"{metric} {value:.6g} is over {self.spike:g}x the {recorded:.6g} recorded "
                "when the checkpoint was saved"
            )
        return None

    def _fail(self, step: int, metric: str, value: float, why: str) -> None:
        assert self.loaded is not None
        ref = self.loaded.ref
        after = self.healthy + 1
        detail = f"{why}, {after} step(s) after loading {ref.job}/{ref.step}"
        self.verdict = "bad"
        try:
            self.client.give_verdict(
                ref.job,
                ref.step,
                "bad",
                metric=metric,
                value=value,
                at_step=step,
                detail=detail[:1024],
                branch=ref.branch,
            )
        except TierpointError as e:
            # Still stop: training on is worse. The restart may load it again; say so.
            print(f"tierpoint guard: could not mark {ref.job}/{ref.step} bad: {e}", file=sys.stderr)
        message = f"tierpoint guard: {detail}; marked {ref.job}/{ref.step} bad"
        if not self.exit:
            raise TrainingDiverged(message, self.exit_code)
        print(message, file=sys.stderr, flush=True)
        sys.stdout.flush()
        # Not SystemExit: the other ranks may be waiting in a collective this rank will never
        # join, and torch's teardown at interpreter exit can abort with another code.
        os._exit(self.exit_code)

    def _good(self, step: int) -> None:
        assert self.loaded is not None
        ref = self.loaded.ref
        self.verdict = "good"
        try:
            self.client.give_verdict(
                ref.job,
                ref.step,
                "good",
                metric="loss",
                at_step=step,
                detail=f"{self.healthy} healthy step(s) after loading it",
                branch=ref.branch,
            )
        except ConflictError:
            pass  # another rank found it bad meanwhile: bad is final, and right
        except TierpointError as e:
            print(
                f"tierpoint guard: could not mark {ref.job}/{ref.step} good: {e}", file=sys.stderr
            )

    def _is_coordinator(self) -> bool:
        if self._coordinator is not None:
            return self._coordinator
        # Without importing torch: a process that uses it has it loaded already.
        dist = sys.modules.get("torch.distributed")
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return True
        return bool(dist.get_rank() == 0)
