"""`TrainingSummary`: how a run of ``rlpar train`` ended, typed; ``summary.json`` and the last
line of ``rlpar train --json`` are its `to_dict`, and `from_dict` reads them back (a seed's
child process, a Ray task's result)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from rlpar.runtime import RunResult

__all__ = ["TrainingSummary"]

_RESULT_FIELDS = frozenset(f.name for f in dataclasses.fields(RunResult))


@dataclass(frozen=True)
class TrainingSummary:
    """A finished run: its experiment's ``name``, the runner's `RunResult` (``checkpoint`` an
    absolute path), the experiment's ``target_return``, the absolute ``run_dir``, and
    ``error``: why the command fails although the run itself ended whole (a video clip that
    could not be written), else None."""

    name: str
    result: RunResult
    target_return: float | None
    run_dir: str
    error: str | None = None

    @property
    def evaluation(self) -> list[dict[str, Any]]:
        """The final evaluation, one entry per policy (`RunResult.evaluation`); [] without."""
        return self.result.evaluation or []

    @property
    def eval_return(self) -> float | None:
        """The first policy's evaluated mean return (the one a run is judged by), or None."""
        return self.evaluation[0]["mean_return"] if self.evaluation else None

    def to_dict(self) -> dict[str, Any]:
        """``summary.json``'s object: the name, the `RunResult`'s fields, the target, the run
        directory, and ``error`` when there is one."""
        out = {
            "name": self.name,
            **self.result.to_dict(),
            "target_return": self.target_return,
            "run_dir": self.run_dir,
        }
        if self.error is not None:
            out["error"] = self.error
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainingSummary:
        """The summary `to_dict` wrote (read back from JSON). Raises KeyError naming a missing
        entry."""
        result = RunResult(**{k: v for k, v in data.items() if k in _RESULT_FIELDS})
        return cls(
            name=data["name"],
            result=result,
            target_return=data["target_return"],
            run_dir=data["run_dir"],
            error=data.get("error"),
        )
