"""The project skeleton: README commands, CI script, compose file, CLI surface."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

from atlas.settings import Settings
from workers.prompt_remote import STOP_DRAIN_S

ROOT = Path(__file__).resolve().parents[1]


def _readme_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme, flags=re.S)
    return [b.strip() for b in blocks[:2]]


def test_readme_gives_a_run_and_a_test_command() -> None:
    run_cmd, test_cmd = _readme_commands()
    assert "fisher-atlas serve" in run_cmd
    assert "pytest" in test_cmd


def test_ci_runs_exactly_the_readme_test_command() -> None:
    _, test_cmd = _readme_commands()
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert test_cmd in ci_lines


def test_compose_has_the_scale_out_services_with_health_and_ordering() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"api", "worker", "postgres", "redis", "prestart"} <= set(services)
    for name in ("postgres", "redis", "api"):
        assert "healthcheck" in services[name], name
    assert services["api"]["depends_on"]["prestart"]["condition"] == "service_completed_successfully"
    assert services["prestart"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    devices = services["worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"]
    # the images run the same commands as the documented non-docker ones
    assert services["api"]["command"][:2] == ["fisher-atlas", "serve"]
    assert services["worker"]["command"] == ["fisher-atlas", "worker"]
    for dockerfile, command in (("api.Dockerfile", "serve"), ("worker-gpu.Dockerfile", "worker")):
        text = (ROOT / "docker" / dockerfile).read_text()
        assert re.search(rf'CMD \["fisher-atlas", "{command}"', text), dockerfile
    prestart = (ROOT / "docker" / "prestart.sh").read_text()
    assert "fisher-atlas migrate" in prestart
    for service in ("prestart", "api", "worker"):
        env = services[service]["environment"]
        assert env["FISHER_ATLAS_DATABASE_URL"].startswith("postgresql+psycopg://")
    # the api holds no model (prompts and jobs go to the workers) and replicas share no index files
    assert services["api"]["environment"]["FISHER_ATLAS_PROMPT_SERVICE"] == "redis"
    assert services["api"]["environment"]["FISHER_ATLAS_QUEUE"] == "celery"
    assert "volumes" not in services["api"]
    # both exit when the database does not answer at start (an outage review restarted both): compose starts them again
    assert services["api"]["restart"] == services["worker"]["restart"] == "unless-stopped"
    # a stop is a clean stop (a lifecycle review): an init as PID 1, and more time than the service's own bounds
    def seconds(text: str) -> float:
        return float(text.removesuffix("s"))

    assert services["api"]["init"] is services["worker"]["init"] is True
    assert seconds(services["api"]["stop_grace_period"]) > Settings().shutdown_grace_s
    assert seconds(services["worker"]["stop_grace_period"]) > STOP_DRAIN_S + 10


def test_cli_help_lists_every_subcommand() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "service.cli", "--help"], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout
    for command in ("serve", "worker", "add", "append", "route", "recommend", "align", "atlas", "matrix", "export",
                    "import", "tasks", "jobs", "keys", "migrate"):
        assert re.search(rf"^[\s│]+{command}\b", out, flags=re.M), command

