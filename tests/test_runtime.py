import os
import subprocess
import sys

from detector.runtime import ONEDNN_CACHE_CAPACITY, ONEDNN_CACHE_ENV

SHOW = "import os, detector; print(os.environ['ONEDNN_PRIMITIVE_CACHE_CAPACITY'])"


def _imported_value(environment: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-c", SHOW], env=environment, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def test_importing_detector_enlarges_the_onednn_kernel_cache():
    environment = {k: v for k, v in os.environ.items() if k != ONEDNN_CACHE_ENV}
    assert _imported_value(environment) == str(ONEDNN_CACHE_CAPACITY)


def test_a_users_own_cache_size_is_kept():
    assert _imported_value({**os.environ, ONEDNN_CACHE_ENV: "77"}) == "77"
