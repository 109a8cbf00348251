"""The shared ``main`` tail of the quality experiments (:func:`bench.quality.common.run_and_report`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from bench.quality import common, report


def _args(tmp_path: Path, **kw: Any) -> argparse.Namespace:
    args = common.make_parser("test", m=8, max_tokens=4, seeds=[1, 2]).parse_args([])
    args.out = tmp_path / "raw.json"
    for k, v in kw.items():
        setattr(args, k, v)
    return args


@pytest.fixture()
def sections(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, str]]:
    calls: list[tuple[str, str, str]] = []
    monkeypatch.setattr(common, "setup", lambda args: None)  # no process-wide thread/seed/env changes in tests
    monkeypatch.setattr(report, "update_section", lambda key, title, body: calls.append((key, title, body)))
    return calls


def _run(args: argparse.Namespace) -> dict[str, Any]:
    return {"value": 3, "lm": None}


def _render(res: dict[str, Any], facts: str) -> str:
    return f"value {res['value']}\n\n{facts}"


@pytest.mark.parametrize(("quick", "no_write", "writes"), [(False, False, True), (True, False, False),
                                                           (False, True, False)])
def test_run_and_report_writes_json_and_section(tmp_path: Path, sections: list[tuple[str, str, str]],
                                               quick: bool, no_write: bool, writes: bool) -> None:
    args = _args(tmp_path, quick=quick, no_write=no_write)
    common.run_and_report("demo", "9. Demo", args, _run, _render, lambda res: {"m": args.m, "v": res["value"]})
    payload = json.loads(args.out.read_text(encoding="utf-8"))
    assert list(payload) == ["experiment", "command", "machine", "runtime_s", "args", "value"]
    assert payload["experiment"] == "demo" and payload["value"] == 3 and "model" not in payload["machine"]
    assert [s[:2] for s in sections] == ([("demo", "9. Demo")] if writes else [])
    if writes:
        body = sections[0][2]
        assert body.startswith("value 3\n\n- Command: ")
        assert "- Seeds: 1, 2\n" in body and "- Settings: m=8, v=3\n" in body


def test_run_and_report_seeds_and_without_args(tmp_path: Path, sections: list[tuple[str, str, str]]) -> None:
    args = _args(tmp_path)
    common.run_and_report("demo", "9. Demo", args, _run, _render, lambda res: {},
                          seeds=lambda res: [f"run {res['value']}"], with_args=False)
    assert list(json.loads(args.out.read_text(encoding="utf-8"))) == ["experiment", "command", "machine",
                                                                       "runtime_s", "value"]
    assert "- Seeds: run 3\n" in sections[0][2]
    common.run_and_report("demo", "9. Demo", args, _run, _render, lambda res: {}, seeds=["a", "b"])
    assert "- Seeds: a, b\n" in sections[1][2]
