"""One Backend interface over PyTorch and ONNX Runtime: same letterbox, same NMS, same detections."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from detector.model.metadata import ModelInfo
from detector.exporting.parity import synthetic_images
from detector.inference.backend import only_classes
from detector.inference.tensorrt_backend import read_engine_file, tensorrt_missing, write_engine_file
from detector.inference import load_backend, prepare_batch, to_original_pixels
from detector.inference.onnx_backend import OnnxBackend
from detector.inference.torch_backend import TorchBackend, half_precision, make_torch_infer
from detector.model import YOLO
from detector.postprocess import NMSConfig
from detector.precision import Precision, has_native_bf16
from tests.tolerances import assert_same_detections, fp32_tolerance_on, rounded_relative_error

NMS = NMSConfig(conf_threshold=0.3, iou_threshold=0.5)

IMGSZ = 64  # conftest fixtures use 64 px images


def test_suffix_picks_the_runtime(checkpoint: Path, onnx_fp32: Path, tmp_path: Path) -> None:
    assert isinstance(load_backend(checkpoint), TorchBackend)
    assert isinstance(load_backend(onnx_fp32), OnnxBackend)
    (tmp_path / "model.tflite").write_bytes(b"")
    with pytest.raises(ValueError, match="unknown weights type"):
        load_backend(tmp_path / "model.tflite")


@pytest.mark.skipif(tensorrt_missing() is None, reason="TensorRT and a GPU are present")
def test_engine_without_tensorrt_says_why(tmp_path: Path) -> None:
    info = ModelInfo(names=["a"], strides=(8, 16, 32), imgsz=IMGSZ, dynamic=False)
    write_engine_file(tmp_path / "m.engine", info, b"\x00" * 8)  # a well-formed file: only TensorRT is missing
    with pytest.raises(RuntimeError, match="needs"):
        load_backend(tmp_path / "m.engine")


@pytest.mark.parametrize("name, content, problem", [
    ("m.engine", b"ab", "not an engine file from `detector export` \\(`python export.py` in a checkout\\) \\(2 bytes"),
    ("m.engine", b"", "not an engine file from `detector export`.* \\(0 bytes"),
    ("m.engine", b"\xff\xff\x00\x00{}", "shorter than the header"),
    ("m.engine", b"\x02\x00\x00\x00{}", "missing or malformed detector metadata.*; was it made by `detector export`"),
    ("m.engine", b"\x02\x00\x00\x00[]", "its header is no metadata object"),
    ("m.onnx", b"not a protobuf at all", "not a loadable ONNX model"),
    ("m.onnx", b"", "not a loadable ONNX model"),
    ("m.pt", b"", "empty or cut short"),
])
def test_a_broken_model_file_is_one_line_naming_it(tmp_path: Path, name: str, content: bytes, problem: str) -> None:
    if name.endswith(".onnx"):
        pytest.importorskip("onnxruntime", reason="the ONNX backend needs onnxruntime")
    (tmp_path / name).write_bytes(content)
    with pytest.raises(ValueError, match=problem) as refused:  # CheckpointError is a ValueError too
        load_backend(tmp_path / name)
    assert str(refused.value).startswith(str(tmp_path / name)) and "\n" not in str(refused.value)


def test_onnx_and_pytorch_give_the_same_detections(model: YOLO, checkpoint: Path, onnx_fp32: Path) -> None:
    images = synthetic_images(IMGSZ, count=3)  # 3 images through a batch-2 graph: padded chunking
    expected = load_backend(checkpoint, nms=NMS)(images)
    got = load_backend(onnx_fp32, nms=NMS)(images)
    # Same FP32 network, other summation order: tolerances from the model's depth, fan-in and outputs;
    # detections are paired by IoU, and those on a threshold may exist on one side only.
    assert_same_detections(expected, got, nms=NMS, tolerance=fp32_tolerance_on(model, images))


def test_fixed_shape_graph_rejects_other_sizes(onnx_fp32: Path) -> None:
    with pytest.raises(ValueError, match="exported at 64 px"):
        load_backend(onnx_fp32)(torch.zeros(1, 3, 96, 96, dtype=torch.uint8))


def test_bf16_runs_on_cpu(checkpoint: Path) -> None:
    backend = load_backend(checkpoint, precision="bf16")
    assert all(p.dtype == torch.bfloat16 for p in backend.model.parameters())  # converted once, not autocast
    boxes, scores = backend.infer(synthetic_images(IMGSZ, count=1))
    assert boxes.dtype == scores.dtype == torch.float32  # the decode stays FP32


def test_fused_backend_gives_the_live_models_detections(model: YOLO, checkpoint: Path) -> None:
    """The prepared copy (BatchNorm folded) against the unfused model training evaluates with."""
    images = synthetic_images(IMGSZ, count=3)
    live = make_torch_infer(model, precision=Precision("fp32", "cpu", "test"), nms=NMS, device=torch.device("cpu"))
    backend = load_backend(checkpoint, nms=NMS)
    assert backend.name == "pytorch fp32" and not any(isinstance(m, torch.nn.BatchNorm2d) for m in backend.model.modules())
    assert_same_detections(live(images), backend(images), nms=NMS, tolerance=fp32_tolerance_on(model, images))


def test_the_cpu_backend_runs_every_convolution_channels_last(checkpoint: Path) -> None:
    """oneDNN's NHWC kernels ran the nano model 15-18% faster than NCHW on a 2-core AVX2 CPU (docs/inference.md)."""
    backend = load_backend(checkpoint, device="cpu")
    # Every convolution of the network; the DFL's frozen 1x1 (the box decode's bin weights) is not called as one.
    convolutions = [m for name, m in backend.model.named_modules() if isinstance(m, torch.nn.Conv2d)
                    and not name.endswith("dfl.conv")]
    layouts: list[bool] = []
    # Channels innermost (NHWC order), not "contiguous": C2f's bottlenecks read a channel slice of a dense map.
    hooks = [m.register_forward_pre_hook(lambda _, inputs: layouts.append(inputs[0].stride(1) == 1))
             for m in convolutions]
    try:
        backend.infer(synthetic_images(IMGSZ, count=2))
    finally:
        for hook in hooks:
            hook.remove()
    assert len(layouts) == len(convolutions) and all(layouts)
    spatial = [m for m in convolutions if m.weight.shape[-1] > 1]  # a 1x1 kernel's weight is both layouts at once
    assert all(m.weight.is_contiguous(memory_format=torch.channels_last) for m in spatial)


def test_half_means_fp16_on_cuda_and_bf16_only_on_cpus_that_have_it() -> None:
    assert half_precision("cuda:0") == "fp16"
    assert half_precision("cpu") == ("bf16" if has_native_bf16("cpu") else "fp32")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="FP16 weights and CUDA graphs run on a GPU")
def test_fp16_cuda_graph_backend_matches_fp32(model: YOLO, checkpoint: Path) -> None:
    images = synthetic_images(IMGSZ, count=3)
    fast = load_backend(checkpoint, device="cuda", precision="fp16", nms=NMS)
    assert fast.name == "pytorch fp16 cuda graph"
    assert all(p.dtype == torch.float16 for p in fast.model.parameters())
    expected = load_backend(checkpoint, nms=NMS)(images)
    first = fast(images.cuda())
    fast(images[:1].cuda())
    again = fast(images.cuda())  # replayed from the graph captured by the first call
    assert len(fast.forward.graphs) == 2  # one per input shape
    # FP16 storage rounds every weight and activation: depth * eps_fp16 relative (tests/tolerances.py).
    tolerance = fp32_tolerance_on(model, images, relative=rounded_relative_error(model, 2**-10))
    assert_same_detections(expected, first, nms=NMS, tolerance=tolerance)
    for got, want in zip(again, first):
        assert all(torch.equal(got[key], want[key]) for key in ("boxes", "scores", "labels"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs capture on a GPU")
def test_a_failed_capture_says_so_once_and_runs_eagerly() -> None:
    """A forward that reads the device from the host cannot be captured: the runner warns once, with the error,
    and returns the eager result from then on, for this shape and every later one."""
    from detector.inference.cuda_graph import CudaGraphRunner

    runner = CudaGraphRunner(lambda x: x * 2 if x.sum().item() > 0 else x)  # .item(): a host read
    inputs = torch.arange(1.0, 7.0, device="cuda").reshape(2, 3)
    with pytest.warns(UserWarning, match="cuda graphs: capture failed"):
        assert torch.equal(runner(inputs), inputs * 2)
    assert runner.failed is not None and not runner.graphs
    assert torch.cuda.current_stream() == torch.cuda.default_stream()  # not left on the capture's side stream
    # The allocator knows the capture is over (torch releases that ended it only after checking the error kept it
    # "underway" and freed no cached memory): a freed block goes back to the GPU again.
    before = torch.cuda.memory_reserved()
    block = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    del block
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved() <= before
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once: no second warning, no second capture
        assert torch.equal(runner(inputs[:1]), inputs[:1] * 2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs capture on a GPU")
def test_a_failed_capture_gives_the_earlier_graphs_memory_back() -> None:
    """The capture's start takes a use of the runner's pool that only an ended capture returns: after a failed one,
    the pool, and the earlier graphs' 0.5 GB of buffers, must still go back to the GPU once the graphs are dropped."""
    from detector.inference.cuda_graph import CudaGraphRunner

    runner = CudaGraphRunner(lambda x: x * 2 if x.shape[0] > 1 or x.sum().item() > 0 else x)  # a host read at 1 row
    large = torch.ones(2, 32 << 20, device="cuda")  # 256 MB in, 256 MB out
    runner(large)
    assert runner.graphs
    del large
    torch.cuda.empty_cache()
    with_graph = torch.cuda.memory_reserved()
    with pytest.warns(UserWarning, match="cuda graphs: capture failed"):
        runner(torch.ones(1, 3, device="cuda"))
    assert not runner.graphs
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved() <= with_graph - (400 << 20)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs capture on a GPU")
def test_shapes_past_the_runners_limits_run_eagerly_and_quietly() -> None:
    """max_graphs and max_output_bytes bound what a runner keeps allocated: other shapes run the function eagerly,
    with the same result, no warning, and no capture tried again."""
    from detector.inference.cuda_graph import CudaGraphRunner

    runner = CudaGraphRunner(lambda x: x * 2 + 1, max_graphs=1)
    small, large = torch.ones(2, 3, device="cuda"), torch.ones(4, 3, device="cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(runner(small), small * 2 + 1) and torch.equal(runner(large), large * 2 + 1)
        assert len(runner.graphs) == 1 and len(runner.uncaptured) == 1 and runner.failed is None
        assert torch.equal(runner(large * 3), large * 7)  # eager again: no second capture
    calls = []
    capped = CudaGraphRunner(lambda x: calls.append(len(x)) or x * 2,  # room for the small output only
                             max_output_bytes=small.nbytes)
    assert torch.equal(capped(small), small * 2) and torch.equal(capped(large), large * 2)
    assert list(capped.graphs) == [(tuple(small.shape), small.dtype, small.stride(), small.device)]
    # the small shape's warm-up runs and capture; the large one's first run told its size and was its answer
    assert calls.count(4) == 1 and torch.equal(capped(large), large * 2) and calls.count(4) == 2


def test_every_shapes_static_input_is_a_view_of_one_memory_where_it_fits() -> None:
    """Validation's rectangular batches are several shapes: their graphs' inputs share one memory (they never replay
    at once; each call copies its input in first) instead of holding one copy each for the run. Plain tensor
    work, run here on the CPU; the graphs that read it are tested on a GPU."""
    from detector.inference.cuda_graph import CudaGraphRunner

    runner = CudaGraphRunner(lambda x: x, input_bytes=2 * 3 * 8 * 8)
    square = torch.randint(0, 255, (2, 3, 8, 8), dtype=torch.uint8)
    wide = torch.randint(0, 255, (2, 3, 6, 8), dtype=torch.uint8).contiguous(memory_format=torch.channels_last)
    first, second = runner.static_input(square), runner.static_input(wide)
    assert first.data_ptr() == second.data_ptr() == runner.input_memory[square.device].data_ptr()
    assert torch.equal(second, wide) and second.stride() == wide.stride()
    assert torch.equal(runner.static_input(square), square)  # copied in again: the same memory, this shape's bytes
    larger = torch.zeros(3, 3, 8, 8, dtype=torch.uint8)  # past the memory: a copy of its own
    assert runner.static_input(larger).data_ptr() != first.data_ptr()
    assert CudaGraphRunner(lambda x: x).static_input(square).data_ptr() != square.data_ptr()  # none shared: a copy


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs capture on a GPU")
def test_a_capture_keeps_the_page_locked_cache_and_ends_on_the_callers_stream() -> None:
    """A loader's page-locked batch memory, freed into torch's cache, is there for its next batch after a capture
    (torch.cuda.graph gives it back to the driver), and a capture that fails leaves the thread on its own stream."""
    from detector.inference.cuda_graph import capturing, end_failed_capture

    pinned = torch.empty(64 * 2**20, dtype=torch.uint8, pin_memory=True)
    del pinned  # cached now, as a batch's memory between two batches
    before = torch.cuda.host_memory_stats()
    stream, pool, x = torch.cuda.Stream(), torch.cuda.graph_pool_handle(), torch.ones(8, device="cuda")
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        x * 2  # warm-up on the capture stream, as torch asks
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with capturing(graph, pool=pool, stream=stream):
        y = x * 2
    graph.replay()
    again = torch.empty(64 * 2**20, dtype=torch.uint8, pin_memory=True)  # the next batch: the cached block
    after = torch.cuda.host_memory_stats()
    assert (after["num_host_alloc"], after["num_host_free"]) == (before["num_host_alloc"], before["num_host_free"])
    assert torch.equal(y, torch.full_like(x, 2)) and again.is_pinned()

    main, failing = torch.cuda.current_stream(), torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError):
        with capturing(failing, pool=pool, stream=stream):
            (x * 2).sum().item()  # a host read: not capturable
    end_failed_capture(x.device, pool)
    assert torch.cuda.current_stream() == main


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs capture on a GPU")
def test_a_function_of_several_outputs_replays_each_on_new_data() -> None:
    """The pt2 package's run returns a tuple (boxes and scores): each output is replayed from the graph and cloned,
    so an earlier call's results stay what they were."""
    from detector.inference.cuda_graph import CudaGraphRunner

    runner = CudaGraphRunner(lambda x: (x * 2, x.sum(dim=1)))
    first_input = torch.arange(6.0, device="cuda").reshape(2, 3)
    first = runner(first_input)
    second = runner(first_input + 1)  # replayed: the same shape
    assert len(runner.graphs) == 1 and runner.failed is None and isinstance(second, tuple)
    assert torch.equal(first[0], first_input * 2) and torch.equal(first[1], first_input.sum(dim=1))
    assert torch.equal(second[0], (first_input + 1) * 2) and torch.equal(second[1], (first_input + 1).sum(dim=1))


def test_letterbox_is_undone() -> None:
    image = np.zeros((50, 100, 3), np.uint8)  # wide: padded top and bottom
    batch, (transform,) = prepare_batch([image], 64)
    assert batch.shape == (1, 3, 64, 64) and transform.ratio == 0.64 and transform.pad == (0.0, 16.0)
    boxed = {"boxes": torch.tensor([[6.4, 22.4, 64.0, 48.0]]), "scores": torch.ones(1), "labels": torch.zeros(1)}
    torch.testing.assert_close(to_original_pixels(boxed, transform)["boxes"], torch.tensor([[10.0, 10.0, 100.0, 50.0]]))


def test_nms_graph_backend_matches_python_nms(model: YOLO, checkpoint: Path, tmp_path: Path) -> None:
    pytest.importorskip("onnx", reason="the graph is an ONNX export (the 'export' extra)")
    pytest.importorskip("onnxruntime", reason="the graph runs on onnxruntime (the 'export' extra)")
    from detector.exporting import export_onnx  # imports onnx

    baked = NMSConfig(conf_threshold=0.2, iou_threshold=0.5, max_detections=50)
    info = ModelInfo(names=["circle", "square", "triangle"], strides=model.strides, imgsz=IMGSZ, batch=1, nms=baked)
    graph = load_backend(export_onnx(model, tmp_path / "nms.onnx", info), nms=NMS)  # conf 0.3 filters the 0.2 graph
    images = synthetic_images(IMGSZ, count=2)
    python_nms = NMSConfig(conf_threshold=0.3, iou_threshold=0.5, max_detections=50)
    expected = load_backend(checkpoint, nms=python_nms)(images)
    got = graph(images)
    assert_same_detections(expected, got, nms=python_nms, tolerance=fp32_tolerance_on(model, images))


# The metadata Ultralytics 8.4 writes into `YOLO("yolov8n.yaml").export(format="onnx", imgsz=160)` (values as there).
ULTRALYTICS_METADATA = {
    "description": "Ultralytics YOLOv8n model ", "author": "Ultralytics", "date": "2026-11-28T17:14:20.590451+00:00",
    "version": "8.4.190", "license": "AGPL-3.0 License (https://ultralytics.com/license)",
    "docs": "https://docs.ultralytics.com", "stride": "32", "task": "detect", "head": "Detect", "batch": "1",
    "imgsz": "[160, 160]", "names": "{0: 'person', 1: 'bicycle'}", "channels": "3", "end2end": "False",
    "args": "{'batch': 1, 'nms': None, 'dynamic': False}",
}


def tiny_onnx(path: Path, metadata: dict[str, str]) -> Path:
    """A valid one-node ONNX graph (images -> Identity) carrying ``metadata``: only its metadata is foreign."""
    onnx = pytest.importorskip("onnx", reason="writing the ONNX file needs onnx (the 'export' extra)")
    pytest.importorskip("onnxruntime", reason="the ONNX backend needs onnxruntime (the 'export' extra)")
    tensor = onnx.helper.make_tensor_value_info
    graph = onnx.helper.make_graph([onnx.helper.make_node("Identity", ["images"], ["output0"])], "foreign",
                                   [tensor("images", onnx.TensorProto.FLOAT, [1, 3, 32, 32])],
                                   [tensor("output0", onnx.TensorProto.FLOAT, [1, 3, 32, 32])])
    proto = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    proto.ir_version = 8  # what onnxruntime of the 'export' extra reads at least
    onnx.helper.set_model_props(proto, metadata)
    path.write_bytes(proto.SerializeToString())
    return path


@pytest.mark.parametrize("metadata", [ULTRALYTICS_METADATA, {key: value for key, value in ULTRALYTICS_METADATA.items()
                                                             if key not in ("author", "description")}],
                         ids=["as-exported", "author-removed"])
def test_an_ultralytics_onnx_export_is_named_as_one(tmp_path: Path, metadata: dict[str, str]) -> None:
    """The user who brings Ultralytics' yolov8n.onnx is told it is one, which detector does not run, and what to use
    instead; not "malformed detector metadata (Expecting value ...); was it made by export.py?"."""
    path = tiny_onnx(tmp_path / "yolov8n.onnx", metadata)
    with pytest.raises(ValueError) as refused:
        load_backend(path)
    message = str(refused.value)
    assert message.startswith(f"{path}: an Ultralytics export") and "\n" not in message
    assert "yolov8*.pt" in message and "`detector export` (`python export.py` in a checkout)" in message
    assert "malformed" not in message and "Expecting value" not in message


def test_an_onnx_file_without_our_metadata_names_the_command_that_makes_it(tmp_path: Path) -> None:
    path = tiny_onnx(tmp_path / "other.onnx", {"producer": "someone"})
    with pytest.raises(ValueError, match="missing or malformed detector metadata .*; was it made by `detector export` "
                                         "\\(`python export.py` in a checkout\\)\\?$"):
        load_backend(path)


def test_an_ultralytics_engine_header_is_named_as_one(tmp_path: Path) -> None:
    """Ultralytics' .engine files start as ours do (4-byte length, JSON metadata), with its own keys inside."""
    header = json.dumps({**ULTRALYTICS_METADATA, "stride": 32, "names": {"0": "person"}}).encode()
    (tmp_path / "yolov8n.engine").write_bytes(len(header).to_bytes(4, "little") + header + b"\x00" * 8)
    with pytest.raises(ValueError, match="an Ultralytics export .*yolov8\\*\\.pt"):
        read_engine_file(tmp_path / "yolov8n.engine")


@pytest.mark.parametrize("multi_label, kept", [(False, [[0.0, 0.0], [0.8, 0.1]]), (True, [[0.6, 0.0], [0.8, 0.0]])])
def test_only_classes_drops_a_box_by_its_best_class_or_each_pair(multi_label: bool, kept: list[list[float]]) -> None:
    """As Ultralytics' ``classes``: one label per box, a box whose best class is not wanted goes (it is not relabelled
    as its best wanted one); with ``multi_label`` each (box, class) pair is kept or dropped by its class alone."""
    scores = torch.tensor([[[0.6, 0.9], [0.8, 0.1]]])  # [1 image, 2 boxes, 2 classes]
    torch.testing.assert_close(only_classes(scores, (0, 5), multi_label), torch.tensor([kept]))


def test_half_or_fp32_on_an_export_is_a_note_not_silence() -> None:
    """An export's precision was fixed when it was exported: ``--half`` on an FP32 .onnx (or val's ``--fp32`` on
    an FP16 one) says so; an export that already is what was asked, and .pt weights (converted at load), say
    nothing."""
    from types import SimpleNamespace

    from detector.inference import exported_precision_note

    def backend(precision: str) -> SimpleNamespace:
        return SimpleNamespace(info=SimpleNamespace(precision=precision))

    assert exported_precision_note("m.onnx", backend("fp32"), half=True) == (
        "note: m.onnx runs as exported (fp32); --half applies to .pt weights (export with --half for the other "
        "precision)")
    assert "runs as exported (fp16); --fp32" in exported_precision_note("m.pt2", backend("fp16"), half=False, fp32=True)
    assert exported_precision_note("m.onnx", backend("fp16"), half=True) is None
    assert exported_precision_note("m.engine", backend("fp32"), half=False) is None
    assert exported_precision_note("m.pt", backend("fp32"), half=True) is None
