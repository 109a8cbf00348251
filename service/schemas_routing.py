"""Request and response models of the route thresholds: ``/v1/route/fit`` and ``/v1/tasks/{id}/routing``."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from service.schemas import _Out


class FitExample(BaseModel):
    """One labelled prompt for ``/v1/route/fit``: the task it belongs to, or ``"none"``."""

    model_config = ConfigDict(extra="forbid")

    prompt: str = Field(min_length=1)
    label: str | int = Field(description='Task name or id, or "none" (the prompt belongs to no task).')


class FitRequest(BaseModel):
    """Labelled prompts from which per-task route thresholds are tuned (docs/SCORES.md)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"examples": [{"prompt": "To be or not to be", "label": "shakespeare"},
                                                      {"prompt": "SELECT 1;", "label": "none"}]}]},
    )

    examples: list[FitExample] = Field(min_length=1, max_length=2000)
    space: str | None = None
    dry_run: bool = Field(default=False, description="Compute the thresholds without storing them.")


class FitResponse(_Out):
    """New per-task thresholds (stored as overrides unless ``dry_run``) and the accuracy on the examples."""

    thresholds: dict[str, float]
    accuracy_before: float
    accuracy_after: float
    stored: bool


class ThresholdPatch(BaseModel):
    """Set or clear (``null``) a task's route-threshold override."""

    model_config = ConfigDict(extra="forbid")

    threshold: float | None = Field(default=None, ge=-1.0, le=1.0)


class RoutingInfo(_Out):
    """A task's routing side: effective threshold and where it comes from."""

    task_id: int
    threshold: float
    source: str = Field(description="override, calibrated or default")
    threshold_override: float | None = None
    threshold_auto: float | None = None
    calibration_scores: int = 0
    false_reject_rate: float | None = None
    prompt_side: bool = Field(default=False, description="Routes on a prompt-side state (completion mode).")
    typical_score: float | None = Field(default=None, description="Shrunk mean of the held-out scores, subtracted "
                                        "(×½) in the ranking of a whitened space (docs/SCORES.md, 'Ranking').")
