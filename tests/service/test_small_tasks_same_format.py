"""Tasks of 1–3 samples *of the same format* as the well-populated tasks beside them (issue 13's "small tasks
harmless"), on real data with the bundled model.

Found by a generalisation audit (2026-12-07): in a space of 16 TREC fine question classes, a task of three questions
of another class ("What U.S. state borders Illinois …") took the top-1 of a few of the classes' own held-out
questions ("What ability has the silkworm moth lost …") on the lexical score alone: a profile of three short
questions has so few terms that each shared word weighs far more in its cosine than in a large task's, and the
lexical score was shrunk by √(n / (n + κ)) only (×0.65 at three samples). It is now shrunk as much as the Fisher
ranking is in all, n / (n + κ) (:func:`atlas.routing.lexical_prior`; docs/SCORES.md, "Lexical evidence").

Ranked as the service ranks (the space's whitening at 16+ tasks, each task's typical score, the lexical fusion), with
the real extractor; 36 questions a class here, from the rows the bundled model was not trained on (its split rule:
sha256 bucket ≥ 4).
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from typing import Any

import numpy as np
import pytest

from atlas import lexicon_repo, routing
from atlas.lexical import TermCounts
from atlas.samples import Sample
from atlas.whitening import fit_space_whitening
from tests.shared_data import DATA, require_shared_data
from workers.calibration import prompt_side

N_TASK, N_HELD, N_CLASSES = 36, 16, 16
SMALL_CLASSES = ("LOC:state", "NUM:money", "ENTY:termeq", "HUM:title")


def _bucket(key: str) -> int:
    return int(hashlib.sha256(key.encode("utf-8")).hexdigest()[:8], 16) % 10


@pytest.fixture(scope="module")
def trec() -> dict[str, Any]:
    from atlas.settings import Settings
    from fishersketch import Sketcher
    from workers.extraction import Extractor
    from workers.model_loading import load_causal_lm

    require_shared_data()
    by_class: dict[str, list[str]] = defaultdict(list)
    with (DATA / "multidomain_text" / "multidomain_text.jsonl").open() as f:
        for line in f:
            rec = json.loads(line)
            if rec["domain"] == "questions_trec" and _bucket(rec["text"]) >= 4 and rec["text"] not in by_class[
                    rec["label"]]:
                by_class[rec["label"]].append(rec["text"])
    big = [c for c, v in sorted(by_class.items(), key=lambda kv: (-len(kv[1]), kv[0]))
           if c not in SMALL_CLASSES and len(v) >= N_TASK + N_HELD][:N_CLASSES]
    assert len(big) == N_CLASSES and all(len(by_class[c]) >= 6 for c in SMALL_CLASSES)
    s = Settings()
    lm = load_causal_lm("bundled", device="cpu")
    ex = Extractor(lm, Sketcher(lm.make_spec(m=4096, seed=s.sketch_seed, error_projection=s.error_projection),
                                device=lm.device), max_tokens_per_sample=s.max_tokens_per_sample)

    def candidate(i: int, name: str, texts: list[str]) -> routing.Candidate:
        samples = [Sample(text=t) for t in texts]
        side = prompt_side(ex, samples, "text")
        state = side.cal_states[0].copy()
        for st in side.cal_states[1:]:  # a text task's state: the sum of its samples' prompt-mode states
            state.merge_(st)
        held_out = routing.leave_one_out_scores(state, side.cal_states)
        cal = routing.calibrate(held_out)
        terms = lexicon_repo.LexicalRecord.empty().add(lexicon_repo.LexicalDelta.of_samples(samples, "text")).terms()
        return routing.Candidate(i, name, state, 0.0, routing.state_view(state), threshold=cal.threshold,
                                 scale=cal.scale, terms=terms,  # what a job stores, and the ranking reads
                                 typical=routing.typical_score(held_out) if len(samples) > 1 else None)

    cands = [candidate(i, c, by_class[c][:N_TASK]) for i, c in enumerate(big)]
    held = [(i, t, ex.prompt(t).state) for i, c in enumerate(big) for t in by_class[c][N_TASK:N_TASK + N_HELD]]
    small = [candidate(N_CLASSES, f"small {c} {k}#{rep}", by_class[c][3 * rep:3 * rep + k])
             for c in SMALL_CLASSES for k in (1, 2, 3) for rep in (0, 1)]
    return {"cands": cands, "held": held, "small": small}


def _tops(cands: list[routing.Candidate], held: list[tuple[int, str, Any]]) -> list[int]:
    means = np.stack([routing.unit_means(c.state) for c in cands])
    whitening = fit_space_whitening(means[:, 0], means[:, 1])  # the space's transform, as the service fits it
    return [routing.rerank_route(state, cands, k=3, threshold=-1.0, whitening=whitening,
                                 prompt_terms=TermCounts.from_texts([text])).matches[0].task_id
            for _, text, state in held]


def test_small_tasks_of_the_same_format_never_take_the_classes_own_questions(trec: dict[str, Any]) -> None:
    cands, held = trec["cands"], trec["held"]
    tops = _tops(cands, held)
    right = np.mean([t == own for t, (own, _, _) in zip(tops, held, strict=True)])
    assert right >= 0.5, right  # the space itself routes (16 fine classes of one question format)
    taken = {}
    for small in trec["small"]:
        with_small = _tops([*cands, small], held)
        taken[small.name] = sum(t == small.task_id for t in with_small)
    print(f"top-1 {right:.1%} of {len(held)}; taken by small tasks: {taken}")
    assert sum(taken.values()) == 0, taken
