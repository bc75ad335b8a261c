"""The one interface every runtime implements: letterboxed uint8 images in, detections out.

A backend splits a call into :meth:`Backend.infer` (runtime-specific: the network and box decode) and
:meth:`Backend.postprocess` (shared: our Python NMS, or unpacking an in-graph NMS), so the benchmark
can time the two apart and every runtime is judged by the same NMS.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence

import torch

from detector.inference.preprocess import Detections
from detector.model.metadata import HOW_TO_EXPORT, ModelInfo, decode_metadata
from detector.postprocess import NMSConfig, non_max_suppression

RawOutputs = tuple[torch.Tensor, torch.Tensor]  # (boxes, scores) or (detections, num_detections)
# Keys Ultralytics writes into its exports' metadata (ONNX metadata_props, the .engine JSON header) where ours has
# "strides": what tells its exports apart when the author field is gone.
ULTRALYTICS_KEYS = frozenset({"task", "names", "stride", "imgsz"})


class Backend(ABC):
    """``backend(images uint8 [B, 3, S, S]) -> list[{boxes [N, 4] xyxy letterboxed px, scores, labels}]``.

    Attributes:
        info: names, strides, input size, precision and any in-graph NMS of the model.
        nms: thresholds of the Python NMS; for graphs with NMS inside only a higher ``conf_threshold``
            than the baked one has an effect (as a filter on the graph's detections). A model whose outputs are an
            end-to-end head's (``info.end_to_end``: YOLO26's one-to-one branch) is postprocessed by the NMS-free
            top-k whatever ``nms.end_to_end`` says; ``nms.end_to_end`` on any other model is refused.
        name: a short label for tables, e.g. ``"onnxruntime fp16"``.
    """

    name = "backend"
    # True where any input shape runs as it is, nothing built or captured per shape (PyTorch on the CPU): predict
    # then pads each image only to its own stride-divisible canvas instead of the square.
    shapes_are_free = False

    def __init__(self, info: ModelInfo, nms: NMSConfig | None = None, *, source: str = "the model") -> None:
        self.info = info
        self.nms = nms or NMSConfig()
        if self.nms.end_to_end and not info.end_to_end:
            raise ValueError(end_to_end_refusal(source, "this export was written without it (export a YOLO26 "
                                                        "checkpoint with --end-to-end)"))

    @property
    def free_batch(self) -> bool:
        """Whether a batch of any size runs as it is: on CUDA each new size is then a CUDA graph or an engine of its
        own (predict fills a short last batch up instead). A fixed-batch export pads to its batch itself."""
        return self.info.dynamic

    @abstractmethod
    def infer(self, images: torch.Tensor) -> RawOutputs:
        """uint8 ``[B, 3, S, S]`` -> the graph outputs named in ``info.outputs``."""

    def postprocess(self, raw: RawOutputs, classes: Sequence[int] | None = None,
                    nms: NMSConfig | None = None) -> Detections:
        """``classes``: keep only these class ids, chosen before NMS and the ``max_detections`` cap, as Ultralytics
        does, so boxes of other classes take none of the kept places (the NMS-free top-k too, where Ultralytics
        filters its top-k's pairs after). A graph with NMS inside has already filled its K rows with every class:
        there the filter and the cap apply to those rows. ``nms``: this call's
        thresholds instead of :attr:`nms` (two predict streams on one loaded model each keep their own)."""
        nms = self.as_run(nms or self.nms)
        if self.info.nms is None:
            boxes, scores = raw
            per_pair = nms.multi_label or (nms.end_to_end and not nms.agnostic)  # the top-k ranks (box, class) pairs
            scores = scores.float() if classes is None else only_classes(scores.float(), classes, per_pair)
            return non_max_suppression(torch.cat((boxes.float(), scores), -1), nms)
        return unpack_detections(*raw, conf_threshold=nms.conf_threshold,
                                 max_detections=nms.max_detections, classes=classes)

    def as_run(self, nms: NMSConfig) -> NMSConfig:
        """``nms`` as this model's outputs take it: the top-k for an end-to-end head's (no NMS: its boxes are one an
        object already), NMS for any other's, where ``nms.end_to_end`` is refused (``ValueError``)."""
        if nms.end_to_end == self.info.end_to_end:
            return nms
        if nms.end_to_end:
            raise ValueError(end_to_end_refusal(self.name, "this model was loaded without it"))
        return dataclasses.replace(nms, end_to_end=True)

    def __call__(self, images: torch.Tensor, classes: Sequence[int] | None = None,
                 nms: NMSConfig | None = None) -> Detections:
        return self.postprocess(self.infer(images), classes, nms)

    def close(self) -> None:
        """Release what the runtime holds outside Python's objects (the pt2 package's unpacked files); the backend
        is not to be used after. Nothing to do for most runtimes; collection or exit does it too."""

    def check_input(self, images: torch.Tensor) -> None:
        """Reject batches a fixed-shape graph cannot take, with a message that says what it needs."""
        if images.dtype != torch.uint8 or images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(f"expected uint8 images [B, 3, S, S], got {images.dtype} {list(images.shape)}")
        height, width = images.shape[2:]
        if not self.info.dynamic and (height, width) != (self.info.imgsz, self.info.imgsz):
            raise ValueError(f"this model was exported at {self.info.imgsz} px (not --dynamic); got {height}x{width}")
        if height % self.info.stride or width % self.info.stride:
            raise ValueError(f"image sides must be multiples of {self.info.stride}; got {height}x{width}")


def outputs_label(info: ModelInfo) -> str:
    """What a backend's name adds for its graph's outputs: ``" end-to-end"`` for a YOLO26 one-to-one head's, then
    ``" +nms"`` (``" +top-k"`` end-to-end) for a graph with its postprocess inside."""
    branch = " end-to-end" if info.end_to_end else ""
    return branch + ((" +top-k" if info.end_to_end else " +nms") if info.nms else "")


def end_to_end_refusal(source: str, why: str) -> str:
    """The one line refusing ``--end-to-end`` for ``source``: ``why`` it has no NMS-free head."""
    return (f"{source}: --end-to-end runs YOLO26's NMS-free (one-to-one) head, which only YOLO26 models have; {why}")


def only_classes(scores: torch.Tensor, classes: Sequence[int], multi_label: bool) -> torch.Tensor:
    """Class scores ``[B, A, C]`` with every candidate outside ``classes`` scored 0, below any threshold, so NMS
    never sees it. ``multi_label``: per (box, class) pair; otherwise per box, by its best class over all classes:
    a box whose best class is another one is dropped, not relabelled (as Ultralytics' ``classes`` does)."""
    wanted = torch.zeros(scores.shape[-1], dtype=torch.bool, device=scores.device)
    wanted[[index for index in classes if 0 <= index < scores.shape[-1]]] = True  # unknown ids match nothing
    keep = wanted if multi_label else wanted[scores.max(-1).indices].unsqueeze(-1)
    return torch.where(keep, scores, torch.zeros_like(scores))


def unpack_detections(
    detections: torch.Tensor, counts: torch.Tensor, *, conf_threshold: float, max_detections: int | None = None,
    classes: Sequence[int] | None = None,
) -> Detections:
    """In-graph NMS output ``[B, K, 6]`` (x1, y1, x2, y2, score, label) + counts ``[B]`` -> per-image dicts: rows
    above ``conf_threshold`` and of ``classes`` (all when None), then the best ``max_detections`` of them."""
    results = []
    for rows, count in zip(detections.float(), counts.tolist()):
        rows = rows[: int(count)]
        keep = rows[:, 4] > conf_threshold
        if classes is not None:
            keep &= torch.isin(rows[:, 5].long(), torch.tensor(list(classes), dtype=torch.long, device=rows.device))
        rows = rows[keep][:max_detections]  # the graph sorts its rows by score
        results.append({"boxes": rows[:, :4], "scores": rows[:, 4], "labels": rows[:, 5].long()})
    return results


def run_in_fixed_batches(
    run: Callable[[torch.Tensor], Sequence[torch.Tensor]], images: torch.Tensor, batch: int
) -> RawOutputs:
    """Feed a fixed-batch graph: split ``images`` into chunks of ``batch``, zero-pad the last, trim after.

    ``run(chunk) -> tuple of tensors with the batch first``.
    """
    outputs = []
    for start in range(0, images.shape[0], batch):
        chunk = images[start : start + batch]
        real = chunk.shape[0]
        if real < batch:
            chunk = torch.cat((chunk, chunk.new_zeros((batch - real, *chunk.shape[1:]))))
        outputs.append([tensor[:real] for tensor in run(chunk)])
    return tuple(torch.cat(parts) for parts in zip(*outputs))


def made_by_ultralytics(props: Mapping[str, object]) -> bool:
    """Whether export metadata is Ultralytics' own (``author: Ultralytics``, Python-literal ``names``), not ours."""
    maker = f"{props.get('author', '')} {props.get('description', '')}".lower()
    return "ultralytics" in maker or (ULTRALYTICS_KEYS <= props.keys() and "strides" not in props)


def read_model_info(props: Mapping[str, object], *, source: str) -> ModelInfo:
    """An export's metadata (string key/values) -> :class:`ModelInfo`; ``ValueError`` with one line saying what to
    do for a file our exporter did not make: an Ultralytics export is named as one (its graph has another layout
    and output, which no backend here reads), anything else is asked where it came from."""
    if made_by_ultralytics(props):
        raise ValueError(
            f"{source}: an Ultralytics export (author {props.get('author', '?')!r}, task {props.get('task', '?')!r}), "
            "which detector cannot run; use the Ultralytics yolov8*.pt or yolo11*.pt it came from (detector reads "
            f"those directly), or export a detector checkpoint with {HOW_TO_EXPORT}")
    return decode_metadata({key: str(value) for key, value in props.items()}, source=source)
