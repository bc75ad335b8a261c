"""``python -m detector download yolo11n``: fetch pretrained weights into the weights folder, check them, prove they
load.

The same downloader as the datasets (:func:`detector.data.transfer.fetch`): https only (``--allow-http`` for
a plain-http mirror), never more bytes than the file's exact size, a progress bar, a ``<file>.part`` that a cut
transfer resumes with an HTTP ``Range`` request, and an atomic rename into place. The checks: the exact size
and the SHA-256 pinned in :mod:`detector.weights.catalog` (of the whole file, resumed or not), then a read
through the restricted unpickler, which must find detection weights of the expected model; a file that
fails any of them is deleted. A file already in ``weights/`` is checked the same way but never deleted (it may be
the user's own, fine-tuned say): the command refuses in one line and leaves it. All of it runs under
``<file>.lock`` (:func:`detector.data.transfer.one_download`): a second download of the same file stops at once.

``$DETECTOR_DOWNLOAD_URL`` (or ``base_url``) fetches from ``<base>/<file name>`` instead: a mirror, or a
local server in the tests (the same variable the dataset downloads read).
"""

from __future__ import annotations

import pickle
import shlex
from pathlib import Path

from detector.architecture import display_name
from detector.data.catalog import human_size
from detector.data.transfer import (BASE_URL_ENV, DownloadError, check_transport, digest_problem, fetch, mirrored_url,
                                     one_download)
from detector.weights.catalog import LICENCE_NOTE, PRETRAINED, PretrainedWeights
from detector.paths import default_weights_dir
from detector.weights.ultralytics import read_ultralytics_checkpoint

__all__ = ["BASE_URL_ENV", "check_weights", "download_weights"]


def check_weights(path: Path, weights: PretrainedWeights, url: str, *, fetched: bool = True) -> str:
    """Size, the pinned SHA-256, then a safe read of the file; returns a one-line summary. A file that fails is
    deleted when this run ``fetched`` it; one that was there before is left as it is."""
    size = path.stat().st_size
    problem = f"{size} bytes, expected {weights.size}" if size != weights.size else None
    problem = problem or digest_problem(path, sha256=weights.sha256)  # the whole file, resumed or not
    if problem is None:
        try:
            checkpoint = read_ultralytics_checkpoint(path)
            problem = None if checkpoint.scale == weights.scale else f"holds {display_name(checkpoint.scale)} weights"
        except (ValueError, KeyError, pickle.UnpicklingError, RuntimeError, EOFError) as error:
            problem = f"does not load ({str(error).splitlines()[0] if str(error) else type(error).__name__})"
    if problem and not fetched:
        raise DownloadError(f"{path}: {problem}, not the {weights.name} release detector pins; left it as it is: "
                            f"move it away and run the command again to fetch the release")
    if problem:
        path.unlink()
        raise DownloadError(f"{path} (from {url}): {problem}; deleted it, run the command again to fetch it anew")
    return (f"loads: {display_name(checkpoint.scale)}, {checkpoint.num_classes} classes, "
            f"{len(checkpoint.state_dict)} tensors")


def download_weights(weights: str | PretrainedWeights, *, weights_dir: Path | None = None,
                     base_url: str | None = None, allow_http: bool = False, timeout: float = 30.0, attempts: int = 3,
                     retry_wait: float = 2.0) -> Path:
    """Fetch ``weights`` (``"yolov8n"`` ... ``"yolov8x"``, ``"yolo11n"`` ... ``"yolo11x"``, ``"yolo26n"`` ...
    ``"yolo26x"``) into ``weights_dir`` unless it is there; check it; return its path. ``weights_dir``: default
    :func:`detector.paths.default_weights_dir`, where ``--weights yolov8n.pt`` looks. Raises :class:`DownloadError`
    (one line naming the URL or file)."""
    weights_dir = weights_dir or default_weights_dir()
    spec = PRETRAINED[weights] if isinstance(weights, str) else weights
    url = mirrored_url(spec.url, base_url)
    target = weights_dir / spec.filename
    print(LICENCE_NOTE)
    if not target.is_file():
        check_transport(url, allow_http=allow_http)  # before making the folder or saying "fetching"
        weights_dir.mkdir(parents=True, exist_ok=True)
    with one_download(target.with_name(target.name + ".lock"), f"{spec.filename} into {weights_dir}"):
        fetched = not target.is_file()
        if not fetched:
            print(f"{spec.name}: already in {target}; checking it")
        else:
            print(f"{spec.name}: fetching {url} ({human_size(spec.size)}) into {weights_dir}")
            fetch(url, target, spec.size, allow_http=allow_http, timeout=timeout, attempts=attempts,
                  retry_wait=retry_wait)
        summary = check_weights(target, spec, url, fetched=fetched)
    name = spec.filename if weights_dir.resolve() == default_weights_dir().resolve() else target  # by bare name?
    print(f"{spec.name}: ready in {target} ({summary}); "
          f"train from it: python -m detector train --weights {shlex.quote(str(name))} --data YOUR.yaml")
    return target
