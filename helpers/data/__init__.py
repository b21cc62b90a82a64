"""The HAR data: UCI HAR downloaded and verified, UCI HAR's features recomputed from the UCI HAPT
recordings, or a stand-in, chosen by HAR_DATA.

Every worker process calls :func:`load_har` itself, so once the data is on disk a load only
reads small binary caches. Which data was used is never silent: every result carries
``.source`` and a ``.banner`` to print next to any figure or table made from it.

    data = load_har()            # HAR_DATA=auto|uci|recordings|standin, default auto
    print(data.banner)           # "data: UCI HAR (verified, har/)", or what else it is

One module per idea: ``har`` (what the data looks like), ``uci`` (download, verify, cache),
``recordings`` (the HAPT recordings, read safely, windowed and cached), ``features`` (UCI HAR's
561 features from raw signals), ``standin`` (the synthetic fallback), ``files`` (safe writes),
``source`` (the choice).
Run ``python -m helpers.data --data uci`` to download and verify the real data by hand.
"""

from helpers.data.features import feature_names
from helpers.data.har import (
    ACTIVITIES,
    ARRAYS,
    DEFAULT_ROOT,
    SPLITS,
    TEST_SUBJECTS,
    TRAIN_SUBJECTS,
    HARData,
    HARDataError,
    HARSpec,
    resolve_root,
)
from helpers.data.recordings import RECORDINGS_BANNER, RECORDINGS_NAME, load_recordings
from helpers.data.source import SOURCES, load_har, resolve_source
from helpers.data.standin import STANDIN_BANNER, make_standin
from helpers.data.uci import download_har
from helpers.data.uci_fetch import extract_and_verify
from helpers.data.uci_verify import FILES, UCI_URL

__all__ = [
    "ACTIVITIES", "ARRAYS", "DEFAULT_ROOT", "FILES", "RECORDINGS_BANNER", "RECORDINGS_NAME",
    "SOURCES", "SPLITS", "STANDIN_BANNER", "TEST_SUBJECTS", "TRAIN_SUBJECTS", "UCI_URL",
    "HARData", "HARDataError", "HARSpec", "download_har", "extract_and_verify", "feature_names",
    "load_har", "load_recordings", "make_standin", "resolve_root", "resolve_source",
]  # fmt: skip
