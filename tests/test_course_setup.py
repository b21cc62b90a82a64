"""What a course's users run besides the notebooks: the CI workflow, `make help`, the install."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "notebooks.yml"


def make(*args: str) -> str:
    """`make` in the repository, as a user types it: without what an enclosing `make test` or
    `.ci/run` passes down (TORCH_INDEX, MAKEFLAGS)."""
    outer = {"TORCH_INDEX", "MAKEFLAGS", "MFLAGS", "MAKELEVEL"}
    env = {k: v for k, v in os.environ.items() if k not in outer}
    done = subprocess.run(["make", *args], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


def readme_test_command() -> str:
    """The test command of the README's quick start (the line that starts `make test`)."""
    quick_start = ROOT.joinpath("README.md").read_text().split("## Quick start", 1)[1]
    block = quick_start.split("```bash\n", 1)[1].split("```", 1)[0]
    [command] = [line.split("#")[0].strip() for line in block.splitlines() if "make test" in line]
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
        assert python["with"]["cache-dependency-path"] == "requirements.txt"
    assert systems == {"ubuntu", "macos"}


def test_ci_runs_the_readme_test_command_without_the_unreachable_index():
    lines = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line[:1] != "#"]
    assert readme_test_command() in lines
    assert "export TORCH_INDEX=" in lines[: lines.index(readme_test_command())]


def test_make_installs_torch_from_the_cpu_index_on_linux_where_it_can_be_reached():
    def install_recipe(*make_args: str) -> str:
        return make("-n", "-B", ".venv/.installed", *make_args)

    cpu_index = "https://download.pytorch.org/whl/cpu"
    on_linux = subprocess.check_output(["uname", "-s"]) == b"Linux\n"
    recipe = install_recipe()
    assert (f'index="--extra-index-url {cpu_index}"' in recipe) == on_linux
    # an offline machine would have pip retry the unreachable index for minutes: it is probed
    assert (f"urlopen('{cpu_index}/'" in recipe) == on_linux
    assert "cannot be reached; installing torch without it" in recipe
    assert cpu_index not in install_recipe("TORCH_INDEX=")


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


def test_make_test_checks_03_on_the_other_processor_and_the_full_pass_all_that_train():
    """What ``make -n`` runs, against independent sources: the README's word on which notebook
    ``make test`` checks a second time, and the notebooks that train, read from their code
    (those that load the HAR data)."""

    def second_pass(target: str) -> list[str]:
        [line] = [ln for ln in make("-n", target).splitlines() if "MKL_CBWR=" in ln]
        return sorted(Path(w).name for w in shlex.split(line) if w.endswith(".ipynb"))

    readme = " ".join(ROOT.joinpath("README.md").read_text().split())
    said = re.findall(r"checks notebook (\d\d) a second time on a simulated other", readme)
    assert said and [n[:2] for n in second_pass("test")] == said
    notebooks = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    training = [p.name for p in notebooks if "from helpers.data import" in p.read_text()]
    assert training, "no notebook loads the data: this check would prove nothing"
    assert second_pass("test-other-processor") == training
