"""The routing page's ``fit`` card, in Debian's headless Chromium against a real service.

Labelled prompts (the CLI's JSON lines, or CSV / TSV with a header row) are checked in the page line by line,
previewed as a dry run (the same thresholds the API's own dry run gives, nothing stored) and then stored as
overrides; the API's errors (an unknown label) are shown as messages.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.service.dashboard_helpers import CHROMIUM, shot
from tests.service.test_dashboard_edges_browser import CODE, PROSE, _add, page  # noqa: F401  (fixtures)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium"),
]

# Prose of another wording, labelled "none": the prose task answers them, so fit has wrong answers to raise over.
NOT_A_TASK = [f"A slow green turtle number {i} walks under the bright moon by the quiet lake." for i in range(8)]


def _examples() -> list[dict[str, Any]]:
    own = [{"prompt": f"The quick brown fox number {i} jumps over the lazy dog near the river.", "label": "prose"}
           for i in range(20, 26)]
    own += [{"prompt": f"def g{i}(x, y):\n    return x * {i} - y\n", "label": "code"} for i in range(6)]
    return own + [{"prompt": p, "label": "none"} for p in NOT_A_TASK]


def _fill(pg: Any, text: str) -> None:
    pg.locator("[data-testid=fit-examples]").fill(text)


def test_fit_card_previews_then_stores_the_thresholds_the_api_computes(serve: Any, tiny_lm: Any, page: Any,  # noqa: F811
                                                                       tmp_path: Path) -> None:
    svc = serve(lm=tiny_lm)
    examples = _examples()
    with httpx.Client(base_url=svc.url, timeout=120) as http:
        ids = {"prose": _add(http, "prose", PROSE), "code": _add(http, "code", CODE)}
        r = http.post("/v1/route/fit", json={"examples": examples, "dry_run": True})
        assert r.status_code == 200, r.text
        expected = r.json()
        assert expected["thresholds"], expected  # the labelled prompts move a threshold: the card has rows to show
        before = {name: http.get(f"/v1/tasks/{i}/routing").json() for name, i in ids.items()}

        page.goto(f"{svc.url}/dashboard/#/route")
        card = page.locator("[data-testid=fit-card]")
        card.wait_for()
        # a line that is not a labelled prompt is named, and nothing is sent
        _fill(page, json.dumps(examples[0]) + "\n\n" + '{"prompt": "x"}')
        card.locator("[data-testid=fit-preview]").click()
        error = card.locator("[data-testid=error]")
        error.wait_for()
        assert "line 3" in error.inner_text(), error.inner_text()

        labelled = tmp_path / "labelled.jsonl"  # read from a file, as the CLI's fit does
        labelled.write_text("\n".join(json.dumps(e) for e in examples) + "\n", encoding="utf-8")
        card.locator("[data-testid=fit-file]").set_input_files(str(labelled))
        card.get_by_text(f"Read labelled.jsonl: {len(examples)} labelled prompts.").wait_for()
        assert page.locator("[data-testid=fit-examples]").input_value() == labelled.read_text(encoding="utf-8")
        card.locator("[data-testid=fit-preview]").click()
        summary = card.locator("[data-testid=fit-summary][data-stored=false]")
        summary.wait_for()
        shown = {row.get_attribute("data-task"): float(row.get_attribute("data-threshold") or "nan")
                 for row in card.locator("[data-testid=fit-threshold]").all()}
        assert shown == pytest.approx(expected["thresholds"], abs=1e-9)
        # beside each: the threshold its prompts were held to, here each task's calibrated one (no novelty test:
        # tasks of 12 samples) — what GET .../routing says
        assert set(expected["previous"]) == set(expected["thresholds"])
        for row in card.locator("[data-testid=fit-threshold]").all():
            name = row.get_attribute("data-task") or ""
            was = float(row.get_attribute("data-before") or "nan")
            assert was == pytest.approx(expected["previous"][name], abs=1e-9)
            assert expected["previous"][name] == pytest.approx(before[name]["threshold"], abs=1e-12)
        accuracy = card.locator("[data-testid=fit-accuracy]").inner_text()
        assert f"{expected['accuracy_before']:.3f} → {expected['accuracy_after']:.3f}" in accuracy, accuracy
        n = len(examples)  # and as counts of the prompts
        right = f"({round(expected['accuracy_before'] * n)} → {round(expected['accuracy_after'] * n)} of {n} right)"
        assert right in accuracy, accuracy
        assert {name: http.get(f"/v1/tasks/{i}/routing").json() for name, i in ids.items()} == before  # dry run

        card.locator("[data-testid=fit-apply]").click()
        card.locator("[data-testid=fit-summary][data-stored=true]").wait_for()
        shot(page, "route-fit")
        for name, thr in expected["thresholds"].items():
            got = http.get(f"/v1/tasks/{ids[name]}/routing").json()
            assert got["source"] == "override" and got["threshold"] == pytest.approx(thr, abs=1e-9), got
        for name in set(ids) - set(expected["thresholds"]):
            assert http.get(f"/v1/tasks/{ids[name]}/routing").json() == before[name]

        # the API's own refusals reach the card as messages: a label naming no task of the space is a 404
        _fill(page, json.dumps({"prompt": "hello there", "label": "no-such-task"}))
        card.locator("[data-testid=fit-preview]").click()
        error.wait_for()
        assert "no-such-task" in error.inner_text(), error.inner_text()
        # a file too large to be read into the page is refused before it is read (the text stays as it was)
        card.locator("[data-testid=fit-file]").set_input_files(
            {"name": "huge.jsonl", "mimeType": "application/json", "buffer": b" " * ((32 << 20) + 1)})
        card.get_by_text("huge.jsonl is 32 MiB").wait_for()
        assert "no-such-task" in page.locator("[data-testid=fit-examples]").input_value()
        # the API names a refused example by its index from 0 among the examples; the card names its line, as its
        # own checks do ("example 1" was the second example, on line 4 here)
        _fill(page, "\n" + json.dumps(examples[0]) + "\n\n" + json.dumps({"prompt": "a", "label": "none"}))
        card.locator("[data-testid=fit-preview]").click()
        card.locator("[data-testid=error]", has_text="line 4").wait_for()
        assert "example 1" not in error.inner_text(), error.inner_text()

        # CSV and TSV with a header naming prompt and label, as `fisher-atlas fit` reads them (other columns ignored;
        # a quoted prompt holds commas, quotes and line breaks): the card sends the same examples
        again = http.post("/v1/route/fit", json={"examples": examples, "dry_run": True}).json()
        for name, delimiter in (("labelled.csv", ","), ("labelled.tsv", "\t")):
            table = io.StringIO(newline="")
            writer = csv.writer(table, delimiter=delimiter, lineterminator="\r\n")
            writer.writerow([" Label", "note", "PROMPT"])
            writer.writerows([[e["label"], 'say "hi", then', e["prompt"]] for e in examples])
            (tmp_path / name).write_text("\ufeff" + table.getvalue(), encoding="utf-8", newline="")
            card.locator("[data-testid=fit-file]").set_input_files(str(tmp_path / name))
            # prompts, not lines: the header and a quoted prompt's line breaks are no prompts (it said "19 lines")
            card.get_by_text(f"Read {name}: {len(examples)} labelled prompts.").wait_for()
            card.locator("[data-testid=fit-preview]").click()
            card.locator("[data-testid=fit-summary][data-stored=false]").wait_for()
            shown = {row.get_attribute("data-task"): float(row.get_attribute("data-threshold") or "nan")
                     for row in card.locator("[data-testid=fit-threshold]").all()}
            assert shown == pytest.approx(again["thresholds"], abs=1e-9), name
            accuracy = card.locator("[data-testid=fit-accuracy]").inner_text()
            assert f"{again['accuracy_before']:.3f} → {again['accuracy_after']:.3f}" in accuracy, (name, accuracy)
        # a malformed row is named by its line, and nothing is sent; as `fisher-atlas fit` (a data-integrity review,
        # 2026-12-07): a repeated column (its last was read) and a row wider than the header (an unquoted comma cut
        # the prompt there) are refused
        sent: list[str] = []
        page.on("request", lambda req: sent.append(req.url) if req.url.endswith("/route/fit") else None)
        for text, line in (('prompt,label\n"an open quote, prose\n\nmore', "line 2"),
                           ('prompt,label\nfine,prose\n"a"b,prose\n', "line 3"),
                           ("prompt,label\n\nhello,\n", "line 3"), ("text,name\nhello,prose\n", "line 1"),
                           ("prompt,label,label\nhello there,x,prose\n", "line 1"),
                           ("prompt,label\nfine,prose\nthe fox, the dog,prose\n", "line 3"),
                           # a repeated key (JSON.parse kept the last) and an id written 1.0, refused as by the CLI
                           ('{"prompt": "a, b", "label": "none"}\n{"prompt": "x y", "label": "none", "label": "prose"}',
                            'line 2: key "label" is given more than once'),
                           ('{"prompt": "a fox", "label": 1.0}', "line 1: expected a JSON object")):
            _fill(page, text)
            card.locator("[data-testid=fit-preview]").click()
            card.locator("[data-testid=error]", has_text=line).wait_for()
        assert sent == [], sent
