"""UCI HAR's 561 features, recomputed from raw 50 Hz accelerometer and gyroscope recordings.

Follows UCI HAR's ``features_info.txt``: the filters run on whole experiments (so that no window
sees a filter's start-up transient), then every estimator runs on all windows at once, as NumPy
operations over an axis of windows. The columns come out in the order and under the names of
UCI HAR's ``features.txt`` (duplicates and typos included), because the names are produced by
the same code that computes the columns.

Where ``features_info.txt`` leaves a detail open, the choice is written beside the code that
makes it. Most such details (a constant factor in the FFT, 0- or 1-based bin indices, excess or
plain kurtosis) cannot change a feature after min-max scaling, which is invariant to a positive
scale and an offset; the ones that can are the entropy, the iqr's interpolation, how the jerk is
differenced and the filters' phase (chosen by measurement, see _lowpass), and they are why the
recomputed features are close to, not equal to, UCI HAR's.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

FS = 50.0  # Hz, both sensors
WINDOW = 128  # samples: 2.56 s
STEP = 64  # 50% overlap
N_BINS = 64  # the FFT bins UCI HAR keeps: the first half of a 128-point FFT
NOISE_CUTOFF = 20.0  # Hz, 3rd-order Butterworth after the median filter
GRAVITY_CUTOFF = 0.3  # Hz, 3rd-order Butterworth separating gravity from body motion
AR_ORDER = 4
AXES = ("X", "Y", "Z")
# bandsEnergy's bands, 1-based inclusive bin ranges on the 64 bins, as named in features.txt
BANDS = (
    (1, 8), (9, 16), (17, 24), (25, 32), (33, 40), (41, 48), (49, 56), (57, 64),
    (1, 16), (17, 32), (33, 48), (49, 64), (1, 24), (25, 48),
)  # fmt: skip

Columns = list[tuple[str, np.ndarray]]  # (feature name, one value per window), in file order


# ----------------------------------------------------------------------------- the signal chain


def _lowpass(x: np.ndarray, cutoff: float) -> np.ndarray:
    """3rd-order Butterworth low-pass along the last axis, causal and starting from rest, as
    MATLAB's filter() runs it.

    features_info.txt does not say; measured against UCI HAR's published first rows, causal
    filtering brings tBodyAcc-mean()-X within 0.06 of them, where a zero-phase filter
    (sosfiltfilt) is 0.26 off: a causal 0.3 Hz filter lags, so the body acceleration keeps some
    of every slow change of posture, which widens the range that scaling maps to [-1, 1].
    """
    from scipy import signal  # here, not at the top: training workers never filter, and scipy
    #                            costs every spawned worker about a second to import

    sos = signal.butter(3, cutoff, fs=FS, output="sos")
    return signal.sosfilt(sos, x, axis=-1)


def _jerk(x: np.ndarray) -> np.ndarray:
    """Time derivative, per second: a backward difference times 50 Hz (the first sample 0)."""
    return np.diff(x, axis=-1, prepend=x[..., :1]) * FS


def body_signals(acc: np.ndarray, gyro: np.ndarray) -> dict[str, np.ndarray]:
    """The time-domain signals of one whole experiment, each (3, n) or (n,) for magnitudes.

    acc in g and gyro in rad/s, each (3, n) at 50 Hz. Median filter (3 samples) and a 20 Hz
    low-pass remove noise; gravity is the acceleration below 0.3 Hz and the body acceleration the
    rest; the gyroscope is not split (tBodyGyro is the filtered gyroscope).
    """
    from scipy import ndimage  # imported here for the reason _lowpass gives

    acc = _lowpass(ndimage.median_filter(acc, size=(1, 3), mode="nearest"), NOISE_CUTOFF)
    gyro = _lowpass(ndimage.median_filter(gyro, size=(1, 3), mode="nearest"), NOISE_CUTOFF)
    gravity = _lowpass(acc, GRAVITY_CUTOFF)
    body = acc - gravity
    out = {
        "tBodyAcc": body,
        "tGravityAcc": gravity,
        "tBodyAccJerk": _jerk(body),
        "tBodyGyro": gyro,
        "tBodyGyroJerk": _jerk(gyro),
    }
    for name in list(out):
        out[name + "Mag"] = np.sqrt(np.sum(out[name] ** 2, axis=0))
    return out


def cut_windows(x: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Windows of WINDOW samples at the given starts: (..., n) -> (len(starts), ..., WINDOW)."""
    index = np.asarray(starts)[:, None] + np.arange(WINDOW)
    return np.moveaxis(x[..., index], -2, 0)


def spectrum(w: np.ndarray) -> np.ndarray:
    """FFT magnitudes of each 128-sample window, first 64 bins, divided by the window length.

    No taper; the division only rescales, which min-max scaling undoes.
    """
    return np.abs(np.fft.rfft(w, axis=-1)[..., :N_BINS]) / WINDOW


# ----------------------------------------------------------------------------- estimators
# Each takes windows along the last axis and returns one value per window (and per axis).


def mad(w: np.ndarray) -> np.ndarray:
    """Median absolute deviation, as features_info.txt names it (not MATLAB's mad(), a mean)."""
    return np.median(np.abs(w - np.median(w, axis=-1, keepdims=True)), axis=-1)


def sma(w: np.ndarray) -> np.ndarray:
    """Signal magnitude area: the mean of |x| summed over the axes, (W, 3, n) or (W, n) -> (W,)."""
    area = np.mean(np.abs(w), axis=-1)
    return area.sum(axis=1) if area.ndim == 2 else area


def energy(w: np.ndarray) -> np.ndarray:
    """Sum of the squares divided by the number of values (features_info.txt)."""
    return np.mean(w**2, axis=-1)


def iqr(w: np.ndarray) -> np.ndarray:
    """Interquartile range, with NumPy's linear interpolation (MATLAB's iqr interpolates a
    little differently)."""
    q1, q3 = np.percentile(w, (25, 75), axis=-1)
    return q3 - q1


def entropy(w: np.ndarray) -> np.ndarray:
    """Shannon entropy (nats) of the window normalised into a distribution, p_i = |x_i| / sum|x|.

    For a spectrum (magnitudes, never negative) this is the usual spectral entropy; for a time
    signal it is low for a few bursts and high (at most log n) for values of even size.
    features_info.txt says only "signal entropy": this reading is a choice, and the feature least
    likely to match UCI HAR. A window of zeros gets 0.
    """
    size = np.abs(w)
    total = size.sum(axis=-1, keepdims=True)
    p = np.divide(size, total, out=np.zeros_like(size), where=total > 0)
    logp = np.log(p, out=np.zeros_like(p), where=p > 0)
    return -np.sum(p * logp, axis=-1)


def burg(w: np.ndarray, order: int = AR_ORDER) -> np.ndarray:
    """Autoregression coefficients by Burg's method, all windows at once: (..., n) -> (..., order).

    MATLAB's arburg convention, which UCI HAR used: x[t] + a1 x[t-1] + ... + ap x[t-p] = e[t],
    so an AR(2) process x[t] = 0.75 x[t-1] - 0.5 x[t-2] + e[t] gives a1 = -0.75, a2 = 0.5. The
    mean is not removed (as in arburg). A constant-zero window gets zeros.
    """
    f = np.array(w, dtype=np.float64)  # forward prediction errors
    b = f.copy()  # backward prediction errors
    a = np.zeros(w.shape[:-1] + (order + 1,))
    a[..., 0] = 1.0
    for m in range(1, order + 1):
        ff, bb = f[..., 1:], b[..., :-1]
        num = -2.0 * np.sum(ff * bb, axis=-1)
        den = np.sum(ff**2, axis=-1) + np.sum(bb**2, axis=-1)
        k = np.divide(num, den, out=np.zeros_like(num), where=den > 0)[..., None]
        f, b = ff + k * bb, bb + k * ff
        a[..., 1 : m + 1] = a[..., 1 : m + 1] + k * a[..., m - 1 :: -1][..., :m]
    return a[..., 1:]


def correlation(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Pearson correlation of two signals per window; 0 where either is constant."""
    u = u - u.mean(axis=-1, keepdims=True)
    v = v - v.mean(axis=-1, keepdims=True)
    den = np.sqrt(np.sum(u**2, axis=-1) * np.sum(v**2, axis=-1))
    num = np.sum(u * v, axis=-1)
    return np.divide(num, den, out=np.zeros_like(num), where=den > 0)


def max_inds(s: np.ndarray) -> np.ndarray:
    """1-based index of the largest of the 64 bins (bin 1 is 0 Hz)."""
    return (np.argmax(s, axis=-1) + 1).astype(np.float64)


def mean_freq(s: np.ndarray) -> np.ndarray:
    """Mean frequency in Hz, the bins' frequencies weighted by their magnitudes."""
    freqs = np.arange(N_BINS) * FS / WINDOW
    total = s.sum(axis=-1)
    return np.divide(s @ freqs, total, out=np.zeros_like(total), where=total > 0)


def _moments(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Skewness and (plain, not excess) kurtosis of the 64 magnitudes as a sample; 0 and 0 where
    they are all equal. Biased estimators, as MATLAB's skewness and kurtosis by default."""
    d = s - s.mean(axis=-1, keepdims=True)
    d2 = d * d  # products, not d**3 and d**4: np.power on arrays is many times slower
    m2 = np.mean(d2, axis=-1)
    ok = m2 > 1e-30
    safe = np.where(ok, m2, 1.0)
    skew = np.where(ok, np.mean(d2 * d, axis=-1) / safe**1.5, 0.0)
    kurt = np.where(ok, np.mean(d2 * d2, axis=-1) / safe**2, 0.0)
    return skew, kurt


def bands_energy(s: np.ndarray) -> np.ndarray:
    """Energy (sum of squared magnitudes) in each of BANDS: (..., 64) -> (..., 14)."""
    power = s**2
    return np.stack([power[..., lo - 1 : hi].sum(axis=-1) for lo, hi in BANDS], axis=-1)


def angle(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Angle in radians between two vectors per window, (W, 3) x (W, 3) -> (W,)."""
    den = np.linalg.norm(u, axis=-1) * np.linalg.norm(v, axis=-1)
    cos = np.divide(np.sum(u * v, axis=-1), den, out=np.zeros(len(u)), where=den > 0)
    return np.arccos(np.clip(cos, -1.0, 1.0))


# ----------------------------------------------------------------------------- feature groups


def _per_axis(name: str, stat: str, values: np.ndarray) -> Columns:
    """(W, 3) values -> columns "name-stat()-X" ... "-Z"."""
    return [(f"{name}-{stat}-{axis}", values[:, i]) for i, axis in enumerate(AXES)]


def _basic_axial(name: str, w: np.ndarray) -> Columns:
    """mean, std, mad, max, min, sma, energy, iqr, entropy of a 3-axial signal (W, 3, n)."""
    cols = []
    for stat, fn in (
        ("mean()", lambda x: x.mean(axis=-1)),
        ("std()", lambda x: x.std(axis=-1, ddof=1)),  # MATLAB's std: n - 1
        ("mad()", mad),
        ("max()", lambda x: x.max(axis=-1)),
        ("min()", lambda x: x.min(axis=-1)),
    ):
        cols += _per_axis(name, stat, fn(w))
    cols.append((f"{name}-sma()", sma(w)))
    for stat, fn in (("energy()", energy), ("iqr()", iqr), ("entropy()", entropy)):
        cols += _per_axis(name, stat, fn(w))
    return cols


def _basic_mag(name: str, w: np.ndarray) -> Columns:
    """The same nine estimators for a magnitude signal (W, n)."""
    return [
        (f"{name}-mean()", w.mean(axis=-1)),
        (f"{name}-std()", w.std(axis=-1, ddof=1)),
        (f"{name}-mad()", mad(w)),
        (f"{name}-max()", w.max(axis=-1)),
        (f"{name}-min()", w.min(axis=-1)),
        (f"{name}-sma()", sma(w)),
        (f"{name}-energy()", energy(w)),
        (f"{name}-iqr()", iqr(w)),
        (f"{name}-entropy()", entropy(w)),
    ]


def time_axial(name: str, w: np.ndarray) -> Columns:
    """The 40 features of a 3-axial time signal: the nine estimators, arCoeff, correlation."""
    cols = _basic_axial(name, w)
    ar = burg(w)  # (W, 3, 4)
    for i, axis in enumerate(AXES):
        cols += [(f"{name}-arCoeff()-{axis},{k + 1}", ar[:, i, k]) for k in range(AR_ORDER)]
    for i, j in ((0, 1), (0, 2), (1, 2)):
        cols.append((f"{name}-correlation()-{AXES[i]},{AXES[j]}", correlation(w[:, i], w[:, j])))
    return cols


def time_mag(name: str, w: np.ndarray) -> Columns:
    """The 13 features of a time-domain magnitude: the nine estimators and arCoeff."""
    ar = burg(w)
    return _basic_mag(name, w) + [(f"{name}-arCoeff(){k + 1}", ar[:, k]) for k in range(AR_ORDER)]


def freq_axial(name: str, s: np.ndarray) -> Columns:
    """The 79 features of a 3-axial spectrum (W, 3, 64): the nine estimators, maxInds, meanFreq,
    skewness and kurtosis (interleaved per axis, as in features.txt), 14 bandsEnergy per axis."""
    cols = _basic_axial(name, s)
    cols += [(f"{name}-maxInds-{axis}", v) for axis, v in zip(AXES, max_inds(s).T, strict=True)]
    cols += _per_axis(name, "meanFreq()", mean_freq(s))
    skew, kurt = _moments(s)
    for i, axis in enumerate(AXES):
        cols += [
            (f"{name}-skewness()-{axis}", skew[:, i]),
            (f"{name}-kurtosis()-{axis}", kurt[:, i]),
        ]
    bands = bands_energy(s)  # (W, 3, 14); features.txt does not name the axis
    for i in range(3):
        cols += [
            (f"{name}-bandsEnergy()-{lo},{hi}", bands[:, i, k]) for k, (lo, hi) in enumerate(BANDS)
        ]
    return cols


def freq_mag(name: str, s: np.ndarray) -> Columns:
    """The 13 features of a magnitude's spectrum (W, 64)."""
    skew, kurt = _moments(s)
    return _basic_mag(name, s) + [
        (f"{name}-maxInds", max_inds(s)),
        (f"{name}-meanFreq()", mean_freq(s)),
        (f"{name}-skewness()", skew),
        (f"{name}-kurtosis()", kurt),
    ]


def angles(t: dict[str, np.ndarray]) -> Columns:
    """The 7 angle() features from the windows' mean vectors; names exactly as in features.txt."""
    gravity = t["tGravityAcc"].mean(axis=-1)
    mean = {
        k: t[k].mean(axis=-1) for k in ("tBodyAcc", "tBodyAccJerk", "tBodyGyro", "tBodyGyroJerk")
    }
    unit = np.eye(3)
    return [
        ("angle(tBodyAccMean,gravity)", angle(mean["tBodyAcc"], gravity)),
        ("angle(tBodyAccJerkMean),gravityMean)", angle(mean["tBodyAccJerk"], gravity)),
        ("angle(tBodyGyroMean,gravityMean)", angle(mean["tBodyGyro"], gravity)),
        ("angle(tBodyGyroJerkMean,gravityMean)", angle(mean["tBodyGyroJerk"], gravity)),
    ] + [
        (f"angle({axis},gravityMean)", angle(np.broadcast_to(unit[i], gravity.shape), gravity))
        for i, axis in enumerate(AXES)
    ]


# ----------------------------------------------------------------------------- all 561


def window_columns(t: dict[str, np.ndarray]) -> Columns:
    """All 561 (name, values) columns from windowed time signals, in features.txt's order.

    t maps each signal of body_signals to its windows: (W, 3, 128) or (W, 128).
    """
    cols: Columns = []
    for name in ("tBodyAcc", "tGravityAcc", "tBodyAccJerk", "tBodyGyro", "tBodyGyroJerk"):
        cols += time_axial(name, t[name])
    for name in (
        "tBodyAccMag",
        "tGravityAccMag",
        "tBodyAccJerkMag",
        "tBodyGyroMag",
        "tBodyGyroJerkMag",
    ):
        cols += time_mag(name, t[name])
    for name in ("tBodyAcc", "tBodyAccJerk", "tBodyGyro"):
        cols += freq_axial("f" + name[1:], spectrum(t[name]))
    # features.txt's names for the magnitude spectra, "BodyBody" included
    for signal_name, name in (
        ("tBodyAccMag", "fBodyAccMag"),
        ("tBodyAccJerkMag", "fBodyBodyAccJerkMag"),
        ("tBodyGyroMag", "fBodyBodyGyroMag"),
        ("tBodyGyroJerkMag", "fBodyBodyGyroJerkMag"),
    ):
        cols += freq_mag(name, spectrum(t[signal_name]))
    cols += angles(t)
    return cols


def experiment_features(acc: np.ndarray, gyro: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The 561 unscaled features of the windows starting at `starts` in one experiment.

    acc (g) and gyro (rad/s) are (3, n) at 50 Hz; returns float64 (len(starts), 561).
    """
    signals = body_signals(acc, gyro)
    windows = {name: cut_windows(x, starts) for name, x in signals.items()}
    return np.column_stack([values for _, values in window_columns(windows)])


def feature_names() -> list[str]:
    """The 561 names, in column order, equal to UCI HAR's features.txt (made by the same code)."""
    rng = np.random.default_rng(0)
    acc, gyro = rng.normal(size=(3, WINDOW)), rng.normal(size=(3, WINDOW))
    windows = {k: cut_windows(x, np.array([0])) for k, x in body_signals(acc, gyro).items()}
    return [name for name, _ in window_columns(windows)]


def minmax_scale(
    X: np.ndarray, lo: np.ndarray | None = None, hi: np.ndarray | None = None
) -> np.ndarray:
    """Scale each column linearly so that lo -> -1 and hi -> 1 (the columns' own range by
    default); values outside [lo, hi] are clipped, constant columns become 0."""
    lo = X.min(axis=0) if lo is None else lo
    hi = X.max(axis=0) if hi is None else hi
    span = hi - lo
    scaled = np.divide(2 * (X - lo), span, out=np.ones_like(X), where=span > 0) - 1
    return np.clip(scaled, -1.0, 1.0)


__all__: Sequence[str] = (
    "BANDS", "FS", "STEP", "WINDOW", "angle", "bands_energy", "body_signals", "burg",
    "correlation", "cut_windows", "energy", "entropy", "experiment_features", "feature_names",
    "iqr", "mad", "max_inds", "mean_freq", "minmax_scale", "sma", "spectrum", "window_columns",
)  # fmt: skip
