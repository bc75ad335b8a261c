"""The pretrained checkpoints ``python -m detector download yolo11n`` can fetch: Ultralytics' YOLOv8, YOLO11 and
YOLO26 detection files.

No network code here (:mod:`detector.weights.download` fetches); this module only names the files, so
``--weights yolo11n.pt`` that finds nothing can say which command fetches it.

Every file is pinned by its exact size and SHA-256. Ultralytics publishes no checksums with its GitHub
release assets (``ultralytics/assets``), and none of the YOLOv8 assets' digests could be found from here; the
files are therefore fetched from Ultralytics' own Hugging Face repositories at a fixed commit, whose Git LFS pointers
give each file's SHA-256 and size: the URL names that commit, so the bytes behind it cannot change, and a download
whose digest differs is deleted.

* YOLOv8: ``Ultralytics/YOLOv8`` at commit ``8a9e1a55f987a77f9966c2ac3f80aa8aa37b3c1a`` ("Upload 5 files", by
  glenn-jocher). The same SHA-256 and size for yolov8n.pt appear in several unrelated repositories that copied the
  file Ultralytics' own package downloads (e.g. the Hugging Face Space ``nagasurendra/surveillance``), which ties
  these files to the released YOLOv8 weights.
* YOLO11: ``Ultralytics/YOLO11`` at commit ``a01aaa06caeff788b052e193acb76b3f21571b3a``. Each file's LFS pointer is
  that of the commit that uploaded it (muhammadrizwanmunawar, 2024-10-16), seen on huggingface.co:
  yolo11n.pt in 5599de6 (its blob page: SHA256 0ebbc80d...644ee1, 5.61 MB), yolo11s.pt in
  ``064ec9688a5e013cb9ebf0cf52617901647bbe87`` (oid 85a76fe8..., size 19313732), yolo11m.pt in
  ``bbc85af02ea4a5631af72cb6ea0744c825c5e858`` (oid d5ffc1a6..., size 40684120), yolo11l.pt in
  ``bee92e2cb9936f6120c11847dc0c598aafdb5922`` (oid 9ebd0e09..., size 51387343; also its blob page at the pinned
  commit) and yolo11x.pt in 5e0da47 (its blob page at ``5df55ae8af79be2d62706f481e97fea7c17c4afc``: SHA256
  7bc158aa...773a24; the file history at the pinned commit lists that upload alone). The exact sizes of yolo11n.pt
  (5613764) and yolo11x.pt (114636239) are those of the same LFS objects copied into other Hugging Face repositories
  (``Omarrran/yolo_onnx_hnm`` commit 39f1767, ``StableDiffusionVN/yolo`` commit 549ddd3: same oid, that size), and
  all five sizes and digests are the ones projects pin for Ultralytics' GitHub release assets
  (``ultralytics/assets`` v8.3.0 and v8.4.0), the files Ultralytics' package downloads: the same weights.
* YOLO26: no Ultralytics Hugging Face commit pinning these files could be found from here, so they are fetched from
  Ultralytics' GitHub release ``ultralytics/assets`` v8.4.0 (the URL Ultralytics' own package downloads). A release
  asset can be replaced, so the pin is the digest alone: the size and SHA-256 of each file are those that several
  unrelated public projects pin for that asset, found in their source through this project's code search, and every
  one of those that names a given file agrees: one records GitHub's release metadata for tag v8.4.0 (all five files:
  yolo26n.pt 5544453 bytes SHA256 9b09cc8b...ad4fef, yolo26s.pt 20422725 646f8bc3...384a1b, yolo26m.pt 44255705
  401cea9a...45d0b7, yolo26l.pt 53211173 9fe3c544...32db26, yolo26x.pt 118667365 9fdd44a3...003e92), and two to
  four others pin each file alike. These digests were NOT checked against a download here (this project's build
  machines reach no network but package registries): a user's first ``python -m detector download yolo26n`` is their
  first check, and a file whose size or digest differs is deleted, not loaded.

After the digest, the file is read through the restricted unpickler (:mod:`detector.weights.safe_pickle`), which
proves it is a detection checkpoint of the expected model.
"""

from __future__ import annotations

from dataclasses import dataclass

# Ultralytics' Hugging Face repositories at one commit each (see the module docstring for why not the GitHub release),
# and for YOLO26 the GitHub release.
ULTRALYTICS_RELEASE = "https://huggingface.co/Ultralytics/YOLOv8/resolve/8a9e1a55f987a77f9966c2ac3f80aa8aa37b3c1a"
YOLO11_RELEASE = "https://huggingface.co/Ultralytics/YOLO11/resolve/a01aaa06caeff788b052e193acb76b3f21571b3a"
YOLO26_RELEASE = "https://github.com/ultralytics/assets/releases/download/v8.4.0"  # pinned by digest only: see above
LICENCE_NOTE = (
    "Ultralytics' YOLOv8, YOLO11 and YOLO26 weights are licensed AGPL-3.0 (https://ultralytics.com/license), not "
    "Apache-2.0 like detector; models fine-tuned from them may carry AGPL-3.0 obligations. detector never imports "
    "Ultralytics code: it reads the file's tensors only."
)


@dataclass(frozen=True)
class PretrainedWeights:
    name: str  # what ``python -m detector download NAME`` takes: "yolov8n"
    scale: str  # our model name the file maps onto: "n", "11n", "26n"
    size: int  # bytes, exact
    sha256: str  # of the whole file: the Git LFS object id at ``source``'s commit
    source: str = ULTRALYTICS_RELEASE

    @property
    def filename(self) -> str:
        return f"{self.name}.pt"

    @property
    def url(self) -> str:
        return f"{self.source}/{self.filename}"


PRETRAINED = {
    weights.name: weights
    for weights in (
        PretrainedWeights("yolov8n", "n", 6_534_387, "31e20dde3def09e2cf938c7be6fe23d9150bbbe503982af13345706515f2ef95"),
        PretrainedWeights("yolov8s", "s", 22_573_363, "268e5bb54c640c96c3510224833bc2eeacab4135c6deb41502156e39986b562d"),
        PretrainedWeights("yolov8m", "m", 52_117_635, "6c25b0b63b1a433843f06d821a9ac1deb8d5805f74f0f38772c7308c5adc55a5"),
        PretrainedWeights("yolov8l", "l", 87_769_683, "18218ea4798da042d9862e6029ca9531adbd40ace19b6c9a75e2e28f1adf30cc"),
        PretrainedWeights("yolov8x", "x", 136_867_539, "c4d5a3f000d771762f03fc8b57ebd0aae324aeaefdd6e68492a9c4470f2d1e8b"),
        *(PretrainedWeights(f"yolo11{letter}", f"11{letter}", size, sha256, YOLO11_RELEASE)
          for letter, size, sha256 in (
            ("n", 5_613_764, "0ebbc80d4a7680d14987a577cd21342b65ecfd94632bd9a8da63ae6417644ee1"),
            ("s", 19_313_732, "85a76fe86dd8afe384648546b56a7a78580c7cb7b404fc595f97969322d502d5"),
            ("m", 40_684_120, "d5ffc1a674953a08e11a8d21e022781b1b23a19b730afc309290bd9fb5305b95"),
            ("l", 51_387_343, "9ebd0e09d59811db4b1d61e2bc6730649608b1ac47f8dd01e2da6bca7c20023f"),
            ("x", 114_636_239, "7bc158aa95c0ebfdd87f70f01653c1131b93e92522dbe15c228bcd742e773a24"),
        )),
        *(PretrainedWeights(f"yolo26{letter}", f"26{letter}", size, sha256, YOLO26_RELEASE)
          for letter, size, sha256 in (
            ("n", 5_544_453, "9b09cc8bf347f0fc8a5f7657480587f25db09b34bf33b0652110fb03a8ad4fef"),
            ("s", 20_422_725, "646f8bc3fe0a656803d95c294f7852321748cb29d13466a1af8862e2db384a1b"),
            ("m", 44_255_705, "401cea9ab23ad19246ff7744859816bc599f350e93c9dd30367b6f0a0745d0b7"),
            ("l", 53_211_173, "9fe3c544f2b19bebad7ea41e76d7ad3d88b7c2f10d11d24430c5311f6b32db26"),
            ("x", 118_667_365, "9fdd44a31c504547ffb81d2c6d9e6dac3493c8eaa8b0398d3f43bae6c7003e92"),
        )),
    )
}


def pretrained_name(text: str) -> str | None:
    """``"yolov8n"``, ``"YOLO11n.pt"``, ``"yolo26n"`` -> ``"yolov8n"``, ``"yolo11n"``, ``"yolo26n"``; None when
    ``text`` names no catalogued file."""
    name = text.strip().lower().removesuffix(".pt")
    return name if name in PRETRAINED else None
