"""Edges of ``fit`` and of the route's candidate pool found in review (2026-11-28); each failed before its fix.

* ``fit`` moved the threshold of every task the prompts were scored against — with ``k = 100`` every task of a
  small space — so labels about one task replaced a user's strict override of another by a loose one.
* Its ``accuracy_before`` was replayed with the tests it turns off already off, not the answers users got.
* A task deleted while ``fit`` routed made the whole fit a 404, and a bad prompt was named by its index within
  its batch of 64, not the request.
* The answer (task and "none") depended on ``k``: the candidate pool was ``max(4k, 32)``, and the ranking
  standardises over the pool. Now ``max(k, 32)``: every ``k`` up to 32 gets the same answer.
* A task of 20–38 novelty vectors had a test that could never reject (no split-conformal quantile at half of
  5 %) and was still held to the half-rate route threshold; ``GET …/routing`` reported the full-rate one.

Real parts: the library (in-process worker, SQLite, FAISS) on a tiny GPT-2 saved to disk.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from atlas.errors import InvalidInput
from atlas.route_fit import as_fit_example
from fisher_atlas import Atlas
from service.schemas_routing import FitExample

SMILES = ["CCN(CC)CC", "CC(=O)Oc1ccccc1C(=O)O", "c1ccccc1O", "CC(C)Cc1ccc(cc1)C(C)C(=O)O",
          "CN1C=NC2=C1C(=O)N(C(=O)N2C)C", "O=C(O)c1ccccc1", "CCOCC", "CC(C)OC", "c1ccncc1", "CC(=O)CC",
          "CC(=O)Nc1ccc(O)cc1", "CCCCCCOC(=O)C", "c1ccccc1CCN", "CC(=O)OCC(C)C", "OCC(O)COC(=O)C", "CCCCO"]
LINES = ["To be, or not to be, that is the question.", "All the world's a stage.",
         "Now is the winter of our discontent.", "If music be the food of love, play on.",
         "Friends, Romans, countrymen, lend me your ears.", "A horse! a horse! my kingdom for a horse!",
         "Shall I compare thee to a summer's day?", "The lady doth protest too much, methinks."]
THINGS = ["grass", "the sky", "snow", "coal", "blood", "milk", "the sun", "a lemon", "an orange", "a plum",
          "a frog", "ink", "rust", "sand", "ash", "gold", "silver", "copper", "jade", "ruby", "a banana", "a cherry",
          "a crow", "a swan", "chalk", "tar", "cream", "olive oil", "a carrot", "a tomato", "the sea", "a leaf",
          "a pearl", "an egg yolk", "salt", "pepper", "a lime", "a grape", "soot", "ivory", "honey", "a brick",
          "a flamingo", "a raven", "a canary", "a pumpkin", "a cucumber", "an aubergine", "a peach", "a mango"]


def _atlas(path: Path, model: Path, **settings: Any) -> Atlas:
    return Atlas(path, model=str(model), sketch_dim=256, device="cpu", **settings)


def test_fit_moves_only_the_tasks_its_labelled_prompts_concern(tmp_path: Path, tiny_model_dir: Path) -> None:
    with _atlas(tmp_path / "a", tiny_model_dir) as atlas:
        atlas.add("chemistry", SMILES[:10], progress=False)
        atlas.add("shakespeare", LINES, progress=False)
        atlas.set_threshold("shakespeare", 0.9)  # a user's deliberate, strict override
        # labelled prompts of chemistry that the router answers with chemistry: no prompt concerns shakespeare
        answers = atlas.route(SMILES[10:], k=2)
        ex = [(p, "chemistry") for p, a in zip(SMILES[10:], answers, strict=True) if a.matches[0].name == "chemistry"]
        assert len(ex) >= 3, [a.matches[0].name for a in answers]
        res = atlas.fit(ex)
        assert "shakespeare" not in res.thresholds and "shakespeare" not in res.previous
        info = atlas.routing("shakespeare")
        assert (info.threshold, info.source) == (0.9, "override")


def test_fit_reports_the_accuracy_of_the_answers_users_got(tmp_path: Path, tiny_model_dir: Path) -> None:
    """The template test rejects the labelled prompts that lack "Answer:"; fit turns it off. "Before" is the
    router's accuracy with the test on (those prompts answered "none", wrong), not a replay with it off."""
    qa = [f"Question: what colour is {t}?\nAnswer:" for t in THINGS]
    with _atlas(tmp_path / "a", tiny_model_dir, route_length_match=False) as atlas:
        atlas.add("qa", qa, progress=False)
        atlas.add("chem", SMILES[:10], progress=False)
        assert atlas.routing("qa").template_active
        ex = [(f"Question: what colour is {t}?", "qa") for t in ["a violet", "a tulip", "a daisy", "a robin", "a fox"]]
        ex += [(f"Question: what colour is {t}?\nAnswer:", "qa") for t in ["a rose", "a lily", "a wolf", "a bee"]]
        answers = atlas.route([p for p, _ in ex], k=3)
        assert sum(a.template_rejects for a in answers) == 5
        got = sum(not a.none and a.matches[0].name == lab for a, (_, lab) in zip(answers, ex, strict=True)) / len(ex)
        res = atlas.fit(ex, dry_run=True)
        assert res.template_off == ["qa"]
        assert res.accuracy_before == pytest.approx(got) and got <= 4 / 9
        assert res.accuracy_after > res.accuracy_before


def test_fit_survives_a_task_deleted_while_it_routes(tmp_path: Path, tiny_model_dir: Path) -> None:
    """The labelled task is deleted by another client after fit resolved the labels and routed the prompts: the
    fit goes on without it (it was a 404 naming an id the user never gave)."""
    with _atlas(tmp_path / "a", tiny_model_dir) as atlas:
        atlas.add("shakespeare", LINES, progress=False)
        queries = atlas._c.queries
        route = queries.route

        async def route_then_delete(*args: Any, **kwargs: Any) -> Any:
            out = await route(*args, **kwargs)
            await asyncio.to_thread(atlas.delete, "chemistry")
            return out

        ex = [(p, "chemistry") for p in SMILES[10:15]]  # and molecules of no task, which chemistry answers
        ex += [(p, "none") for p in ("CC(C)(C)CC(C)(C)O", "C1CCCCC1N", "OC(=O)CCC(=O)O")]
        for dry_run in (True, False):
            atlas.add("chemistry", SMILES[:10], progress=False)
            assert "chemistry" in atlas.fit(ex, dry_run=True).thresholds  # without the delete: a change to it
            queries.route = route_then_delete  # type: ignore[method-assign]
            try:
                res = atlas.fit(ex, dry_run=dry_run)
            finally:
                queries.route = route  # type: ignore[method-assign]
            assert "chemistry" not in res.thresholds and "chemistry" not in res.previous
            assert res.stored == (not dry_run)
            assert [t.name for t in atlas.tasks()] == ["shakespeare"]


def test_a_bad_fit_prompt_is_named_by_its_place_in_the_request(tmp_path: Path, tiny_model_dir: Path) -> None:
    with _atlas(tmp_path / "a", tiny_model_dir) as atlas:
        atlas.add("chemistry", SMILES[:10], progress=False)
        ex = [(SMILES[i % len(SMILES)], "chemistry") for i in range(69)] + [("a", "none")]
        with pytest.raises(InvalidInput) as err:
            atlas.fit(ex, dry_run=True)
        assert err.value.message.startswith("example 69:"), err.value.message
        assert err.value.detail["example"] == 69


@given(label=st.one_of(st.booleans(), st.floats(allow_nan=False), st.lists(st.integers(), max_size=2)))
def test_a_fit_label_is_a_json_string_or_integer(label: object) -> None:
    assert FitExample.model_validate({"prompt": "x", "label": 7}).label == 7
    assert FitExample.model_validate({"prompt": "x", "label": "none"}).label == "none"
    # null is "none", as semantic-router's fit reads a route of None (a migration review: the client refused it)
    assert FitExample.model_validate({"prompt": "x", "label": None}).label == "none"
    assert as_fit_example(("x", None)) == ("x", "none")
    assert as_fit_example({"prompt": "x", "label": None}) == ("x", "none")
    assert as_fit_example(("x", label)) is None
    with pytest.raises(ValidationError):  # true was read as task id 1, 1.0 too
        FitExample.model_validate({"prompt": "x", "label": label})


@pytest.fixture(scope="module")
def wide_space(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Any:
    """40 tasks of random word texts: more than the 32 candidates a route re-ranks."""
    rng = random.Random(1)
    words = ["apple", "river", "stone", "cloud", "music", "garden", "engine", "paper", "window", "forest", "silver",
             "market", "doctor", "winter", "ocean", "castle", "bridge", "letter", "planet", "mirror", "candle",
             "valley", "farmer", "pilot", "the", "a", "of", "is", "and", "to"]
    with _atlas(tmp_path_factory.mktemp("wide"), tiny_model_dir) as atlas:
        for t in range(40):
            vocab = rng.sample(words, 8)
            atlas.add(f"task{t:02d}", [" ".join(rng.choice(vocab) for _ in range(rng.randint(4, 10)))
                                       for _ in range(6)], progress=False)
        prompts = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) for _ in range(64)]
        yield atlas, prompts


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ks=st.lists(st.integers(1, 32), min_size=2, max_size=2, unique=True))
def test_every_k_up_to_32_gets_the_same_answer(wide_space: Any, ks: list[int]) -> None:
    atlas, prompts = wide_space
    small, big = sorted(ks)
    for a, b in zip(atlas.route(prompts, k=small), atlas.route(prompts, k=big), strict=True):
        assert (a.none, a.threshold, a.rejected_by) == (b.none, b.threshold, b.rejected_by)
        assert a.matches == b.matches[:small]


def test_routing_reports_the_threshold_whole_prompts_are_held_to(tmp_path: Path, tiny_model_dir: Path) -> None:
    """60 samples: the novelty test applies (39 vectors needed at half of 5 %), and whole prompts are held to the
    route threshold at the other half — which GET …/routing now reports. 30 samples: vectors enough to calibrate
    (20) but not for that rate: no test, the full-rate threshold."""
    qa = [f"Question: what colour is {t}?\nAnswer:" for t in THINGS]
    with _atlas(tmp_path / "a", tiny_model_dir) as atlas:
        atlas.add("big", qa, progress=False)
        atlas.add("small", [f"{line} {t}." for line in LINES for t in THINGS[:4]][:30], progress=False)
        big, small = atlas.routing("big"), atlas.routing("small")
        assert big.novelty_samples >= 39 and big.novelty_active and big.source == "calibrated"
        # the half-rate bound is at or below the full-rate one (with all 60 samples held out both can be the lowest)
        assert big.threshold <= big.threshold_auto
        assert 20 <= small.novelty_samples < 39 and small.novelty_test and not small.novelty_active
        assert small.threshold == small.threshold_auto
        for name, info, prompt in (("big", big, "Question: what colour is a violet?\nAnswer:"),
                                   ("small", small, f"{LINES[0]} {THINGS[9]}.")):
            match = atlas.route(prompt, k=2).matches[0]  # the answered task: the one the novelty test applies to
            assert match.name == name and match.length_drop is None
            assert match.threshold == pytest.approx(info.threshold)
