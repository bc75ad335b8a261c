import pytest
import torch

import detector.training.validator as validator_module
from detector.data.build import SplitData
from detector.inference.cuda_graph import output_bytes
from detector.inference.preprocess import model_input
from detector.metrics.val_loss import LOSS_COLUMNS
from detector.model import build_model
from detector.precision import Precision
from detector.training.builders import build_criterion
from detector.training.config import TrainConfig
from detector.training.probe import PROBE_IMAGES
from detector.forked import HELPER_MIN_CORES
from detector.training.validator import BACKGROUND_EPOCH_SECONDS, Validator, scores_in_background
from detector.training.validator import validation_batch


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(num_classes=2, scale="n").eval()  # the tiny split's two classes


def _config(**overrides) -> TrainConfig:
    return TrainConfig(**{"imgsz": 64, "batch": 2, "workers": 0, "device": "cpu", **overrides})


def test_a_small_split_is_loaded_once_and_scored_the_same_from_memory(tiny_split: SplitData, monkeypatch):
    loads = []
    real_make = validator_module.make_val_loader

    def counting_make(*args, **kwargs):
        loads.append(kwargs["batch_size"])
        return real_make(*args, **kwargs)

    monkeypatch.setattr(validator_module, "make_val_loader", counting_make)
    validator = Validator(tiny_split, _config(), torch.device("cpu"), progress=False)
    assert validator.keep
    model, precision = _model(), Precision("fp32", "cpu", "test")
    first = validator.run(model, precision)
    second = validator.run(model, precision)
    assert loads == [4]  # one loader, at twice the batch on a CPU; the second pass read the kept batches
    assert validator._loader is None  # its workers are gone
    assert first.metrics == second.metrics and (first.detections == second.detections).all()


def test_a_large_split_goes_through_the_loader_every_time(tiny_split: SplitData, monkeypatch):
    monkeypatch.setattr(validator_module, "KEEP_BATCHES_BYTES", 1)
    validator = Validator(tiny_split, _config(), torch.device("cpu"), progress=False)
    assert not validator.keep
    model, precision = _model(), Precision("fp32", "cpu", "test")
    validator.run(model, precision)
    assert validator._kept is None and validator._loader is not None


def test_auto_scores_in_the_background_on_cuda_after_short_epochs_only(monkeypatch):
    cuda, cpu, short, long = torch.device("cuda"), torch.device("cpu"), 0.2, BACKGROUND_EPOCH_SECONDS
    monkeypatch.setattr(validator_module, "usable_cores", lambda: HELPER_MIN_CORES)
    assert scores_in_background("auto", cuda, short) and not scores_in_background("auto", cuda, long)
    assert not scores_in_background("auto", cpu, short)  # the worker would take cores from the step
    assert scores_in_background("on", cpu, long) and not scores_in_background("off", cuda, short)
    monkeypatch.setattr(validator_module, "usable_cores", lambda: HELPER_MIN_CORES - 1)  # a small GPU host
    assert not scores_in_background("auto", cuda, short) and scores_in_background("on", cuda, short)
    monkeypatch.setattr(validator_module, "fork_available", lambda: False)  # no fork (Windows)
    assert not scores_in_background("on", cpu, short)


def test_a_pass_scored_in_the_background_has_the_inline_scores_and_close_ends_its_worker(
        tiny_split: SplitData, watchdog):
    import multiprocessing

    children = set(multiprocessing.active_children())
    validator = Validator(tiny_split, _config(), torch.device("cpu"), progress=False)
    model, precision = _model(), Precision("fp32", "cpu", "test")
    with torch.no_grad():  # every (anchor, class) pair scores 0.5: hundreds of boxes for the evaluator
        for branch in model.head.cv3:
            branch[-1].bias.zero_()
    inline = validator.run(model, precision)
    validator.scorer().start()  # as a run does before its loaders start
    (worker,) = set(multiprocessing.active_children()) - children
    later = validator.run(model, precision, background=True)
    assert set(multiprocessing.active_children()) - children == {worker}  # the pass went to that worker
    assert later.in_background and not inline.in_background and len(later.detections) > 100
    assert later.metrics == inline.metrics and later.result.summary == inline.result.summary  # P and R too
    assert (later.result.per_class_ap == inline.result.per_class_ap).all()
    validator.close()
    assert set(multiprocessing.active_children()) <= children


def test_a_pass_computes_the_training_loss_of_the_forward_it_scores_inline_and_in_the_background(
        tiny_split: SplitData, watchdog):
    """The losses are those of the folded copy the pass runs, on the batches it scores, from the criterion the run
    trains with; a pass scored in the background has them when it returns, before its scores."""
    config = _config(batch=1)  # batches of 2 on a CPU: the tiny split's 4 images are two batches
    validator = Validator(tiny_split, config, torch.device("cpu"), progress=False)
    model, precision = _model(), Precision("fp32", "cpu", "test")
    criterion = build_criterion(config, model)
    inline = validator.run(model, precision, criterion=criterion)
    copy, batches = validator.model_for(model, precision), list(validator.batches())
    assert len(batches) == 2 and all(len(images) == 2 for images, _, _ in batches)
    expected = torch.zeros(3)
    with torch.no_grad():
        for images, targets, _ in batches:
            maps = copy(model_input(images, torch.device("cpu"), channels_last=config.channels_last))
            _, parts = criterion(maps, targets, images.shape[2:], across_ranks=False)
            expected += torch.stack([parts["box"], parts["cls"], parts["dfl"]]) / len(batches)  # equal batches
    # The same operations on the same maps: each batch's parts to the bit; two FP32 means of two terms, each
    # rounded at most twice (the sum, the division; x2 and /4 are exact): 2 units of 2**-24 either side.
    assert [inline.losses[name] for name in LOSS_COLUMNS] == pytest.approx(expected.tolist(), rel=4 * 2**-24)
    validator.scorer().start()
    later = validator.run(model, precision, background=True, criterion=criterion)
    assert later.in_background and later.losses == inline.losses  # known before the worker's scores are read
    assert later.metrics == inline.metrics
    assert validator.run(model, precision).losses == {}  # no criterion: no loss (the final report's passes)
    validator.close()


def test_validation_runs_at_the_training_batch_on_cuda_and_twice_it_on_a_cpu():
    config = _config(batch=16)
    assert validation_batch(config, torch.device("cuda")) == 16
    assert validation_batch(config, torch.device("cpu")) == 32


def test_validation_runs_a_folded_copy_made_once_per_model_and_dtype(tiny_split: SplitData):
    validator = Validator(tiny_split, _config(), torch.device("cpu"), progress=False)
    model = _model()
    fp32 = Precision("fp32", "cpu", "test")
    copy = validator.model_for(model, fp32)
    assert copy is not model and not any(isinstance(m, torch.nn.BatchNorm2d) for m in copy.modules())
    assert validator.model_for(model, fp32) is copy  # refreshed in place on the next pass
    half = validator.model_for(model, Precision("fp16", "cuda", "test"))  # built on the CPU: no GPU needed
    assert all(p.dtype == torch.float16 for p in half.parameters())
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the EMA itself stays FP32
    assert validator.model_for(model, Precision("fp32", "cuda", "final")) is not half  # the final FP32 evaluation


def test_the_time_probe_scales_the_first_rectangular_batch_to_the_mean_canvas(tmp_path, monkeypatch):
    from tests.metrics.test_loop import write_split

    split = write_split(tmp_path)  # 160 px: canvases 128x160 (2 images), 160x160 (2), 160x96 (1)
    monkeypatch.setattr(validator_module, "time_validation_images", lambda infer, images: 1.0)
    validator = Validator(split, _config(imgsz=160, batch=1), torch.device("cpu"), progress=False)
    seconds = validator.seconds_per_image(_model(), Precision("fp32", "cpu", "test"))
    mean_pixels = (2 * 128 * 160 + 2 * 160 * 160 + 160 * 96) / 5
    assert seconds == pytest.approx(mean_pixels / (128 * 160))  # the first batch is the widest landscape
    square = Validator(split, _config(imgsz=160, batch=1, val_rect=False), torch.device("cpu"), progress=False)
    assert square.seconds_per_image(_model(), Precision("fp32", "cpu", "test")) == 1.0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs capture on a GPU")
def test_cuda_validation_replays_graphs_that_follow_the_refreshed_weights(tiny_split: SplitData):
    """On CUDA a pass's forward and decode replay graphs captured in the first pass; the folded copy is refreshed
    in place, so a later pass of changed weights scores what an eager pass of them scores."""
    cudnn = torch.backends.cudnn
    saved = cudnn.deterministic, cudnn.benchmark
    cudnn.deterministic, cudnn.benchmark = True, False  # the same algorithms in both validators: equal results
    try:
        _graphed_against_eager(tiny_split)
    finally:
        cudnn.deterministic, cudnn.benchmark = saved


def _graphed_against_eager(tiny_split: SplitData) -> None:
    from tests.conftest import lively_model

    validator = Validator(tiny_split, _config(device="cuda"), torch.device("cuda"), progress=False)
    # Varied scores: a fresh model's detections are boxes clipped to the image at the prior's score, which no change
    # of its BatchNorm moves in FP16 (on the first GPU to run this test the two passes were equal).
    model, precision = lively_model(num_classes=2).cuda(), Precision("fp16", "cuda", "test")
    criterion = build_criterion(validator.config, model)
    first = validator.run(model, precision, criterion=criterion)
    runner = validator._graphs[2]
    assert runner.graphs and runner.failed is None, (runner.failed, runner.uncaptured)
    # Each graph returns the decoded boxes and the raw maps the loss reads (one a level), all counted in its cap.
    for captured in runner.graphs.values():
        decoded, *maps = captured.static_output
        assert decoded.dtype == torch.float32 and len(maps) == len(model.strides)
        assert all(level.dtype == torch.float16 for level in maps)  # the FP16 copy's, cast to FP32 for the loss
        assert output_bytes(captured.static_output) == decoded.nbytes + sum(level.nbytes for level in maps)
    with torch.no_grad():  # the EMA moves between epochs: every BatchNorm, folded into the copy's convolutions, and
        for module in model.modules():  # the class convolutions' biases, copied as they are
            if isinstance(module, torch.nn.BatchNorm2d):
                module.weight.mul_(1.05)
        for branch in model.head.cv3:
            branch[-1].bias.add_(0.5)
    graphed = validator.run(model, precision, criterion=criterion)
    assert validator._graphs[2] is runner and not runner.uncaptured  # replayed, nothing captured again
    eager = Validator(tiny_split, _config(device="cuda"), torch.device("cuda"), progress=False)
    eager._graph_runner = lambda copy, precision: None  # the eager path for the same weights
    expected = eager.run(model, precision, criterion=criterion)
    assert not (graphed.detections.shape == first.detections.shape and (graphed.detections == first.detections).all())
    # Replay runs the kernels the eager forward launched on the same inputs and weights: equal results.
    assert graphed.detections.shape == expected.detections.shape
    assert (abs(graphed.detections - expected.detections) <= 1e-3).all()
    # The loss reads the replayed maps, the eager forward's to the bit, with the same (eager, deterministic) kernels.
    assert graphed.losses == expected.losses and all(value > 0 for value in graphed.losses.values())
    assert graphed.losses != first.losses  # the changed weights' loss, not the first pass's


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a worker forked from a process with a CUDA context")
def test_a_cuda_run_scores_in_a_worker_forked_after_its_cuda_work(tiny_split: SplitData, watchdog):
    """The worker is forked from a training process with a live CUDA context and replayed graphs: it must score
    without touching CUDA, as an inline pass scores the same detections."""
    import multiprocessing

    from detector.metrics.coco import evaluate_coco, resolve_backend

    children = set(multiprocessing.active_children())
    validator = Validator(tiny_split, _config(device="cuda"), torch.device("cuda"), progress=False)
    model, precision = _model().cuda(), Precision("fp16", "cuda", "test")
    validator.run(model, precision)  # inline: the graphs are captured, the CUDA context is busy
    image_ids = tiny_split.records.image_ids.tolist()
    for _ in range(2):  # two passes, one worker
        later = validator.run(model, precision, background=True)
        expected = evaluate_coco(tiny_split.ground_truth, later.detections, image_ids=image_ids,
                                 backend=resolve_backend(validator.config.coco_eval))
        assert later.in_background and later.result.metrics == expected.metrics
        assert later.result.summary == expected.summary and later.result.evaluator == expected.evaluator
    assert not validator._scorer.failed
    validator.close()
    assert set(multiprocessing.active_children()) <= children


def test_the_time_probe_times_the_loss_a_pass_computes(tiny_split: SplitData, monkeypatch):
    """The --time probe timed inference and NMS alone, while each pass also computes the loss (5-11% of a CPU
    pass): it now runs the criterion on its images' own boxes."""
    calls: list[int] = []
    config = _config(batch=2)
    model, precision = _model(), Precision("fp32", "cpu", "test")
    criterion = build_criterion(config, model)

    def counted(maps, targets, image_hw, **kwargs):
        calls.append(int(targets[:, 0].max()) + 1 if len(targets) else 0)
        return type(criterion).__call__(criterion, maps, targets, image_hw, **kwargs)

    validator = Validator(tiny_split, config, torch.device("cpu"), progress=False)
    assert validator.seconds_per_image(model, precision, criterion=counted) > 0
    assert calls and max(calls) <= PROBE_IMAGES  # twice (warm, timed), on the probed images' boxes
    assert validator.seconds_per_image(model, precision) > 0 and len(calls) == 2  # no criterion: none
