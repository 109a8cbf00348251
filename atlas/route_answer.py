"""The answer of a route for one prompt (:func:`atlas.routing.rerank_route`): its matches, the open-set flag and
its confidence, and the task that decided a ``none``."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Rejection", "RouteAnswer", "RouteMatch"]


@dataclass(frozen=True)
class RouteMatch:
    """One re-ranked match (see :func:`atlas.routing.rerank_route`)."""

    task_id: int
    name: str
    score: float
    faiss_score: float
    activation: float
    error: float
    threshold: float = 0.0
    confidence: float = 0.0
    rank_score: float | None = None
    lexical: float | None = None
    length_drop: float | None = None
    """For a prompt short for the task, how far below the task's threshold for prompts as long as its samples its
    length holds it (:attr:`atlas.routing.PromptThreshold.length_drop`); ``None`` otherwise."""

    @property
    def length_matched(self) -> bool:
        """Whether the prompt is short for the task and its threshold was matched to its length."""
        return self.length_drop is not None


@dataclass(frozen=True)
class Rejection:
    """Which task answered ``none`` and why: ``reason`` is ``"threshold"`` (the answered task's score is below
    its threshold), ``"nearest"`` (the task nearest to the prompt, not the answered one, holds it below its
    threshold), ``"novelty"`` (the prompt is novel for the answered task) or ``"template"`` (the prompt lacks a term
    every sample of the answered task has); ``also``: the other rules that reject it too."""

    task_id: int
    name: str
    score: float
    threshold: float
    reason: str
    prompt_tokens: int | None = None
    sample_tokens: float | None = None
    """The prompt's token positions and the deciding task's mean per sample (its routing state's), when known."""
    length_matched: bool = False
    """Whether ``threshold`` was taken from the task's held-out views of about the prompt's length (a prompt short
    for the task: :func:`atlas.routing.prompt_threshold`)."""
    overridden: bool = False
    """Whether the task's threshold is an override (a user's or ``fit``'s) rather than its calibrated one."""
    also: tuple[str, ...] = ()
    """The other rules that reject the prompt too, in the order they are checked (``"nearest"``, ``"novelty"``,
    ``"template"``): lowering the deciding threshold alone would still answer ``none``."""

    @property
    def short_prompt(self) -> bool:
        """Whether the prompt is under half as long as the deciding task's samples and its threshold was *not*
        matched to its length (a task calibrated before held-out views were stored): a threshold calibrated on
        whole samples then rejects far more than the task's false-reject rate of its own prompts (bench 4f)."""
        return (self.reason not in ("template", "novelty") and not self.length_matched
                and self.prompt_tokens is not None and self.sample_tokens is not None
                and self.prompt_tokens < 0.5 * self.sample_tokens)

    @property
    def message(self) -> str:
        """The sentence the CLI and the dashboard show after "none: ", naming the other rules that reject the
        prompt too."""
        text = self._decision()
        if self.also:
            text += "; " + ", and ".join(_ALSO[r] for r in self.also) + " too"
        return text

    def _decision(self) -> str:
        """The deciding rule's sentence."""
        task = f"{self.name!r} (id {self.task_id})"
        if self.reason == "template":
            return f"the prompt lacks a term every sample of {task}, the answered task, has (its template)"
        if self.reason == "novelty":
            return (f"the prompt's hidden state is farther from the samples of {task}, the answered task, than its "
                    f"novelty threshold (distance {self.score:.3f} > {self.threshold:.3f}: an unseen kind of text)")
        which = "the task nearest to the prompt" if self.reason == "nearest" else "the answered (first-ranked) task"
        text = f"{task}, {which}, scores {self.score:.4f}, below its threshold {self.threshold:.4f}"
        tokens = f"{self.prompt_tokens} token{'' if self.prompt_tokens == 1 else 's'}"
        if self.length_matched:
            text += (f" (for a prompt of {tokens}: the threshold of its held-out sample prefixes of about that length"
                     + (", moved by its threshold override)" if self.overridden else ")"))
        elif self.short_prompt:
            text += (f"; the prompt has {tokens}, the task's samples {self.sample_tokens:.0f} on "
                     "average: thresholds hold for prompts about as long as the samples (docs/SCORES.md)")
        return text


_ALSO = {"nearest": "the task nearest to the prompt holds it below its threshold",
         "novelty": "the answered task's novelty test rejects it",
         "template": "it lacks the answered task's template"}
"""How :attr:`Rejection.message` names a rule that rejects the prompt besides the deciding one."""


@dataclass(frozen=True)
class RouteAnswer:
    """The answer for one prompt: top-``k`` matches, best first, the open-set flag and its confidence.

    ``threshold`` is the one the best match was held to; ``confidence`` is that of the answer given
    (the best task when ``none`` is false, "no task" when it is true); ``nearest_rejects``: in a whitened
    space, the task nearest to the prompt before the typical-score term (not the answered one) holds the
    prompt below its threshold — then ``none`` too (see :func:`rerank_route`); ``template_rejects``: the
    prompt lacks a term every sample of the answered task has (:mod:`atlas.template`) — then ``none`` too;
    ``rejected_by``: the task that decided a ``none`` and by which rule (``None`` when ``none`` is false or no
    task exists). ``best_score`` is the answered task's (the first match's) score: matches are ordered by the
    ranking, so it need not be the highest.
    """

    matches: list[RouteMatch]
    none: bool
    best_score: float | None
    threshold: float
    confidence: float = 1.0
    nearest_rejects: bool = False
    template_rejects: bool = False
    rejected_by: Rejection | None = None
    novelty_rejects: bool = False
    """The prompt is novel for the answered task (:mod:`atlas.novelty`) — then ``none`` too."""
    truncated: bool = False
    """The prompt was longer than the model's token limit (``max_tokens_per_sample``): only its first tokens were
    sketched, so the answer is about that prefix."""
