"""The predict workflow's helpers (the command end to end: tests/cli/test_predict_and_benchmark.py)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import torch

from detector.inference import Backend
from detector.inference.sources import Frame
from detector.model.metadata import ModelInfo
from detector.postprocess import NMSConfig
from detector.workflows.options import PredictOptions
from detector.workflows.predict import detect, input_size, run_predict


class FixedBackend:
    """Three detections, one per class, whatever the images and classes: the pipeline's stand-in."""

    def __init__(self) -> None:
        self.info = SimpleNamespace(names=["cat", "dog", "car"])

    def __call__(self, batch: torch.Tensor, classes: tuple[int, ...] | None = None,
                 nms: NMSConfig | None = None) -> list[dict[str, torch.Tensor]]:
        return [{"boxes": torch.tensor([[0.0, 0, 8, 8], [8, 8, 16, 16], [16, 16, 32, 32]]),
                 "scores": torch.tensor([0.9, 0.8, 0.7]), "labels": torch.tensor([0, 1, 2])}]


# Four boxes apart (no NMS between them), (cat, dog, car) scores: two dogs score highest, and the fourth box's
# best class is dog even though its cat score is above the threshold.
SCORES = [[0.1, 0.9, 0.0], [0.8, 0.1, 0.0], [0.7, 0.0, 0.0], [0.6, 0.95, 0.0]]
BOXES = [[0.0, 0, 8, 8], [8, 8, 16, 16], [16, 16, 24, 24], [24, 24, 32, 32]]


class RawBackend(Backend):
    """A real :class:`Backend` whose network outputs the fixed boxes and scores above: decoded ones, or (``baked``)
    the rows a graph with NMS inside gives for them (its K = 4 rows, sorted by score)."""

    def __init__(self, *, baked: bool) -> None:
        graph_nms = NMSConfig(max_detections=4) if baked else None
        super().__init__(ModelInfo(names=["cat", "dog", "car"], strides=(8, 16, 32), imgsz=32, nms=graph_nms),
                         NMSConfig(max_detections=2))

    def infer(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.info.nms is None:
            return torch.tensor([BOXES]), torch.tensor([SCORES])
        rows = [BOXES[3] + [0.95, 1], BOXES[0] + [0.9, 1], BOXES[1] + [0.8, 0], BOXES[2] + [0.7, 0]]
        return torch.tensor([rows]), torch.tensor([4])


@pytest.mark.parametrize("baked", [False, True], ids=["python-nms", "graph-nms"])
def test_classes_are_chosen_before_max_det(baked: bool) -> None:
    """``max_det=2 classes=[0]`` keeps two cats, as Ultralytics does: filtered after NMS and the cap, the two dogs
    took both places and no cat was left. A box whose best class is a dog stays out, not relabelled a cat."""
    frame = Frame("a.jpg", None, np.zeros((32, 32, 3), np.uint8))
    everything = detect(RawBackend(baked=baked), frame, size=32, classes=None)
    assert everything["labels"].tolist() == [1, 1] and everything["scores"].tolist() == pytest.approx([0.95, 0.9])
    cats = detect(RawBackend(baked=baked), frame, size=32, classes=(0,))
    assert cats["labels"].tolist() == [0, 0] and cats["names"] == ["cat", "cat"]
    assert cats["scores"].tolist() == pytest.approx([0.8, 0.7])
    np.testing.assert_array_equal(cats["boxes"], np.array(BOXES[1:3], np.float32))
    assert detect(RawBackend(baked=baked), frame, size=32, classes=(2, 7))["labels"].tolist() == []


def test_input_size_follows_the_model() -> None:
    fixed = SimpleNamespace(info=SimpleNamespace(imgsz=320, dynamic=False, stride=32))
    assert input_size(fixed, None) == 320 and input_size(fixed, 320) == 320
    with pytest.raises(ValueError, match="fixed 320 px; drop --imgsz or export with --dynamic"):
        input_size(fixed, 640)
    dynamic = SimpleNamespace(info=SimpleNamespace(imgsz=320, dynamic=True, stride=32))
    assert input_size(dynamic, 640) == 640
    with pytest.raises(ValueError, match="--imgsz must be a multiple of 32; got 100"):
        input_size(dynamic, 100)


def test_a_failed_predict_leaves_no_run_folder(checkpoint: Path, tmp_path: Path) -> None:
    (tmp_path / "clip.mp4").write_bytes(b"not a video")
    project = tmp_path / "runs" / "predict"
    options = PredictOptions(weights=checkpoint, source=tmp_path / "clip.mp4", project=project, device="cpu")
    with pytest.raises(FileNotFoundError, match="cannot open video"):
        run_predict(options)
    assert not project.exists()


def test_a_folder_of_unreadable_images_fails_the_command(checkpoint: Path, tmp_path: Path, capsys) -> None:
    """Two skip warnings, then an error line and exit 1; it was "pytorch fp32 on 0 images/frames" and exit 0."""
    from detector.cli.predict import main as predict_main

    (tmp_path / "photos").mkdir()
    for name in ("a.jpg", "b.png"):
        (tmp_path / "photos" / name).write_bytes(b"not an image")
    project = tmp_path / "runs"
    assert predict_main(["--weights", str(checkpoint), "--source", str(tmp_path / "photos"), "--device", "cpu",
                         "--project", str(project)]) == 1
    output = capsys.readouterr()
    assert output.err.count("; skipped") == 2 and "0 images/frames" not in output.out
    assert f"error: {tmp_path / 'photos'}: no readable image or video frame in it" in output.err
    assert not project.exists()  # nothing was predicted: no run folder


def test_pytorch_on_the_cpu_predicts_on_a_tight_canvas_and_the_boxes_come_back(model, tmp_path: Path) -> None:
    """A 96 x 128 photo at 128 px runs at 96 x 128 through PyTorch on the CPU (any shape, nothing captured per
    shape), not in the 128 x 128 square; its boxes still come back in the photo's own pixels."""
    from detector.inference.torch_backend import TorchBackend

    info = ModelInfo(names=["a", "b", "c"], strides=tuple(model.strides), imgsz=128, dynamic=True)
    backend = TorchBackend(model, info, nms=NMSConfig(conf_threshold=0.01))
    assert backend.shapes_are_free
    shapes = []
    real_infer = backend.infer
    backend.infer = lambda images: shapes.append(tuple(images.shape)) or real_infer(images)
    photo = np.random.default_rng(0).integers(0, 256, (96, 128, 3), dtype=np.uint8)
    result = detect(backend, Frame("photo.jpg", None, photo), size=128, classes=None)
    assert shapes == [(1, 3, 96, 128)]
    assert len(result["boxes"]) and (result["boxes"][:, [1, 3]] <= 96).all() and (result["boxes"] >= 0).all()


def test_batches_find_what_one_frame_at_a_time_finds() -> None:
    """``--batch 2`` over five frames of one shape: three model calls (2, 2, 1), results in the frames' order,
    and the same detections as frame by frame, within FP32 summation order (another batch size may take other
    convolution kernels), in the frames' own pixels (ratio 1 on this tight canvas, so letterbox pixels are
    original ones and the letterbox-space tolerances apply as they are)."""
    from detector.inference.preprocess import prepare_batch
    from detector.inference.torch_backend import TorchBackend
    from detector.workflows.predict import predict_frames
    from tests.conftest import lively_model
    from tests.tolerances import assert_same_detections, fp32_tolerance_on

    model = lively_model()  # varied box bins: the session's model draws zero-width boxes, which IoU cannot pair
    nms = NMSConfig(conf_threshold=0.01)
    backend = TorchBackend(model, ModelInfo(names=["a", "b", "c"], strides=tuple(model.strides), imgsz=128,
                                            dynamic=True), nms=nms)
    calls = []
    real_infer = backend.infer
    backend.infer = lambda images: calls.append(images.shape[0]) or real_infer(images)
    rng = np.random.default_rng(1)
    frames = [Frame("clip.mp4", index, rng.integers(0, 256, (96, 128, 3), dtype=np.uint8)) for index in range(5)]

    def run(batch: int) -> list[dict]:
        options = PredictOptions(source="clip.mp4", batch=batch, device="cpu")
        return list(predict_frames(backend, iter(frames), size=128, options=options))

    one_by_one, batched = run(1), run(2)
    assert calls == [1, 1, 1, 1, 1, 2, 2, 1]  # any shape runs as it is here: the last batch stays short
    assert [result["frame"] for result in batched] == list(range(5))
    as_tensors = [[{key: torch.from_numpy(result[key]) for key in ("boxes", "scores", "labels")} for result in run]
                  for run in (one_by_one, batched)]
    images = prepare_batch([frame.image for frame in frames], 128, tight=32)[0]
    assert_same_detections(*as_tensors, nms=nms, tolerance=fp32_tolerance_on(model, images))
    with pytest.raises(ValueError, match="--batch must be at least 1; got 0"):
        PredictOptions(source="clip.mp4", batch=0)


def test_the_reader_holds_a_whole_next_batch(checkpoint: Path, tmp_path: Path, monkeypatch) -> None:
    """With --batch 8 the read-ahead queue holds 8 + 3 frames: the next batch decodes while the model runs this
    one (a queue of 4 would leave 4 of its 8 to decode after the call); one frame at a time keeps 4."""
    import detector.workflows.predict as predict_module
    from detector.inference.sources import READ_AHEAD

    depths = []
    real_read_ahead = predict_module.read_ahead
    monkeypatch.setattr(predict_module, "read_ahead",
                        lambda frames, depth: depths.append(depth) or real_read_ahead(frames, depth))
    images = [np.zeros((32, 32, 3), np.uint8)] * 3
    for batch in (1, 8):
        run_predict(PredictOptions(weights=checkpoint, source="arrays", batch=batch, device="cpu", imgsz=64),
                    source=images, write=False)
    assert depths == [READ_AHEAD, READ_AHEAD + 7]


def test_a_source_failing_inside_a_batch_still_predicts_and_writes_the_frames_before_it(checkpoint: Path,
                                                                                       tmp_path: Path) -> None:
    """Three frames, then the source fails (a video that will not open): at --batch 4 the three are predicted and
    in predictions.json, as at --batch 1, and the error still ends the run."""
    from detector.workflows.outputs import Outputs
    from detector.workflows.predict import predict_frames
    from detector.inference.torch_backend import TorchBackend

    def source():
        for index in range(3):
            yield Frame(f"{index}.jpg", None, np.full((32, 32, 3), 40 * index, np.uint8))
        raise FileNotFoundError("clip.mp4: cannot open video")

    backend = TorchBackend.from_checkpoint(checkpoint, imgsz=64)
    for batch in (1, 4):
        options = PredictOptions(source="folder", batch=batch, project=tmp_path, name=f"batch{batch}")
        outputs = Outputs(tmp_path / f"batch{batch}", options, list(backend.info.names))
        seen = []
        with pytest.raises(FileNotFoundError, match="cannot open video"):
            for result in predict_frames(backend, source(), size=64, options=options, outputs=outputs):
                seen.append(result["file"])
        assert seen == ["0.jpg", "1.jpg", "2.jpg"]
        written = json.loads((tmp_path / f"batch{batch}" / "predictions.json").read_text())
        assert [record["file"] for record in written] == seen


def letterbox_on_the_cpu(monkeypatch, events: list[str] | None = None) -> None:
    """The CUDA path's two letterbox halves run on the CPU, unpinned (a fake CUDA backend only names its device);
    ``events`` records each staging."""
    import detector.workflows.predict as predict_module

    real_stage, real_finish = predict_module.stage_letterbox, predict_module.finish_letterbox

    def stage(images, size, *, pin):
        if events is not None:
            events.append(f"stage {len(images)}")
        return real_stage(images, size, pin=False)

    monkeypatch.setattr(predict_module, "stage_letterbox", stage)
    monkeypatch.setattr(predict_module, "finish_letterbox",
                        lambda staged, device: real_finish(staged, torch.device("cpu")))


class RecordingCudaBackend(FixedBackend):
    """Names a CUDA device, runs on the CPU, and records the order of its calls: what the pipeline relies on."""

    def __init__(self, events: list[str]) -> None:
        super().__init__()
        self.info.stride, self.info.dynamic, self.device, self.events = 32, True, torch.device("cuda"), events
        self.calls = 0

    def infer(self, batch: torch.Tensor) -> tuple[torch.Tensor, int]:
        self.calls += 1
        self.events.append(f"infer {self.calls}")
        return batch, self.calls

    def postprocess(self, raw: tuple[torch.Tensor, int], classes: tuple[int, ...] | None = None,
                    nms: NMSConfig | None = None) -> list[dict[str, torch.Tensor]]:
        batch, call = raw
        self.events.append(f"results {call}")
        # each image's boxes moved by its mean pixel, so results can be told apart and matched to their frames
        return [{**detection, "boxes": detection["boxes"] + image.float().mean()}
                for image, detection in zip(batch, super().__call__(batch) * batch.shape[0])]

    def __call__(self, batch: torch.Tensor, classes: tuple[int, ...] | None = None,
                 nms: NMSConfig | None = None) -> list[dict[str, torch.Tensor]]:
        return self.postprocess(self.infer(batch))


def test_on_cuda_the_next_batch_is_staged_while_the_gpu_runs_this_one(monkeypatch) -> None:
    """Batch k+1 is read and copied into host memory after batch k's model is queued and before its detections
    are brought back (the wait for the GPU); results are those of one batch after the other, in order."""
    from detector.workflows.predict import detect_batches

    events: list[str] = []
    letterbox_on_the_cpu(monkeypatch, events)
    frames = [Frame("clip.mp4", index, np.full((32, 32, 3), 10 * index, np.uint8)) for index in range(5)]
    batches = [frames[0:2], frames[2:4], frames[4:5]]
    pipelined = list(detect_batches(RecordingCudaBackend(events), iter(batches), size=32, classes=None, pad_to=2))
    assert events == ["stage 2", "infer 1", "stage 2", "results 1", "infer 2", "stage 2", "results 2", "infer 3",
                      "results 3"]  # the last batch padded to 2 with a copy of frame 4
    assert [[frame.index for frame in frames] for frames, _ in pipelined] == [[0, 1], [2, 3], [4]]
    on_the_cpu = RecordingCudaBackend([])
    on_the_cpu.device = torch.device("cpu")  # the plain path: one frame after the other, nothing overlapped
    one_by_one = [batch[0] for _, batch in detect_batches(on_the_cpu, ([frame] for frame in frames), size=32,
                                                          classes=None)]
    results = [result for _, batch in pipelined for result in batch]
    for got, expected in zip(results, one_by_one, strict=True):
        np.testing.assert_array_equal(got["boxes"], expected["boxes"])
        assert got["frame"] == expected["frame"] and got["names"] == expected["names"]


def test_a_live_source_gets_each_batchs_results_before_the_next_batch_is_read(monkeypatch) -> None:
    from detector.inference.sources import is_live
    from detector.workflows.predict import detect_batches

    assert is_live(0) and is_live("rtsp://cam/1") and is_live("HTTPS://x/stream.m3u8")
    assert not is_live("clip.mp4") and not is_live([0]) and not is_live(np.zeros((8, 8, 3), np.uint8))
    events: list[str] = []
    frames = [Frame("webcam0", index, np.zeros((32, 32, 3), np.uint8)) for index in range(2)]
    import detector.workflows.predict as predict_module

    real_prepare = predict_module.prepare_batch  # a fake CUDA backend: the one-by-one path letterboxes on the CPU
    monkeypatch.setattr(predict_module, "prepare_batch",
                        lambda images, size, device=None, tight=None: real_prepare(images, size, tight=tight))
    list(detect_batches(RecordingCudaBackend(events), iter([frames[:1], frames[1:]]), size=32, classes=None,
                        overlap=False))
    assert events == ["infer 1", "results 1", "infer 2", "results 2"]


def test_on_cuda_a_source_failing_partway_still_gets_the_batches_read_before(monkeypatch) -> None:
    from detector.workflows.predict import detect_batches

    letterbox_on_the_cpu(monkeypatch)
    frames = [Frame("a.mp4", index, np.zeros((32, 32, 3), np.uint8)) for index in range(4)]

    def batches():
        yield frames[:2]
        yield frames[2:]
        raise FileNotFoundError("cannot open video b.mp4")

    seen = []
    with pytest.raises(FileNotFoundError, match="b.mp4"):
        for batch, _ in detect_batches(RecordingCudaBackend([]), batches(), size=32, classes=None):
            seen.extend(frame.index for frame in batch)
    assert seen == [0, 1, 2, 3]


@pytest.mark.parametrize("device, dynamic, free_batch, calls", [
    ("cuda", True, None, [2, 2, 2]), ("cpu", True, None, [2, 2, 1]), ("cuda", False, None, [2, 2, 1]),
    ("cuda", False, True, [2, 2, 2])])
def test_on_cuda_a_short_last_batch_is_filled_up(device: str, dynamic: bool, free_batch: bool | None,
                                                 calls: list[int], monkeypatch) -> None:
    """Five frames at --batch 2. A free-shape backend on CUDA (it captures or builds per input shape) gets three
    calls of 2, the last with a copy of frame 4 whose result is dropped; on the CPU, or for a fixed-batch export
    (which pads to its own batch), the last call stays short. A pt2 package exported with --dynamic has a fixed size
    but a free batch (``free_batch``, a graph per batch size on CUDA): filled up too. Five results in order either
    way. Nothing runs on the device: the fake backend only names it, and the letterbox runs on the CPU."""
    import detector.workflows.predict as predict_module
    from detector.workflows.predict import predict_frames

    real_prepare = predict_module.prepare_batch
    monkeypatch.setattr(predict_module, "prepare_batch",
                        lambda images, size, device=None, tight=None: real_prepare(images, size, tight=tight))
    letterbox_on_the_cpu(monkeypatch)

    class PerShapeBackend(FixedBackend):
        def __init__(self) -> None:
            super().__init__()
            self.info.stride, self.info.dynamic, self.device = 32, dynamic, torch.device(device)
            self.batches: list[int] = []

        @property
        def free_batch(self) -> bool:
            return self.info.dynamic if free_batch is None else free_batch

        def infer(self, batch: torch.Tensor) -> torch.Tensor:
            self.batches.append(batch.shape[0])
            return batch

        def postprocess(self, batch: torch.Tensor, classes: tuple[int, ...] | None = None,
                        nms: NMSConfig | None = None) -> list[dict[str, torch.Tensor]]:
            return super().__call__(batch) * batch.shape[0]

        def __call__(self, batch: torch.Tensor, classes: tuple[int, ...] | None = None,
                     nms: NMSConfig | None = None) -> list[dict[str, torch.Tensor]]:
            return self.postprocess(self.infer(batch))

    backend = PerShapeBackend()
    frames = [Frame("clip.mp4", index, np.zeros((32, 32, 3), np.uint8)) for index in range(5)]
    options = PredictOptions(source="clip.mp4", batch=2)
    results = list(predict_frames(backend, frames, size=32, options=options))
    assert backend.batches == calls and [result["frame"] for result in results] == [0, 1, 2, 3, 4]


def test_agnostic_nms_on_a_graph_with_nms_inside_is_refused(checkpoint: Path, tmp_path: Path) -> None:
    backend = RawBackend(baked=True)
    options = PredictOptions(source=str(tmp_path / "a.png"), agnostic_nms=True, project=tmp_path / "runs")
    import cv2

    cv2.imwrite(str(tmp_path / "a.png"), np.zeros((32, 32, 3), np.uint8))
    with pytest.raises(ValueError, match="--agnostic-nms: this graph has NMS inside, per class"):
        run_predict(options, backend=backend, write=False)


def test_what_a_graph_with_nms_inside_cannot_honour_is_said() -> None:
    """A lower --conf was warned of; another --iou and a larger --max-det were dropped without a word."""
    from detector.workflows.predict import baked_nms_limits

    baked = NMSConfig(conf_threshold=0.25, iou_threshold=0.7, max_detections=100)
    assert baked_nms_limits(baked, 0.25, 0.7, 100) == "" and baked_nms_limits(baked, 0.5, 0.7, 50) == ""
    said = baked_nms_limits(baked, 0.1, 0.5, 300)
    assert said == ("--conf 0.1 cannot go lower; --iou 0.5 cannot change its IoU; --max-det 300 cannot give more "
                    "than 100; export it without --nms to choose them at predict time")
