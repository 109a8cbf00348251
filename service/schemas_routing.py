"""Request and response models of routing: ``/v1/route``, ``/v1/route/fit`` and ``/v1/tasks/{id}/routing``."""

from __future__ import annotations

import warnings
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from atlas.route_calibration import MAX_FALSE_REJECT_RATE
from atlas.routing import MAX_ROUTE_K
from service.schemas import SPACE_REF_MAX, _Out


def _non_empty(prompt: str) -> str:
    """A batch's prompt, refused when empty (the error's ``loc`` ends with the prompt's index)."""
    if not prompt:
        raise ValueError("the prompt is empty: prompts are non-empty strings")
    return prompt


NonEmptyPrompt = Annotated[str, AfterValidator(_non_empty), WithJsonSchema({"type": "string", "minLength": 1})]
"""A batch's prompt: refused when empty, and ``minLength: 1`` in the schema too (an API fuzz, 2026-12-07)."""


class RouteRequest(BaseModel):
    """Route one prompt (``prompt``) or a batch (``prompts``) to the nearest stored tasks."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"prompt": "Is the Eiffel tower in Paris?", "k": 3},
                {"prompts": ["CCOc1ccccc1", "To be, or not to be"], "k": 1, "threshold": 0.2},
            ]
        },
    )

    prompt: str | None = Field(default=None, min_length=1, description="One prompt.")
    prompts: list[NonEmptyPrompt] | None = Field(
        default=None, min_length=1, max_length=64,
        description="A batch of non-empty prompts (an empty one is a 422 whose `loc` ends with its index).")
    k: StrictInt = Field(default=5, ge=1, le=MAX_ROUTE_K, description="Matches returned per prompt (a JSON integer: "
                         "`true` or `\"3\"` is refused).")
    threshold: StrictFloat | None = Field(
        default=None, ge=-1.0, le=1.0, allow_inf_nan=False,
        description="Open-set threshold on the best score; `none` is true below it. Default: the service's (a JSON "
                    "number: `true` or `\"0.3\"` is refused).",
    )
    candidates: StrictInt | None = Field(
        default=None, ge=1, le=4096,
        description="FAISS candidates re-ranked exactly; default max(k, 32), so every k up to 32 gets the same answer."
    )
    space: str | None = Field(default=None, max_length=SPACE_REF_MAX,
                              description="Space id or name; default: the loaded model's space.")

    @model_validator(mode="after")
    def _one_of(self) -> RouteRequest:
        if (self.prompt is None) == (self.prompts is None):
            raise ValueError("give exactly one of 'prompt' or 'prompts'")
        return self

    def texts(self) -> list[str]:
        """The prompts as a list."""
        return [self.prompt] if self.prompt is not None else list(self.prompts or [])


class RouteMatch(_Out):
    """One candidate task for a prompt."""

    task_id: int
    name: str
    score: float = Field(description="Route score, a cosine in [-1, 1] between the prompt and the task's routing "
                                     "state, shrunk for the task's size and noise (docs/SCORES.md).")
    faiss_score: float = Field(description="Inner product of the unit signatures (the ANN stage).")
    activation: float = Field(description="S_cov(M_a) of prompt and task in [0, 1]: activation-side similarity.")
    error: float = Field(description="S_cov(Γ_e) of prompt and task in [0, 1]: error-side similarity.")
    threshold: float | None = Field(default=None, description="The threshold this task is held to (request, task "
                                    "override, calibrated, or global default).")
    confidence: float | None = Field(default=None, description="sigmoid((score - threshold) / scale) in [0, 1]: "
                                     "0.5 on the threshold (docs/SCORES.md).")
    rank_score: float | None = Field(default=None, description="Fisher ranking score in [-1, 1] (docs/SCORES.md).")
    lexical: float | None = Field(default=None, description="Lexical score in [0, 1]; set when it is fused with "
                                  "rank_score to order the matches (docs/SCORES.md, 'Lexical evidence').")
    length_matched: bool = Field(default=False, description="Whether the prompt is short for the task and "
                                 "`threshold` is the lower of the task's calibrated threshold and that of its held-out "
                                 "sample prefixes of about the prompt's length, moved by the task's override as far "
                                 "as the override moves its whole prompts' threshold (docs/SCORES.md, \"Prompts "
                                 "shorter than the samples\").")


class RouteRejection(_Out):
    """The task that decided a ``none`` answer, and by which rule."""

    task_id: int
    name: str
    score: float = Field(description="Its route score for the prompt.")
    threshold: float = Field(description="The threshold it holds the prompt to.")
    reason: Literal["threshold", "nearest", "template", "novelty"] = Field(
        description="`threshold`: the answered (first) task's score is below its threshold; `nearest`: the task "
                    "nearest to the prompt, not the answered one, holds it below its threshold; `template`: the "
                    "prompt lacks a term every sample of the answered task has; `novelty`: the prompt's mean hidden "
                    "state lies farther from the answered task's samples than its novelty threshold (`score` and "
                    "`threshold` are then that distance and threshold; docs/SCORES.md).")
    prompt_tokens: int | None = Field(default=None, description="The prompt's token positions.")
    sample_tokens: float | None = Field(default=None, description="The deciding task's mean token positions per "
                                        "sample.")
    length_matched: bool = Field(default=False, description="Whether `threshold` was matched to the prompt's "
                                 "length: for a prompt under 3/4 of the length of three in four of the task's samples, "
                                 "the threshold of its held-out sample prefixes of about the prompt's length "
                                 "(docs/SCORES.md, "
                                 "\"Prompts shorter than the samples\"). A task calibrated before such prefixes were "
                                 "stored holds a prompt under half its samples' length to a threshold set on whole "
                                 "samples, which rejects it far more often than the task's false-reject rate.")
    overridden: bool = Field(default=False, description="Whether the deciding task's threshold is an override (a "
                             "user's or `fit`'s) rather than its calibrated one; for a short prompt, its length's "
                             "threshold moved by the override.")
    also: list[Literal["nearest", "novelty", "template"]] = Field(
        default_factory=list, description="The other rules that reject the prompt too (in the order they are checked): "
        "lowering the deciding threshold alone would still answer `none`.")
    message: str = Field(description="The same in one sentence, naming the task (what the CLI and the dashboard "
                                     "show), with a note on the prompt's length where it decided the threshold, and "
                                     "the other rules that reject it too.")


class RouteResult(_Out):
    """The answer for one prompt."""

    matches: list[RouteMatch]
    none: bool = Field(description="True when no stored task fits: the answered task's score is under its "
                                   "threshold, the nearest task rejects the prompt, it lacks the answered task's "
                                   "template, or its mean hidden state is too far from the answered task's samples "
                                   "(the novelty test; `rejected_by` says which).")
    best_score: float | None = Field(default=None, description="The answered task's (the first match's) route "
                                     "score. Matches are ordered by the ranking (Fisher, fused with the lexical "
                                     "score), so it need not be the highest score listed.")
    threshold: float = Field(description="The threshold the answered task is held to.")
    confidence: float | None = Field(default=None, description="Confidence in [0, 1] of the answer given: the best "
                                     "task, or no task when `none` is true.")
    nearest_rejects: bool = Field(default=False, description="`none` because the nearest task rejects the prompt.")
    template_rejects: bool = Field(default=False, description="`none` because the prompt lacks a term every sample "
                                   "of the answered task has (docs/SCORES.md, 'Open set: template test').")
    rejected_by: RouteRejection | None = Field(default=None, description="When `none` is true and a task exists: "
                                               "the task that decided it, its score, threshold and rule.")
    novelty_rejects: bool = Field(default=False, description="`none` because the prompt's mean hidden state is "
                                  "novel for the answered task (docs/SCORES.md, 'Open set: novelty test').")
    truncated: bool = Field(default=False, description="The prompt was longer than the model's token limit (the "
                            "service's `max_tokens_per_sample`, 512 by default): only its first tokens were read, "
                            "so the answer is about that prefix.")


class RouteResponse(_Out):
    """Answer of ``POST /v1/route``.

    The top-level fields answer ``prompt`` (or ``prompts[0]``); ``results[i]`` answers ``prompts[i]``.
    """

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={
            "examples": [
                {
                    "matches": [{"task_id": 3, "name": "boolq", "score": 0.61, "faiss_score": 0.42,
                                 "activation": 0.93, "error": 0.58}],
                    "none": False, "best_score": 0.61, "threshold": 0.05,
                    "results": [
                        {"matches": [{"task_id": 3, "name": "boolq", "score": 0.61, "faiss_score": 0.42,
                                      "activation": 0.93, "error": 0.58}],
                         "none": False, "best_score": 0.61, "threshold": 0.05}
                    ],
                }
            ]
        },
    )

    matches: list[RouteMatch]
    none: bool
    best_score: float | None = None
    threshold: float
    confidence: float | None = None
    nearest_rejects: bool = False
    template_rejects: bool = False
    rejected_by: RouteRejection | None = None
    novelty_rejects: bool = False
    truncated: bool = False
    results: list[RouteResult]


class FitExample(BaseModel):
    """One labelled prompt for ``/v1/route/fit``: the task it belongs to, or ``"none"``."""

    model_config = ConfigDict(extra="forbid")

    prompt: str = Field(min_length=1)
    label: StrictStr | StrictInt = Field(
        description='Task name or id, or "none" (the prompt belongs to no task; `null` too); a JSON string or integer '
                    '(`true` or `1.0` is refused, not read as id 1).')

    @field_validator("label", mode="before")
    @classmethod
    def _null_is_none(cls, label: object) -> object:
        return "none" if label is None else label


class FitRequest(BaseModel):
    """Labelled prompts from which per-task route thresholds are tuned (docs/SCORES.md)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"examples": [{"prompt": "To be or not to be", "label": "shakespeare"},
                                                      {"prompt": "SELECT 1;", "label": "none"}]}]},
    )

    examples: list[FitExample] = Field(min_length=1, max_length=2000)
    space: str | None = Field(default=None, max_length=SPACE_REF_MAX,
                              description="Space id or name; default: the loaded model's space.")
    dry_run: StrictBool = Field(default=False, description="Compute the thresholds without storing them (a JSON "
                                "boolean).")


class FitResponse(_Out):
    """New per-task thresholds (stored as overrides unless ``dry_run``) and the accuracy on the examples."""

    thresholds: dict[str, float]
    accuracy_before: float = Field(description="Share of the examples the router answered right (its task, or none "
                                   "for a none label) before fit: the answers as routed, every test as it stood.")
    accuracy_after: float = Field(description="The same share under the new thresholds and tests (a replay of the "
                                  "router's rules on the routed scores).")
    stored: bool
    template_off: list[str] = Field(default_factory=list, description="Tasks whose template test was turned off: "
                                    "more than 2 % of the prompts labelled with them lack their template.")
    previous: dict[str, float] = Field(default_factory=dict, description="For each task in `thresholds` or "
                                       "`unsplit`: the threshold its labelled prompts were held to before `fit`.")
    unsplit: dict[str, float] = Field(default_factory=dict, description="For each task of `novelty_off` that `fit` "
                                      "set no threshold for and that has no override: the threshold its prompts "
                                      "are held to now that its novelty test is off (its calibrated one at its whole "
                                      "false-reject rate, no longer half of it).")
    held_by_cap: dict[str, int] = Field(default_factory=dict, description="For each task that still answers prompts "
                                        "labelled otherwise because refusing them would take its threshold past its "
                                        "false-reject rate on its own prompts (fit's cap): how many of the examples. "
                                        "More of its own samples, or a higher false_reject_rate, lets fit go further.")
    novelty_off: list[str] = Field(default_factory=list, description="Tasks whose novelty test was turned off: it "
                                   "rejected at least 3 and more than 10 % (or the task's false-reject rate, when "
                                   "larger) of the prompts labelled with them (docs/SCORES.md, 'fit').")


def _no_default(schema: dict[str, Any]) -> None:
    """A field that is absent or a value, never ``null``, in its schema: ``anyOf [X, null]`` becomes ``X``, without
    ``default: null`` (absent means unchanged)."""
    schema.pop("default", None)
    kinds = schema.pop("anyOf", None)
    if kinds is not None:
        schema.update(next(k for k in kinds if k.get("type") != "null"))


class ThresholdPatch(BaseModel):
    """Set or clear (``null``) a task's route-threshold override; turn its template or novelty test on or off; set
    the false-reject rate its threshold is calibrated at."""

    model_config = ConfigDict(extra="forbid")

    threshold: StrictFloat | None = Field(default=None, ge=-1.0, le=1.0, allow_inf_nan=False,
                                          description="The override; null clears it. Left as it is when the body does "
                                          "not name it. A JSON number: `false` stored 0.0, `true` 1.0 (an API fuzz, "
                                          "2026-12-07).")
    template: StrictBool | None = Field(
        default=None, json_schema_extra=_no_default,
        description="false: prompts lacking the task's template are no longer answered `none` for it; true: they are "
                    "again (docs/SCORES.md).")
    novelty: StrictBool | None = Field(
        default=None, json_schema_extra=_no_default,
        description="false: the task's novelty test is off (its prompts are held to its full-rate route threshold "
                    "alone); true: on again (docs/SCORES.md, 'Open set: novelty test').")
    false_reject_rate: StrictFloat | None = Field(
        default=None, gt=0.0, le=MAX_FALSE_REJECT_RATE, json_schema_extra=_no_default,
        description="Re-calibrate the task's threshold so that at most this share of its own prompts is answered "
                    "`none` (default 0.05; from its stored held-out scores, no model run; later appends keep it). "
                    "An override still wins.")

    @field_validator("template", "novelty", "false_reject_rate", mode="before")
    @classmethod
    def _null_only_clears_the_override(cls, value: object) -> object:
        """``null`` clears the threshold override; for a switch or the rate it meant nothing and was taken silently
        (answered 200, nothing changed). Not nullable in the schema either: a generated client sending an unset
        field as null was refused by a body its schema allowed (an API review, 2026-12-07)."""
        if value is None:
            raise ValueError("null is no value here (a switch is true or false; the default false-reject rate is "
                             "0.05); only threshold takes null, to clear the override")
        return value


class RoutingInfo(_Out):
    """A task's routing side: effective threshold and where it comes from."""

    task_id: int
    threshold: float
    source: str = Field(description="override, calibrated or default")
    threshold_override: float | None = None
    threshold_auto: float | None = None
    calibration_scores: int = 0
    length_views: int = Field(default=0, description="Held-out views (whole calibration samples and their first half, "
                              "quarter and eighth of tokens) that a short prompt's threshold is calibrated on.")
    short_prompt_tokens: float | None = Field(default=None, description="A prompt with fewer token positions (under "
                                              "3/4 of the length of three in four of the task's samples) is held to "
                                              "the "
                                              "threshold of the views nearest its length (moved by as much as an "
                                              "override moves whole prompts' threshold) and to neither the template "
                                              "nor the novelty test (docs/SCORES.md, 'Prompts shorter than the "
                                              "samples'); null: no views stored (a task calibrated before them judges "
                                              "every prompt on whole samples).")
    false_reject_rate: float | None = None
    prompt_side: bool = Field(default=False, description="Routes on a prompt-side state (completion mode).")
    typical_score: float | None = Field(default=None, description="Shrunk mean of the held-out scores, subtracted "
                                        "(×½) in the ranking of a whitened space (docs/SCORES.md, 'Ranking').")
    template_terms: int | None = Field(default=None, description="Terms every sample of the task has (its template; "
                                       "null: stored before templates).")
    template_active: bool | None = Field(default=None, description="Whether the template held in enough leave-one-"
                                         "out checks (docs/SCORES.md, 'Open set: template test').")
    template_test: bool = Field(default=True, description="Whether a prompt lacking an active template's term is "
                                "answered `none` for this task (PATCH `template`).")
    template_false_reject: float | None = Field(default=None, description="Estimated share of the task's prompts "
                                                "lacking a template term, (misses + 1) / (checks + 2).")
    novelty_samples: int = Field(default=0, description="Sample vectors the task keeps for the novelty test (it is "
                                 "calibrated from 20 on, tested from 39 at the default rate: `novelty_active`; "
                                 "docs/SCORES.md, 'Open set: novelty test').")
    novelty_test: bool = Field(default=True, description="Whether the task's novelty test is switched on (PATCH "
                               "`novelty`; it applies from 20 sample vectors on).")
    novelty_samples_needed: int | None = Field(default=None, description="Sample vectors the novelty test needs at "
                                               "the task's false-reject rate (39 at 5 %, 99 at 2 %; a task keeps at "
                                               "most 128: below about 1.6 % it has no test).")
    novelty_active: bool = Field(default=False, description="Whether whole prompts are held to the novelty test now: "
                                 "switched on, on for the service, and enough sample vectors for the test's half of "
                                 "the task's false-reject rate (39 at the default 5 %); then `threshold`, when "
                                 "calibrated, is the route threshold at the other half.")

    def __getitem__(self, key: str) -> Any:
        """Deprecated: ``info[key]`` (the library returned a dict before 2026-12-07; kept one release with a
        warning). Read the attribute."""
        warnings.warn(f"RoutingInfo[{key!r}] is deprecated: read .{key}", DeprecationWarning, stacklevel=2)
        if key not in type(self).model_fields:
            raise KeyError(key)
        return getattr(self, key)
