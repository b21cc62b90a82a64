"""Tests for helpers.data: download verification, the binary cache, the stand-in, the choice.

No test touches the network: an autouse fixture lets only file:// URLs through, and HAR_ROOT
points at a temporary folder so the repository's har/ is never read or written. The same fixture
hides the HAPT recordings package, so that "auto" falls back to the stand-in here as where the
package is missing; tests/test_recordings.py tests the recordings.
"""

from __future__ import annotations

import ast
import fcntl
import http.client
import importlib.util
import io
import os
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import numpy as np
import pytest
from unprivileged import finish, unprivileged

import helpers.data as hd
from helpers.data import (
    ACTIVITIES,
    FILES,
    SOURCES,
    STANDIN_BANNER,
    TEST_SUBJECTS,
    TRAIN_SUBJECTS,
    UCI_URL,
    HARDataError,
    HARSpec,
    download_har,
    extract_and_verify,
    hapt_pickle,
    load_har,
    make_standin,
    resolve_root,
    resolve_source,
    uci_fetch,
    uci_verify,
)
from helpers.data import files as files_module
from helpers.data import har as har_module
from helpers.data import standin as standin_module
from helpers.data import uci as uci_module

# A tiny UCI HAR: 7 training windows and 6 test windows of 3 features.
TINY = HARSpec(
    n_features=3,
    train_counts=(2, 1, 1, 1, 1, 1),
    test_counts=(1, 1, 1, 1, 1, 1),
    train_first_row=(0.28858451, -0.020294171),
    test_first_row=(0.25717778,),
)


REAL_OPEN = uci_fetch._open  # before the autouse fixture takes the network away

# ----------------------------------------------------------------------------- helpers


def uci_number(v: float) -> str:
    """Write a number as the UCI files do: 2.8858451e-001."""
    mantissa, exponent = f"{v:.7e}".split("e")
    return f"{mantissa}e{exponent[0]}{int(exponent[1:]):03d}"


def table(values: np.ndarray, fmt: str = "%.8e") -> bytes:
    buf = io.BytesIO()
    np.savetxt(buf, values, fmt=fmt)
    return buf.getvalue()


def har_files(spec: HARSpec = TINY, seed: int = 0) -> dict[str, bytes]:
    """The eight text files of a data set that meets spec, in the UCI layout and number format."""
    rng = np.random.default_rng(seed)
    files = {}
    for split, subjects in (("train", (1, 3)), ("test", (2, 4))):
        counts = spec.counts(split)
        X = rng.uniform(-1, 1, size=(sum(counts), spec.n_features))
        X[0, : len(spec.first_row(split))] = spec.first_row(split)
        lines = ("  " + " ".join(uci_number(v) for v in row) + "\n" for row in X)
        files[f"{split}/X_{split}.txt"] = "".join(lines).encode()
        files[f"{split}/y_{split}.txt"] = table(np.repeat(np.arange(1, 7), counts), "%d")
        half = sum(counts) // 2
        subject = np.repeat(subjects, (half, sum(counts) - half))
        files[f"{split}/subject_{split}.txt"] = table(subject, "%d")
    names = "".join(f"{i} feature-{i}\n" for i in range(1, spec.n_features + 1))
    files["features.txt"] = names.encode()
    labels = "".join(f"{i} {name}\n" for i, name in enumerate(ACTIVITIES, 1))
    files["activity_labels.txt"] = labels.encode()
    return files


def in_folder(files: dict[str, bytes], prefix: str = "UCI HAR Dataset/") -> dict[str, bytes]:
    return {prefix + rel: data for rel, data in files.items()}


def write_zip(path: Path, members: dict[str, bytes], method: int = zipfile.ZIP_DEFLATED) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", method, compresslevel=1) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def flat_zip(path: Path, files: dict[str, bytes], prefix: str = "UCI HAR Dataset/") -> Path:
    members = in_folder(files, prefix)
    members[prefix + "README.txt"] = b"Human Activity Recognition Using Smartphones Dataset\n"
    return write_zip(path, members)


def nested_zip(path: Path, files: dict[str, bytes]) -> Path:
    """Shaped like the UCI download: an outer zip holding "UCI HAR Dataset.zip" and Mac junk."""
    inner = flat_zip(path.with_suffix(".inner.zip"), files).read_bytes()
    members = {"UCI HAR Dataset.zip": inner, "__MACOSX/._UCI HAR Dataset.zip": b"\0junk"}
    return write_zip(path, members, zipfile.ZIP_STORED)


def is_lock(path: Path) -> bool:
    """The data sources' lock files: empty, kept on purpose (see helpers.data.files.locked)."""
    return path.name.startswith(".") and path.name.endswith(".lock") and not path.stat().st_size


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under folder with its bytes, lock files aside: compare two to prove nothing
    changed."""
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in folder.rglob("*")
        if p.is_file() and not is_lock(p)
    }


def contents(folder: Path) -> list[Path]:
    """What folder holds, lock files aside."""
    return [p for p in folder.iterdir() if not is_lock(p)]


def leftovers(folder: Path) -> list[Path]:
    """Temporary downloads, staging folders and half-written files."""
    return [
        p
        for p in folder.rglob("*")
        if p.name.startswith((".download-", ".staging-", ".nested")) or p.name.endswith(".tmp")
    ]


def install(root: Path, files: dict[str, bytes]) -> None:
    """Put text files into root by hand, as a user unzipping the archive would."""
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    """No network (file:// URLs only), no HAR_DATA, and a throwaway default root."""
    monkeypatch.delenv("HAR_DATA", raising=False)
    monkeypatch.setenv("HAR_ROOT", str(tmp_path / "default-har"))
    real_open = uci_fetch._open

    def offline(url, timeout):
        if not url.startswith("file:"):
            raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")
        return real_open(url, timeout)

    monkeypatch.setattr(uci_fetch, "_open", offline)
    monkeypatch.setattr(hapt_pickle, "MODULE", "no_such_module_hidden_by_the_tests")
    monkeypatch.setattr(hapt_pickle, "PACKAGE", "no-such-package-hidden-by-the-tests")
    har_module._noticed.clear()
    uci_module._download_failed.clear()


@pytest.fixture
def no_network(monkeypatch):
    """Fail the test if anything tries to open any URL at all."""

    def refuse(url, *args, **kwargs):
        raise AssertionError(f"unexpected network access: {url}")

    monkeypatch.setattr(uci_fetch, "_open", refuse)


@pytest.fixture(scope="session")
def standin() -> hd.HARData:
    return make_standin()


@pytest.fixture(scope="session")
def full_archive(tmp_path_factory, standin) -> Path:
    """A full-size archive shaped like the UCI download, written from the stand-in's arrays with
    the first rows patched to the real ones, so that it meets the real HARSpec."""
    spec = HARSpec()
    files = {}
    for split in hd.SPLITS:
        X = getattr(standin, f"X_{split}").astype(np.float64)
        X[0, : len(spec.first_row(split))] = spec.first_row(split)
        files[f"{split}/X_{split}.txt"] = table(X)
        files[f"{split}/y_{split}.txt"] = table(getattr(standin, f"y_{split}") + 1, "%d")
        files[f"{split}/subject_{split}.txt"] = table(getattr(standin, f"subject_{split}"), "%d")
    files["features.txt"] = "".join(f"{i} feature-{i}\n" for i in range(1, 562)).encode()
    files["activity_labels.txt"] = har_files()["activity_labels.txt"]
    return nested_zip(tmp_path_factory.mktemp("full") / "uci-har.zip", files)


# ----------------------------------------------------------------------------- good archives


@pytest.mark.parametrize("prefix", ["UCI HAR Dataset/", ""], ids=["dataset-folder", "zip-root"])
def test_flat_archive_is_extracted_in_the_uci_layout(tmp_path, prefix):
    files = har_files()
    archive = flat_zip(tmp_path / "archives" / "flat.zip", files, prefix)
    root = tmp_path / "har"
    extract_and_verify(archive, root, TINY)
    for rel, data in files.items():
        assert (root / rel).read_bytes() == data
    assert np.loadtxt(root / "train" / "X_train.txt").shape == (7, 3)
    assert not (root / "README.txt").exists()  # only the eight files we need are kept
    assert leftovers(root) == []


def test_nested_archive_downloads_verifies_and_loads(tmp_path, capsys):
    archive = nested_zip(tmp_path / "archives" / "uci.zip", har_files())
    root = tmp_path / "har"
    assert download_har(root, url=archive.as_uri(), spec=TINY) == root
    assert "downloading UCI HAR: 100%" in capsys.readouterr().err
    assert sorted(snapshot(root)) == sorted(
        [*FILES, *(f"cache/uci-{name}.npy" for name in hd.ARRAYS), "cache/uci.json"]
    )
    data = load_har("uci", root, spec=TINY)
    assert data.source == "uci"
    assert data.banner == f"data: UCI HAR (verified, {root}/)"
    assert data.X_train.dtype == np.float32 and data.X_train.shape == (7, 3)
    np.testing.assert_allclose(data.X_train[0, :2], TINY.train_first_row, atol=1e-7)
    np.testing.assert_array_equal(data.y_train, [0, 0, 1, 2, 3, 4, 5])  # 0-based
    np.testing.assert_array_equal(data.y_test, np.arange(6))
    np.testing.assert_array_equal(data.subject_test, [2, 2, 2, 4, 4, 4])


def test_banner_names_har_for_the_default_root(tmp_path, monkeypatch):
    root = tmp_path / "har"
    extract_and_verify(flat_zip(tmp_path / "a.zip", har_files()), root, TINY)
    monkeypatch.setattr(har_module, "DEFAULT_ROOT", root.resolve())
    assert load_har("uci", root, spec=TINY).banner == "data: UCI HAR (verified, har/)"


@pytest.mark.slow
def test_full_size_archive_meets_the_real_spec(tmp_path, full_archive, standin, monkeypatch):
    root = tmp_path / "har"
    download_har(root, url=full_archive.as_uri(), progress=False)  # the real HARSpec
    assert np.loadtxt(root / "test" / "y_test.txt").shape == (2947,)
    monkeypatch.setattr(uci_verify, "_parse", None)  # from now on, parsing text would fail
    data = load_har("uci", root)  # so this is the binary cache, written at download time
    assert data.source == "uci" and data.X_train.shape == (7352, 561)
    np.testing.assert_allclose(data.X_train[0, :6], HARSpec().train_first_row, atol=1e-6)
    np.testing.assert_array_equal(data.X_train[1:], standin.X_train[1:])  # '%.8e' round-trips
    np.testing.assert_array_equal(data.y_test, standin.y_test)
    np.testing.assert_array_equal(data.subject_train, standin.subject_train)


# ----------------------------------------------------------------------------- bad archives


def corrupt_crc(path: Path) -> None:
    """Flip one byte inside a stored member, so only its CRC check can notice."""
    raw = bytearray(path.read_bytes())
    at = raw.index(b"e-001")
    raw[at] ^= 0x01
    path.write_bytes(bytes(raw))


def make_bad(kind: str, folder: Path) -> tuple[Path, str]:
    """An archive that must be refused, and a phrase the error must contain."""
    files = har_files()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{kind}.zip"
    if kind == "not-a-zip":
        path.write_bytes(b"<html>Service Unavailable</html>")
        return path, "not a readable zip"
    if kind == "truncated":
        full = flat_zip(path, files).read_bytes()
        path.write_bytes(full[: len(full) // 2])
        return path, "not a readable zip"
    if kind == "bad-crc":
        write_zip(path, in_folder(files), zipfile.ZIP_STORED)
        corrupt_crc(path)
        return path, "not a readable zip"
    if kind == "wrong-shape":
        files["train/X_train.txt"] = table(np.zeros((7, 2)))
        return flat_zip(path, files), "row 1 has 2 values, expected 7 rows of 3"
    if kind == "ragged-rows":  # 21 values in 7 rows, as a 7 x 3 table has, but not 3 a row
        rows = files["train/X_train.txt"].splitlines(keepends=True)
        first, second = rows[0].split(), rows[1].split()
        rows[:2] = [b" ".join([*first, second[0]]) + b"\n", b" ".join(second[1:]) + b"\n"]
        files["train/X_train.txt"] = b"".join(rows)
        return flat_zip(path, files), "row 1 has 4 values, expected 7 rows of 3"
    if kind == "bad-subject":
        files["test/subject_test.txt"] = b"2\n2\n2\n4\n4\n31\n"
        return flat_zip(path, files), "subject ids outside 1..30"
    if kind == "bad-label":
        files["test/y_test.txt"] = b"0\n2\n3\n4\n5\n6\n"
        return flat_zip(path, files), "labels outside 1..6"
    if kind == "wrong-first-row":
        X = np.loadtxt(io.BytesIO(files["test/X_test.txt"]))
        X[0, 0] = 0.25717978  # off by 2e-6
        files["test/X_test.txt"] = table(X)
        return flat_zip(path, files), "first row starts 0.25717978"
    if kind == "wrong-counts":
        files["train/y_train.txt"] = b"1\n2\n2\n3\n4\n5\n6\n"
        return flat_zip(path, files), "class counts (1, 2, 1, 1, 1, 1)"
    if kind == "out-of-range":
        X = np.loadtxt(io.BytesIO(files["train/X_train.txt"]))
        X[3, 2] = 1.5
        files["train/X_train.txt"] = table(X)
        return flat_zip(path, files), "outside [-1, 1]"
    if kind == "missing-file":
        del files["test/subject_test.txt"]
        return flat_zip(path, files), "lacks test/subject_test.txt"
    if kind == "unsupported-method":  # zipfile raises NotImplementedError on reading it
        raw = bytearray(write_zip(path, in_folder(files), zipfile.ZIP_STORED).read_bytes())
        for signature, at in ((b"PK\x03\x04", 8), (b"PK\x01\x02", 10)):  # local, central
            i = raw.index(signature)
            raw[i + at : i + at + 2] = (99).to_bytes(2, "little")
        path.write_bytes(bytes(raw))
        return path, "not a readable zip"
    if kind == "no-data":
        return write_zip(path, {"README.txt": b"hello"}), "holds no UCI HAR data"
    if kind == "escape-dotdot":
        members = in_folder(files)
        members["UCI HAR Dataset/../../escaped.txt"] = b"gotcha"
        return write_zip(path, members), "'UCI HAR Dataset/../../escaped.txt'"
    if kind == "escape-absolute":
        members = in_folder(files)
        target = f"{folder.parent}/escaped.txt"  # absolute, yet inside the test's tmp_path
        members[target] = b"gotcha"
        return write_zip(path, members), repr(target)
    if kind == "escape-nested":
        inner = in_folder(files)
        inner["../escaped.txt"] = b"gotcha"
        inner_zip = write_zip(folder / "inner.zip", inner).read_bytes()
        return write_zip(path, {"UCI HAR Dataset.zip": inner_zip}), "'../escaped.txt'"
    raise ValueError(kind)


BAD = [
    "not-a-zip",
    "truncated",
    "bad-crc",
    "unsupported-method",
    "wrong-shape",
    "ragged-rows",
    "bad-subject",
    "bad-label",
    "wrong-first-row",
    "wrong-counts",
    "out-of-range",
    "missing-file",
    "no-data",
    "escape-dotdot",
    "escape-absolute",
    "escape-nested",
]


@pytest.mark.parametrize("kind", BAD)
def test_bad_archive_is_refused_and_leaves_no_trace(tmp_path, kind):
    archive, phrase = make_bad(kind, tmp_path / "archives")
    root = tmp_path / "sandbox" / "har"
    root.mkdir(parents=True)
    (root / "notes.txt").write_text("the user's own file")
    before, around = snapshot(root), snapshot(tmp_path)
    with pytest.raises(HARDataError) as err:
        download_har(root, url=archive.as_uri(), spec=TINY, progress=False)
    message = str(err.value)
    assert phrase in message
    assert "\n" not in message and UCI_URL in message and "HAR_DATA=standin" in message
    assert snapshot(root) == before  # nothing added, nothing changed, no temp files
    assert snapshot(tmp_path) == around  # and nothing landed anywhere else either


def test_first_row_is_compared_with_a_small_tolerance(tmp_path):
    files = har_files()
    X = np.loadtxt(io.BytesIO(files["train/X_train.txt"]))
    X[0, 1] += 5e-7
    files["train/X_train.txt"] = table(X)
    extract_and_verify(flat_zip(tmp_path / "a.zip", files), tmp_path / "har", TINY)
    assert (tmp_path / "har" / "train" / "X_train.txt").read_bytes() == table(X)


@pytest.mark.parametrize("kind", ["escape-dotdot", "escape-absolute", "escape-nested"])
def test_escaping_member_in_extract_and_verify_writes_nothing(tmp_path, kind):
    archive, _ = make_bad(kind, tmp_path / "archives")
    root = tmp_path / "a" / "b" / "har"
    before = snapshot(tmp_path)
    with pytest.raises(HARDataError, match="refusing archive member"):
        extract_and_verify(archive, root, TINY)
    assert contents(root) == []
    assert snapshot(tmp_path) == before  # nothing anywhere under tmp_path, har/ or outside it


def test_the_nothing_written_check_catches_an_escaped_member(tmp_path):
    """The check above can fail: a naive extraction of the same archive is caught by it."""
    archive, _ = make_bad("escape-dotdot", tmp_path / "archives")
    root = tmp_path / "a" / "b" / "har"
    root.mkdir(parents=True)
    before = snapshot(tmp_path)
    with zipfile.ZipFile(archive) as zf:
        name = next(n for n in zf.namelist() if "escaped" in n)
        target = Path(os.path.normpath(root / name))  # what writing the name as given does
        target.write_bytes(zf.read(name))
    assert not target.is_relative_to(root)  # it landed outside har/ ...
    assert snapshot(tmp_path) != before  # ... and the check sees it


def test_interrupted_download_removes_its_temporary_file(tmp_path, monkeypatch):
    class Response(io.BytesIO):
        headers = {"Content-Length": "3000000"}

        def read(self, size=-1):
            if self.tell():
                raise KeyboardInterrupt
            return super().read(size)

    monkeypatch.setattr(uci_fetch, "_open", lambda url, timeout: Response(b"x" * 3_000_000))
    root = tmp_path / "har"
    with pytest.raises(KeyboardInterrupt):
        download_har(root, spec=TINY, progress=False)
    assert contents(root) == []


def test_interrupted_verification_removes_staging(tmp_path, monkeypatch):
    archive = nested_zip(tmp_path / "uci.zip", har_files())
    root = tmp_path / "har"

    def interrupt(folder, spec):
        assert (folder / "train" / "X_train.txt").exists()  # extracted into staging by now
        raise KeyboardInterrupt

    monkeypatch.setattr(uci_fetch, "verify_dir", interrupt)
    with pytest.raises(KeyboardInterrupt):
        download_har(root, url=archive.as_uri(), spec=TINY, progress=False)
    assert contents(root) == []


def test_download_that_stops_short_is_refused(tmp_path, monkeypatch):
    class Response(io.BytesIO):
        headers = {"Content-Length": "1000"}

    monkeypatch.setattr(uci_fetch, "_open", lambda url, timeout: Response(b"PK" * 100))
    root = tmp_path / "har"
    with pytest.raises(HARDataError, match="stopped at 200 of 1000 bytes"):
        download_har(root, spec=TINY, progress=False)
    assert contents(root) == []


def test_a_broken_zip_makes_auto_fall_back_with_a_notice(tmp_path, capsys, monkeypatch):
    archive, _ = make_bad("unsupported-method", tmp_path / "archives")
    monkeypatch.setattr(uci_module, "UCI_URL", archive.as_uri())
    monkeypatch.setattr(uci_fetch, "UCI_URL", archive.as_uri())
    monkeypatch.setattr(uci_module.download_har, "__defaults__", (archive.as_uri(),))
    data = load_har("auto", tmp_path / "har", spec=TINY)
    assert data.source == "standin"
    notices = [line for line in capsys.readouterr().err.splitlines() if "notice" in line]
    assert len(notices) == 1 and "not a readable zip" in notices[0]


def test_a_connection_cut_mid_download_makes_auto_fall_back(tmp_path, capsys, monkeypatch):
    class Response(io.BytesIO):
        headers = {"Content-Length": "3000"}

        def read(self, size=-1):
            raise http.client.IncompleteRead(b"PK", 2998)

    monkeypatch.setattr(uci_fetch, "_open", lambda url, timeout: Response())
    root = tmp_path / "har"
    assert load_har("auto", root, spec=TINY).source == "standin"
    notice = capsys.readouterr().err
    assert notice.count("\n") == 1 and "could not download" in notice and "IncompleteRead" in notice
    assert leftovers(root) == []
    with pytest.raises(HARDataError, match="could not download"):
        load_har("uci", root, spec=TINY)


def test_a_redirect_from_https_to_http_is_refused():
    handler = uci_fetch._RefuseDowngrade()
    request = urllib.request.Request("https://archive.ics.uci.edu/x.zip")
    with pytest.raises(urllib.error.URLError, match="refused a redirect from https"):
        handler.redirect_request(request, None, 302, "Found", {}, "http://evil.example/x.zip")
    followed = handler.redirect_request(request, None, 302, "Found", {}, "https://mirror/x.zip")
    assert followed.full_url == "https://mirror/x.zip"
    assert any(isinstance(h, uci_fetch._RefuseDowngrade) for h in opener_handlers())


def opener_handlers() -> list:
    """The handlers _open really uses, caught as it builds its opener."""
    seen = []
    real = urllib.request.build_opener

    def spy(*handlers):
        opener = real(*handlers)
        seen.extend(opener.handlers)
        raise urllib.error.URLError("stop here")

    urllib.request.build_opener, saved = spy, urllib.request.build_opener
    try:
        with pytest.raises(urllib.error.URLError):
            REAL_OPEN("https://example.invalid/x.zip", 1.0)
    finally:
        urllib.request.build_opener = saved
    return seen


@pytest.mark.parametrize("length", ["5000", None], ids=["declared", "streamed"])
def test_a_download_larger_than_the_cap_is_refused(tmp_path, monkeypatch, length):
    class Response(io.BytesIO):
        headers = {"Content-Length": length} if length else {}

    monkeypatch.setattr(uci_fetch, "MAX_DOWNLOAD_BYTES", 1000)
    monkeypatch.setattr(uci_fetch, "_open", lambda url, timeout: Response(b"PK" * 2500))
    root = tmp_path / "har"
    with pytest.raises(HARDataError, match="1000 bytes allowed"):
        download_har(root, spec=TINY, progress=False)
    assert contents(root) == []


@pytest.mark.parametrize("nested", [False, True], ids=["flat", "nested"])
def test_an_archive_member_larger_than_the_cap_is_refused(tmp_path, monkeypatch, nested):
    make = nested_zip if nested else flat_zip
    archive = make(tmp_path / "archives" / "big.zip", har_files())
    monkeypatch.setattr(uci_fetch, "MAX_MEMBER_BYTES", 300)  # X_train.txt is about 700 bytes
    root = tmp_path / "har"
    with pytest.raises(HARDataError, match="larger than 300 bytes") as err:
        download_har(root, url=archive.as_uri(), spec=TINY, progress=False)
    assert "\n" not in str(err.value)
    assert contents(root) == []


def test_a_killed_runs_leftovers_are_removed_at_the_next_start(tmp_path):
    root = tmp_path / "har"
    install(root, har_files())
    stale = [root / ".download-k1ll3d.tmp", root / ".staging-k1ll3d" / "train" / "X_train.txt"]
    stale += [root / "cache" / ".uci-X_train.npy.123.abcdef12.tmp"]
    stale += [root / "cache" / ".standin-0123456789abcdef.npz.123.abcdef12.tmp"]
    for path in stale:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * 1000)
    assert load_har("uci", root, spec=TINY).source == "uci"
    assert load_har("standin", root).source == "standin"
    assert leftovers(root) == []
    assert all((root / rel).is_file() for rel in FILES)  # the data itself is kept


def test_the_cache_key_is_taken_from_the_bytes_parsed(tmp_path, monkeypatch):
    """A file that changes while it is being verified must not leave a cache that vouches for
    the new file with the old file's arrays."""
    root = tmp_path / "har"
    install(root, har_files())
    verify = uci_module.verify_dir

    def verify_then_edit(folder, spec):
        result = verify(folder, spec)
        X = np.loadtxt(root / "train" / "X_train.txt")
        X[5, 1] = -0.5
        (root / "train" / "X_train.txt").write_bytes(table(X))  # written after it was parsed
        return result

    monkeypatch.setattr(uci_module, "verify_dir", verify_then_edit)
    load_har("uci", root, spec=TINY)
    monkeypatch.setattr(uci_module, "verify_dir", verify)
    assert load_har("uci", root, spec=TINY).X_train[5, 1] == np.float32(-0.5)


def test_a_changed_generator_never_gets_the_old_stand_in_cache(tmp_path, monkeypatch, standin):
    root = tmp_path / "har"
    load_har("standin", root)
    real = standin_module.make_standin

    def make_standin(seed: int = 0) -> hd.HARData:  # a new version of the generator
        data = real(seed)
        data.X_train[0, 0] = 0.5
        return data

    monkeypatch.setattr(standin_module, "make_standin", make_standin)
    assert load_har("standin", root).X_train[0, 0] == np.float32(0.5)
    monkeypatch.setattr(standin_module, "make_standin", real)
    assert load_har("standin", root).X_train[0, 0] == standin.X_train[0, 0]


# A process that installs TINY into root with a download that stops half-way through moving the
# files into place, until the test creates the file "go".
HALF_INSTALL = """
import shutil, sys, time
from pathlib import Path
sys.path.insert(0, {tests!r})
import test_data
from helpers.data import FILES, download_har
from helpers.data import uci_fetch as uci

root, archive, signal = Path({root!r}), {archive!r}, Path({signal!r})
move = uci._move_into_place

def half_then_wait(staging, root):
    for rel in FILES[:3]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(staging / rel, root / rel)
    (signal / "half").touch()
    while not (signal / "go").exists():
        time.sleep(0.05)
    move(staging, root)

uci._move_into_place = half_then_wait
download_har(root, url=archive, spec=test_data.TINY, progress=False)
"""

SECOND = """
import sys
sys.path.insert(0, {tests!r})
import test_data
from helpers.data import load_har
print(load_har({source!r}, {root!r}, spec=test_data.TINY).source)
"""


@pytest.mark.slow
@pytest.mark.parametrize("source", ["uci", "auto"])
def test_a_second_process_waits_for_the_first_ones_download(tmp_path, source):
    root, signal = tmp_path / "har", tmp_path / "signal"
    signal.mkdir()
    archive = nested_zip(tmp_path / "uci.zip", har_files()).as_uri()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
    tests = str(Path(__file__).parent)
    code = HALF_INSTALL.format(tests=tests, root=str(root), archive=archive, signal=str(signal))
    first = subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE)
    try:
        while not (signal / "half").exists():  # the first has installed 3 of the 8 files
            assert first.poll() is None, first.stderr.read()
            time.sleep(0.05)
        second = subprocess.Popen(
            [sys.executable, "-c", SECOND.format(tests=tests, source=source, root=str(root))],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        # The second either waits for the lock, saying so, or (without a lock) finishes at once.
        waited = ""
        for line in second.stderr:
            waited += line
            if "waiting for another process" in line:
                break
        (signal / "go").touch()
        out, err = second.communicate(timeout=120)
        assert first.wait(timeout=120) == 0, first.stderr.read()
    finally:
        for proc in (first, locals().get("second")):
            if proc is not None and proc.poll() is None:
                proc.kill()
    assert "waiting for another process" in waited, waited + err
    assert second.returncode == 0 and out.strip() == "uci", err
    assert leftovers(root) == []


# ----------------------------------------------------------------------------- existing files


def test_verified_files_are_kept_and_not_downloaded_again(tmp_path, no_network):
    root = tmp_path / "har"
    install(root, har_files())
    before = {rel: (root / rel).stat().st_mtime_ns for rel in FILES}
    assert download_har(root, url="https://example.invalid/x.zip", spec=TINY) == root
    assert {rel: (root / rel).stat().st_mtime_ns for rel in FILES} == before
    assert load_har("uci", root, spec=TINY).source == "uci"


def test_files_that_do_not_verify_are_reported_never_overwritten(tmp_path, capsys):
    root = tmp_path / "har"
    files = har_files()
    files["train/y_train.txt"] = b"1\n1\n1\n3\n4\n5\n6\n"  # one WALKING_UPSTAIRS relabelled
    install(root, files)
    before = snapshot(root)
    good = nested_zip(tmp_path / "good.zip", har_files())
    with pytest.raises(HARDataError, match="do not verify .*class counts.*delete them") as err:
        download_har(root, url=good.as_uri(), spec=TINY)
    assert "\n" not in str(err.value)
    with pytest.raises(HARDataError, match="do not verify"):
        load_har("uci", root, spec=TINY)
    data = load_har("auto", root, spec=TINY)  # auto falls back, saying why
    assert data.source == "standin"
    notice = capsys.readouterr().err
    assert notice.count("\n") == 1 and "stand-in" in notice and "class counts" in notice
    assert {k: v for k, v in snapshot(root).items() if not k.startswith("cache/")} == before


def test_incomplete_copy_is_reported(tmp_path):
    root = tmp_path / "har"
    files = har_files()
    install(root, {rel: files[rel] for rel in FILES[:3]})
    before = snapshot(root)
    with pytest.raises(HARDataError, match="incomplete UCI HAR copy .*missing test/X_test.txt"):
        load_har("uci", root, spec=TINY)
    assert snapshot(root) == before


def test_extract_never_replaces_a_different_file(tmp_path):
    root = tmp_path / "har"
    install(root, {"features.txt": b"my own notes\n"})
    with pytest.raises(HARDataError, match="features.txt already exists and differs"):
        extract_and_verify(flat_zip(tmp_path / "a.zip", har_files()), root, TINY)
    assert snapshot(root) == {"features.txt": b"my own notes\n"}


def test_extract_accepts_identical_files_already_in_place(tmp_path):
    """As when two workers download at once: the second finds the first one's files."""
    root = tmp_path / "har"
    files = har_files()
    install(root, {"features.txt": files["features.txt"]})
    extract_and_verify(flat_zip(tmp_path / "a.zip", files), root, TINY)
    assert {rel: (root / rel).read_bytes() for rel in FILES} == files


# ----------------------------------------------------------------------------- offline


def test_offline_uci_is_a_one_line_error_saying_what_to_do(tmp_path):
    root = tmp_path / "har"
    with pytest.raises(HARDataError) as err:
        load_har("uci", root)
    message = str(err.value)
    assert "\n" not in message
    assert "could not download" in message and "name resolution" in message
    assert UCI_URL in message and "HAR_DATA=standin" in message and "--data standin" in message
    assert leftovers(root) == [] and snapshot(root) == {}


def test_offline_auto_falls_back_with_one_notice(tmp_path, capsys, monkeypatch):
    tries = []
    offline = uci_fetch._open

    def counting(url, timeout):
        tries.append(url)
        return offline(url, timeout)

    monkeypatch.setattr(uci_fetch, "_open", counting)
    root = tmp_path / "har"
    first, second = load_har(root=root), load_har(root=root)
    assert first.source == second.source == "standin"
    assert first.banner == STANDIN_BANNER
    err = capsys.readouterr().err
    assert err.count("notice:") == 1 and err.count("\n") == 1
    assert "stand-in" in err and UCI_URL in err
    assert len(tries) == 1  # auto does not wait on a dead network at every load
    with pytest.raises(HARDataError, match="could not download"):
        load_har("uci", root)  # but an explicit "uci" tries again
    assert len(tries) == 2


def test_download_off_never_touches_the_network(tmp_path, no_network):
    root = tmp_path / "har"
    assert load_har("auto", root, download=False).source == "standin"
    with pytest.raises(HARDataError, match="downloading is off"):
        load_har("uci", root, download=False)


def test_standin_is_cached_and_never_touches_the_network(tmp_path, no_network, monkeypatch):
    root = tmp_path / "har"
    key = standin_module.standin_key()
    first = load_har("standin", root)
    assert len(list((root / "cache").glob("standin-*.npz"))) == 1
    # a second load must come from the cache: generating it again would fail
    monkeypatch.setattr(standin_module, "standin_key", lambda: key)
    monkeypatch.setattr(standin_module, "make_standin", None)
    second = load_har("standin", root)
    assert second.source == "standin" and second.banner == STANDIN_BANNER
    for name in hd.ARRAYS:
        np.testing.assert_array_equal(getattr(first, name), getattr(second, name))


# ----------------------------------------------------------------------------- cache


def test_cache_is_used_then_invalidated_when_the_text_changes(tmp_path, monkeypatch):
    root = tmp_path / "har"
    install(root, har_files())
    assert not (root / "cache").exists()
    load_har("uci", root, spec=TINY)  # parses the text and writes the cache
    assert (root / "cache" / "uci.json").is_file()
    assert (root / "cache" / "uci-X_train.npy").is_file()

    calls = []
    parse = uci_verify._parse
    monkeypatch.setattr(uci_verify, "_parse", lambda *a: calls.append(a[1]) or parse(*a))
    load_har("uci", root, spec=TINY)
    assert calls == []  # served from the cache

    X = np.loadtxt(root / "train" / "X_train.txt")
    X[5, 1] = -0.5
    (root / "train" / "X_train.txt").write_bytes(table(X))
    data = load_har("uci", root, spec=TINY)
    assert "train/X_train.txt" in calls  # the text changed, so it was parsed again
    assert data.X_train[5, 1] == np.float32(-0.5)

    calls.clear()
    assert load_har("uci", root, spec=TINY).X_train[5, 1] == np.float32(-0.5)
    assert calls == []  # and the new cache is used again

    os.utime(root / "features.txt", ns=(0, 0))  # same bytes, different mtime: parse again
    load_har("uci", root, spec=TINY)
    assert "train/X_train.txt" in calls


def test_cache_does_not_hide_a_broken_text_file(tmp_path):
    root = tmp_path / "har"
    install(root, har_files())
    load_har("uci", root, spec=TINY)
    (root / "test" / "y_test.txt").write_bytes(b"1\n2\n3\n4\n5\n5\n")
    with pytest.raises(HARDataError, match="y_test.txt has class counts"):
        load_har("uci", root, spec=TINY)


def test_cache_written_under_another_spec_is_not_trusted(tmp_path):
    root = tmp_path / "har"
    install(root, har_files())
    load_har("uci", root, spec=TINY)
    with pytest.raises(HARDataError, match="do not verify"):
        load_har("uci", root)  # the real spec: 7 rows are not 7352


# ----------------------------------------------------------------------------- stand-in


def blocks(subject: np.ndarray) -> tuple[tuple[int, int], ...]:
    """Run-length encoding: ((subject, windows), ...) in file order."""
    starts = np.flatnonzero(np.diff(subject, prepend=-1))
    sizes = np.diff(np.append(starts, len(subject)))
    return tuple((int(subject[s]), int(n)) for s, n in zip(starts, sizes, strict=True))


def test_standin_is_har_shaped(standin):
    spec = HARSpec()
    assert standin.source == "standin" and standin.banner == STANDIN_BANNER
    for split, n in (("train", 7352), ("test", 2947)):
        X, y = getattr(standin, f"X_{split}"), getattr(standin, f"y_{split}")
        subject = getattr(standin, f"subject_{split}")
        assert X.shape == (n, 561) and X.dtype == np.float32
        assert y.shape == subject.shape == (n,) and y.dtype == subject.dtype == np.int64
        assert X.min() >= -1 and X.max() <= 1
        assert (X < -0.9).mean() > 0.2  # many features near -1, as in UCI HAR
        assert tuple(np.bincount(y, minlength=6)) == spec.counts(split)
    assert blocks(standin.subject_train) == TRAIN_SUBJECTS
    assert blocks(standin.subject_test) == TEST_SUBJECTS
    assert {1, 3, 30} <= set(standin.subject_train.tolist())
    assert not set(standin.subject_train.tolist()) & set(standin.subject_test.tolist())


def test_standin_labels_come_in_runs(standin):
    changes = np.count_nonzero(np.diff(standin.y_train))
    assert changes < 12 * len(TRAIN_SUBJECTS)  # at most two passes through six activities
    assert np.all(standin.y_train[:10] == standin.y_train[0])


def test_standin_is_deterministic(standin):
    again = make_standin()
    for name in hd.ARRAYS:
        np.testing.assert_array_equal(getattr(again, name), getattr(standin, name))
    assert not np.array_equal(make_standin(seed=1).X_train, standin.X_train)


# ----------------------------------------------------------------------------- the choice


def test_resolve_source_precedence(monkeypatch):
    assert resolve_source() == "auto"
    monkeypatch.setenv("HAR_DATA", "standin")
    assert resolve_source() == "standin"
    assert resolve_source("uci") == "uci"  # the argument wins over the environment
    monkeypatch.setenv("HAR_DATA", " UCI ")
    assert resolve_source() == "uci"
    monkeypatch.setenv("HAR_DATA", "")
    assert resolve_source() == "auto"


@pytest.mark.parametrize(
    ("argument", "env", "origin"), [("real", None, "source"), (None, "x", "HAR_DATA")]
)
def test_resolve_source_rejects_invalid_values(monkeypatch, argument, env, origin):
    if env is not None:
        monkeypatch.setenv("HAR_DATA", env)
    with pytest.raises(ValueError) as err:
        resolve_source(argument)
    message = str(err.value)
    assert message.startswith(origin) and "\n" not in message
    assert all(source in message for source in SOURCES)


def test_env_choice_reaches_load_har(tmp_path, monkeypatch, no_network):
    monkeypatch.setenv("HAR_DATA", "standin")
    assert load_har(root=tmp_path / "har").source == "standin"
    monkeypatch.setenv("HAR_DATA", "bogus")
    with pytest.raises(ValueError, match="HAR_DATA='bogus'"):
        load_har(root=tmp_path / "har")


def test_resolve_root_precedence(tmp_path, monkeypatch):
    assert resolve_root(tmp_path / "x") == tmp_path / "x"
    assert resolve_root() == tmp_path / "default-har"  # HAR_ROOT, set by the autouse fixture
    monkeypatch.delenv("HAR_ROOT")
    assert resolve_root() == hd.DEFAULT_ROOT
    assert (hd.DEFAULT_ROOT.parent / "helpers" / "data" / "__init__.py").is_file()


# ----------------------------------------------------------------------------- the code itself


def test_every_module_level_name_of_the_data_layer_is_bound_once_and_used():
    """A second binding of a module's name (two ``_noticed`` sets: which one does notice() use?)
    or a private name nothing reads (a stray ``_download_failed``) is a duplicate to remove."""
    for path in sorted(Path(hd.__file__).parent.glob("*.py")):
        tree = ast.parse(path.read_text())
        bound = []
        for node in tree.body:
            if isinstance(node, ast.Assign):
                bound += [t.id for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                bound.append(node.target.id)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bound.append(node.name)
        twice = sorted({name for name in bound if bound.count(name) > 1})
        assert not twice, f"{path.name} binds {twice} more than once"
        names = [n for n in ast.walk(tree) if isinstance(n, ast.Name)]
        read = {n.id for n in names if isinstance(n.ctx, ast.Load)}
        unused = [n for n in bound if n[:1] == "_" and n[:2] != "__" and n not in read]
        assert not unused, f"{path.name} defines {unused} and never uses them"



def test_every_function_of_the_data_layer_is_under_ruffs_complexity_limit():
    """McCabe complexity under 10 (ruff's C901), so that each function reads on one screen."""
    if importlib.util.find_spec("ruff") is None:
        pytest.skip("ruff is not installed (pip install -r requirements.txt)")
    done = subprocess.run(
        [
            sys.executable, "-m", "ruff", "check", "--no-cache", "--select", "C901",
            "--config", "lint.mccabe.max-complexity = 9", "--output-format", "concise",
            str(Path(hd.__file__).parent),
        ],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr

# ----------------------------------------------------------------------------- other users' locks

LOCK_AS_ANOTHER_USER = """
from pathlib import Path
from helpers.data.files import locked
with locked(Path({lock!r})) as held:
    print(held, flush=True)
"""


def test_a_lock_file_that_is_read_only_for_this_user_still_locks(tmp_path):
    """Another user's lock file (mode 0644 for them, read-only for us): flock needs no write
    access, so the second user waits for the first instead of running unlocked."""
    lock = tmp_path / ".uci.lock"
    lock.touch()
    lock.chmod(0o444)  # as another user's 0644 file is to us
    tmp_path.chmod(0o555)
    fd = os.open(lock, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # the first process holds the lock
        child = unprivileged(
            LOCK_AS_ANOTHER_USER.format(lock=str(lock)), tmp_path,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        first_line = child.stderr.readline()  # the notice it waits behind, or EOF if it ran
    finally:
        os.close(fd)  # releases the lock
        tmp_path.chmod(0o755)
    out, err = finish(child)
    assert "waiting for another process" in first_line, first_line + err
    assert out.strip() == "True", err


def test_a_new_lock_file_lets_everyone_the_umask_allows_lock_it(tmp_path):
    old = os.umask(0o002)  # a group-shared folder, as on a JupyterHub
    try:
        with files_module.locked(tmp_path / "har" / ".uci.lock") as held:
            assert held
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "har" / ".uci.lock").stat().st_mode) == 0o664


def test_an_error_in_an_unlocked_block_is_not_chained_to_the_lock_failure(tmp_path):
    """Where no lock file can be had, the block runs unlocked, and its errors come alone, not
    "During handling of the above exception (the lock's OSError), another exception occurred"."""
    (tmp_path / "file").write_text("a file, not a folder")
    lock = tmp_path / "file" / "har" / ".x.lock"
    with pytest.raises(KeyError) as err, files_module.locked(lock) as held:
        assert not held
        raise KeyError("in the block")
    assert err.value.__context__ is None and err.value.__cause__ is None


# ----------------------------------------------------------------------------- a read-only root

AUTO_AS_ANOTHER_USER = """
from helpers.data import hapt_pickle, uci_fetch
from helpers.data.source import main
hapt_pickle.MODULE = "no_such_module_hidden_by_the_tests"  # as the autouse fixture does
hapt_pickle.PACKAGE = "no-such-package-hidden-by-the-tests"
def offline(url, timeout):
    raise AssertionError("tried the network")
uci_fetch._open = offline
main(["--data", {source!r}])  # python -m helpers.data --data SOURCE
"""


EXTRACT_AS_ANOTHER_USER = """
from helpers.data import HARDataError, extract_and_verify
try:
    extract_and_verify({archive!r})  # the archive downloaded by hand
except HARDataError as err:
    print("HARDataError:", err)
"""


@pytest.mark.slow
def test_auto_on_a_read_only_root_falls_back_with_one_notice(tmp_path, monkeypatch):
    """A data folder shared read-only (COURSE.md's advice for a JupyterHub): UCI HAR cannot be
    downloaded into it, which is one more reason to fall back, not a PermissionError traceback."""
    root = tmp_path / "shared-har"
    root.mkdir()
    monkeypatch.setenv("HAR_ROOT", str(root))
    archive = nested_zip(tmp_path / "uci.zip", har_files())
    root.chmod(0o555)
    try:
        children = {
            source: unprivileged(
                AUTO_AS_ANOTHER_USER.format(source=source), root,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            for source in ("auto", "uci")
        }
        (out, err), (uci_out, uci_err) = (finish(children[s]) for s in ("auto", "uci"))
        by_hand = unprivileged(
            EXTRACT_AS_ANOTHER_USER.format(archive=str(archive)), root,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        extract_out, extract_err = finish(by_hand)
    finally:
        root.chmod(0o755)
    assert out.startswith(STANDIN_BANNER), err
    assert err.count("\n") == 1 and err.startswith("notice: using the synthetic"), err
    assert f"cannot write into {root}/" in err and "HAR_ROOT" in err
    # asked for by name: the same reason, as a one-line error
    assert uci_out == "" and uci_err.count("\n") == 1, uci_err
    assert uci_err.startswith(f"error: cannot write into {root}/")
    assert extract_out.startswith(f"HARDataError: cannot write into {root}/"), extract_err
    assert list(root.iterdir()) == []
