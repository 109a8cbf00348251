"""Crafted space exports, their checksum recomputed (a review of imports, 2026-12-07); each failed before its fix.

An importer with a write key could store a task that made every route of its space answer 500 (a false-reject rate
whose half underflowed to 0, a held-out view of ``10**30`` tokens, novelty vectors of another width), or whose counts
or version overflowed on the next append. Each such file is now refused (422, nothing stored), and the rules that
would have raised on routing no longer can.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from atlas.baselines import BaselineSums
from atlas.errors import InvalidInput
from fisher_atlas import Atlas

PROSE = [f"The {a} fox jumps over the {b} dog near the {c}." for a in ("quick", "brown", "red", "grey")
         for b in ("lazy", "old", "small") for c in ("barn", "road", "river", "farm")]


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> list[dict[str, Any]]:
    """A real export of one 48-sample text task: its header, task line and trailer as JSON objects."""
    path = tmp_path_factory.mktemp("export") / "space.jsonl"
    with Atlas(path.parent / "data", model=str(tiny_model_dir), sketch_dim=256, device="cpu") as atlas:
        atlas.add("prose", samples=PROSE, wait=True)
        atlas.export(path)
    return [json.loads(line) for line in path.read_text().splitlines()]


def _write(lines: list[dict[str, Any]], path: Path) -> Path:
    """``lines`` as an export with its trailer's checksum recomputed, as an attacker would."""
    body = "".join(json.dumps(line) + "\n" for line in lines[:-1]).encode()
    trailer = {"trailer": True, "n_tasks": len(lines) - 2, "sha256": hashlib.sha256(body).hexdigest()}
    path.write_bytes(body + (json.dumps(trailer) + "\n").encode())
    return path


def _crafted(export: list[dict[str, Any]], edit: Callable[[dict[str, Any], dict[str, Any]], None]) -> list[Any]:
    lines = json.loads(json.dumps(export))
    edit(lines[0], lines[1])
    return lines


def _baselines(task: dict[str, Any], change: Callable[[BaselineSums], BaselineSums]) -> None:
    sums = BaselineSums.from_bytes(base64.b64decode(task["baselines"]))
    task["baselines"] = base64.b64encode(change(sums).to_bytes()).decode()


def _state_sq_norms(task: dict[str, Any], value: float) -> None:
    from fishersketch import SketchState

    state = SketchState.from_bytes(base64.b64decode(task["state"]))
    state.sq_norms[:] = value
    task["state"] = base64.b64encode(state.to_bytes()).decode()


REFUSED: dict[str, tuple[Callable[[dict[str, Any], dict[str, Any]], None], str]] = {
    "a view of 10**30 tokens": (lambda h, t: t["routing"]["cal_views"][0].__setitem__(0, 10**30), "cal_views"),
    "novelty vectors of another width": (lambda h, t: _baselines(t, lambda b: dataclasses.replace(
        b, sample_vectors=np.ascontiguousarray(b.sample_vectors[:, : b.sample_vectors.shape[1] // 2]))), "width"),
    "a NaN in the baselines' hidden sums": (lambda h, t: _baselines(t, lambda b: dataclasses.replace(
        b, sum_hidden=np.full_like(b.sum_hidden, np.nan))), "not finite"),
    "counts near 2**63": (lambda h, t: t.update(n_samples=2**62, n_tokens=2**62), "less than 9007199254740992"),
    "a version that overflows on append": (lambda h, t: t.update(version=2**31 - 1), "less than 1073741824"),
    "negative squared norms": (lambda h, t: _state_sq_norms(t, -1.0), "state payload holds invalid values"),
    "a NUL in the model name": (lambda h, t: h["space"].update(model_name="tiny\x00model"), "NUL"),
    "an escape code in the model name": (lambda h, t: h["space"].update(model_name="tiny\x1b[2Jmodel"),
                                         "control characters"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_crafted_export_is_refused_and_nothing_is_stored(case: str, export: list[dict[str, Any]],
                                                           tmp_path: Path, tiny_model_dir: Path) -> None:
    edit, says = REFUSED[case]
    assert export[1]["routing"]["cal_views"] and export[1]["baselines"]  # what the edits change is there
    crafted = _write(_crafted(export, edit), tmp_path / "crafted.jsonl")
    with Atlas(tmp_path / "data", model=str(tiny_model_dir), sketch_dim=256, device="cpu") as atlas:
        with pytest.raises(InvalidInput) as err:
            atlas.import_(crafted)
        assert says in err.value.message, err.value.message
        assert atlas.tasks() == []


def test_the_smallest_rate_is_a_rate_and_routing_goes_on(export: list[dict[str, Any]], tmp_path: Path,
                                                         tiny_model_dir: Path) -> None:
    """5e-324 is a valid rate (it has been since 2026-11-25); its half, the route threshold's rate, underflowed to 0
    and every route of the space answered 500."""
    crafted = _write(_crafted(export, lambda h, t: t["routing"].update(false_reject_rate=5e-324)),
                     tmp_path / "tiny-rate.jsonl")
    with Atlas(tmp_path / "data", model=str(tiny_model_dir), sketch_dim=256, device="cpu") as atlas:
        assert atlas.import_(crafted) == 1
        answer = atlas.route("The quick fox jumps over the dog.")
        assert answer.matches and answer.matches[0].name == "prose"
        atlas.set_false_reject_rate("prose", 5e-324)  # the same rate set directly
        assert atlas.route("The red fox near the river.").matches[0].name == "prose"


def test_novelty_of_mixed_widths_leaves_the_odd_task_out() -> None:
    from atlas.novelty import SpaceNovelty

    rng = np.random.default_rng(0)
    vectors = {1: rng.standard_normal((50, 8)), 2: rng.standard_normal((50, 8)), 3: rng.standard_normal((50, 4))}
    model = SpaceNovelty.fit(vectors)  # raised ValueError: every route of the space answered 500
    assert model is not None
