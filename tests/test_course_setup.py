"""What a course's users run besides the notebooks: the CI workflow, `make help`, the install."""

from __future__ import annotations

import importlib.metadata
import os
import re
import shlex
import subprocess
import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement

ROOT = Path(__file__).parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "notebooks.yml"


def as_a_user_types_it(argv: list[str]) -> str:
    """``argv`` in the repository, as a user types it: without what an enclosing `make test` or
    `.ci/run` passes down (TORCH_INDEX, MAKEFLAGS); its stdout, once it has succeeded."""
    outer = {"TORCH_INDEX", "MAKEFLAGS", "MFLAGS", "MAKELEVEL"}
    env = {k: v for k, v in os.environ.items() if k not in outer}
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


def make(*args: str) -> str:
    return as_a_user_types_it(["make", *args])


def readme_test_command() -> str:
    """The test command of the README's quick start (the line that starts `make test`)."""
    quick_start = ROOT.joinpath("README.md").read_text().split("## Quick start", 1)[1]
    block = quick_start.split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in block.splitlines()]
    [command] = [c for c in commands if c.split()[:2] == ["make", "test"]]
    return command


def test_the_workflow_runs_the_readme_test_command_on_linux_and_macos():
    workflow = yaml.safe_load(WORKFLOW.read_text())
    triggers = workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` as True
    assert {"push", "pull_request"} <= set(triggers)
    command = shlex.split(readme_test_command())
    systems = set()
    for job in workflow["jobs"].values():
        systems.add(job["runs-on"].split("-")[0])
        runs = [shlex.split(step["run"]) for step in job["steps"] if "run" in step]
        assert any(words[: len(command)] == command for words in runs), job
        [python] = [
            step for step in job["steps"] if step.get("uses", "").startswith("actions/setup-python")
        ]
        assert python["with"]["cache"] == "pip"
        keyed_on = python["with"]["cache-dependency-path"].split()
        assert sorted(keyed_on) == ["constraints.txt", "requirements.txt"]
    assert systems == {"ubuntu", "macos"}


def test_ci_runs_the_readme_test_command_without_the_unreachable_index():
    lines = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line[:1] != "#"]
    assert readme_test_command() in lines
    assert "export TORCH_INDEX=" in lines[: lines.index(readme_test_command())]


def test_make_installs_torch_alone_from_the_cpu_index_on_linux_where_it_can_be_reached():
    def install_recipe(*make_args: str) -> list[str]:
        return make("-n", "-B", ".venv/.installed", *make_args).splitlines()

    def pip_calls(lines: list[str]) -> list[list[str]]:
        calls = []
        for line in lines:
            if "-m pip install" in line:
                words = shlex.split(line.replace("then ", "").rstrip("; \\"))
                calls.append(words[words.index("pip") + 2 :])
        return calls

    cpu_index = "https://download.pytorch.org/whl/cpu"
    on_linux = subprocess.check_output(["uname", "-s"]) == b"Linux\n"
    [torch_pin] = [ln for ln in (ROOT / "requirements.txt").read_text().splitlines()
                   if ln.startswith("torch==")]  # fmt: skip
    recipe = install_recipe()
    calls = pip_calls(recipe)
    if on_linux:
        # first torch alone from the CPU index (no dependencies from it), then the rest from PyPI
        assert calls[0] == ["-q", "--index-url", cpu_index, "--no-deps", torch_pin]
    assert calls[-1] == ["-q", "-r", "requirements.txt", "-c", "constraints.txt"]
    # an offline machine would have pip retry the unreachable index for minutes: it is probed
    assert any(f"urlopen('{cpu_index}/'" in line for line in recipe) == on_linux
    assert any("cannot be reached; installing torch without it" in ln for ln in recipe) == on_linux
    assert not any(cpu_index in line for line in install_recipe("TORCH_INDEX="))
    assert pip_calls(install_recipe("TORCH_INDEX=")) == [calls[-1]]


def constraints() -> dict[str, str]:
    """constraints.txt as {normalised name: the line}."""
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    return {
        re.sub(r"[-_.]+", "-", Requirement(line).name).lower(): line
        for line in lines if line.strip() and not line.startswith("#")
    }  # fmt: skip


def requirements() -> list[Requirement]:
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    return [Requirement(ln) for ln in lines if ln.strip() and not ln.startswith(("#", "-"))]


def test_constraints_pin_exact_versions_that_requirements_and_pyproject_accept():
    pins = constraints()
    for line in pins.values():
        [spec] = Requirement(line).specifier
        assert spec.operator == "==" and "*" not in spec.version, line
    # what nbval's comparisons rest on: the numerics, the plots, the notebook machinery
    assert {"numpy", "pandas", "scipy", "matplotlib", "nbval", "nbformat", "nbclient",
            "jupyterlab", "ipykernel", "pytest"} <= set(pins)  # fmt: skip
    # torch's pin is requirements.txt's: its build (2.13.0+cpu or not) differs by platform
    assert "torch" not in pins
    with open(ROOT / "pyproject.toml", "rb") as f:
        declared = [Requirement(d) for d in tomllib.load(f)["project"]["dependencies"]]
    for req in requirements() + declared:
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        if name in pins:
            version = next(iter(Requirement(pins[name]).specifier)).version
            assert req.specifier.contains(version), f"{pins[name]} against {req}"


def test_requirements_and_pyproject_pin_the_package_dependencies_alike():
    with open(ROOT / "pyproject.toml", "rb") as f:
        declared = {Requirement(d).name: Requirement(d).specifier
                    for d in tomllib.load(f)["project"]["dependencies"]}  # fmt: skip
    listed = {req.name: req.specifier for req in requirements()}
    assert {name: listed.get(name) for name in declared} == declared


def test_this_environment_has_the_constrained_versions():
    """nbval compares the committed outputs with what this environment computes: it must be the
    one constraints.txt describes (`make` reinstalls when constraints.txt changes)."""
    wrong = {}
    for name, line in constraints().items():
        try:
            have = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue  # a platform's own dependency, absent on this one
        if not Requirement(line).specifier.contains(have):
            wrong[name] = have
    assert wrong == {}, f"installed versions that constraints.txt does not pin (run make): {wrong}"


def test_make_help_lists_every_target_with_one_line():
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][a-z-]*):", makefile, re.MULTILINE))
    helped = make("-s", "help").splitlines()
    assert sorted(line.split()[1] for line in helped) == sorted(targets)
    assert all(line.startswith("make ") and len(line.split()) > 2 for line in helped)
    phony = set(re.search(r"^\.PHONY: (.*)$", makefile, re.MULTILINE)[1].split())
    assert phony == targets, "every target is phony, and every phony name a target"


def test_the_quick_start_names_the_instructors_guide():
    quick_start = (
        ROOT.joinpath("README.md").read_text().split("## Quick start", 1)[1].split("\n## ")[0]
    )
    assert "COURSE.md" in quick_start and (ROOT / "COURSE.md").is_file()


def test_ci_runs_the_second_pass_on_the_notebooks_the_readme_names_and_the_slow_tests():
    """What CI runs against independent sources: the README's word on which notebooks CI checks a
    second time (and that it runs the slow tests), and, for the full second pass, the notebooks
    that train, read from their code (those that load the HAR data)."""

    def second_pass(target: str) -> list[str]:
        [line] = [ln for ln in make("-n", target).splitlines() if "MKL_CBWR=" in ln]
        return sorted(Path(w).name for w in shlex.split(line) if w.endswith(".ipynb"))

    readme = " ".join(ROOT.joinpath("README.md").read_text().split())
    [said] = re.findall(r"CI runs it on (.*?), whose asserts", readme)
    ci = (ROOT / ".ci" / "run").read_text()
    ci_lines = [ln for ln in ci.splitlines() if ln.startswith("make ")]
    [other] = [ln for ln in ci_lines if ln.startswith("make test-other-processor")]
    assert re.findall(r"notebooks/(\d\d)_", other) == re.findall(r"\b(\d\d)\b", said) != []
    # the line as CI's shell expands it: one pytest command with every notebook it names
    dry = as_a_user_types_it(["bash", "-c", other.replace("make ", "make -n ", 1)])
    [command] = [ln for ln in dry.splitlines() if "--nbval" in ln]
    assert re.findall(r"notebooks/(\d\d)_", command) == re.findall(r"\b(\d\d)\b", said)
    assert "make test-slow" in ci_lines and "`make test-slow`" in readme
    notebooks = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    training = [p.name for p in notebooks if "from helpers.data import" in p.read_text()]
    assert training, "no notebook loads the data: this check would prove nothing"
    assert second_pass("test-other-processor") == training


def test_every_notebook_has_a_session_that_says_what_students_leave_able_to_do():
    """COURSE.md's session table: each notebook in a session's row, whose last column is what the
    students can then do (words, not a timing copied from the table of times below it)."""
    course = ROOT.joinpath("COURSE.md").read_text()
    table = course.split("| session | notebooks |", 1)[1].split("\n\n", 1)[0]
    rows = [[c.strip() for c in ln.strip("|").split("|")] for ln in table.splitlines()[2:]]
    named = sorted(re.findall(r"`(\d\d_\w+)`", " ".join(row[1] for row in rows)))
    notebooks = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert named == notebooks
    for session, _, able in rows:
        assert not re.match(r"\d+ s\b", able), f"{session}: a timing where its outcomes belong"
        assert len(able.split()) >= 12, f"{session}: {able!r}"
