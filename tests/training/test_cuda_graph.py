"""CUDA graphs of the training step: the parts that run on the CPU here, and the capture itself on a GPU.

The CPU tests check what the captured step is made of (the body on static buffers, the device-side EMA and
step skipping, the switch); they never claim a graph was captured. The capture tests skip without CUDA.
"""

import contextlib
import copy
import dataclasses
import re
from collections.abc import Iterator

import pytest
import torch

import detector.loss
from detector.data.letterbox import ImageMeta
from detector.loss import DetectionLoss, box_slots, frequency_weights, most_boxes_per_image, targets_to_padded
from detector.model import build_model
from detector.model.recompute import recompute_activations
from detector.precision import Precision, fp32_settings_kept, set_strict_fp32
from detector.training.cuda_graph import (DeviceEMA, StaticBatch, StaticInputs, StepGraphs, graphs_unavailable,
                                          skip_on_device, tensor_learning_rates)
from detector.training.ema import ModelEMA
from detector.training.engine import TrainStep, graphed_body, optimizer_step, train_one_epoch
from detector.training.graph_keys import RUNS_FOR_A_KNOWN_SHAPE, WARMUP_RUNS
from detector.training.multiscale import MultiScale
from detector.training.optim import build_optimizer
from detector.training.schedule import StepSchedule
from tests.host_reads import HostReads
from tests.tolerances import FP32_EPS

cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")


def _train_step(device: str, *, precision: str = "fp32", cuda_graphs: str = "off", optimizer: str = "SGD",
                warmup_steps: int = 0, steps_per_epoch: int = 6, warmup_momentum: float = 0.9,
                nominal_batch: int = 2, num_classes: int = 2, channels_last: bool = False,
                recompute: bool = False, class_weights: torch.Tensor | None = None, scale: str = "n") -> TrainStep:
    """A small run's TrainStep on ``device``: the nano model (YOLOv8n unless ``scale`` says), 2 images per step, no
    accumulation (unless ``nominal_batch`` asks for it); ``channels_last`` and ``recompute`` as the trainer's CUDA
    defaults have them."""
    torch.manual_seed(0)
    model = build_model(num_classes=num_classes, scale=scale).to(device)
    if channels_last:
        model.to(memory_format=torch.channels_last)
    recompute_activations(model, recompute)
    choice = build_optimizer(model, name=optimizer, lr=1e-3, momentum=0.9, weight_decay=5e-4, num_classes=num_classes,
                             total_steps=steps_per_epoch)
    schedule = StepSchedule(epochs=1, steps_per_epoch=steps_per_epoch, warmup_steps=warmup_steps,
                            base_lr=choice.lr, final_lr_fraction=0.5, cosine=False, warmup_bias_lr=0.0,
                            warmup_momentum=warmup_momentum, momentum=0.9, batch_size=2, nominal_batch=nominal_batch,
                            clip_grad=10.0)
    chosen = Precision(precision, torch.device(device).type, "test")
    criterion = DetectionLoss.for_model(model, class_weights=None if class_weights is None
                                        else class_weights.to(device)).to(device)
    return TrainStep(model, criterion, choice.optimizer, chosen.make_scaler(), ModelEMA(model), chosen, schedule,
                     torch.device(device), channels_last=channels_last, cuda_graphs=cuda_graphs)


def _batches(count: int, size: int = 64) -> list:
    generator = torch.Generator().manual_seed(0)
    batches = []
    for index in range(count):
        images = (torch.rand(2, 3, size, size, generator=generator) * 255).to(torch.uint8)
        boxes = 1 + index % 3  # box counts vary between batches, as they do in training
        rows = [[image, box % 2, 0.3 + 0.1 * box, 0.5, 0.2, 0.3] for image in range(2) for box in range(boxes)]
        metas = [ImageMeta(i, (size, size), 1.0, (0.0, 0.0)) for i in range(2)]
        batches.append((images, torch.tensor(rows), metas))
    return batches


def test_graphs_are_unreachable_on_the_cpu_and_when_off():
    cpu = torch.device("cpu")
    assert "CUDA" in graphs_unavailable("auto", cpu, world_size=1)
    assert "CUDA" in graphs_unavailable("on", cpu, world_size=1)
    assert graphs_unavailable("off", torch.device("cuda"), world_size=1) == "--cuda-graphs off"
    assert "torchrun" in graphs_unavailable("auto", torch.device("cuda"), world_size=2)
    with pytest.raises(ValueError, match="--cuda-graphs"):
        graphs_unavailable("always", cpu, world_size=1)
    step = _train_step("cpu", cuda_graphs="on")
    assert step.step_graphs([p for p in step.model.parameters()]) is None and step.graphs is None


def test_the_cpu_loop_with_cuda_graphs_on_trains_as_with_them_off():
    """On the CPU the switch changes nothing: the same losses and weights, bit for bit."""
    results = []
    for choice in ("on", "off"):
        step = _train_step("cpu", cuda_graphs=choice)
        stats = train_one_epoch(step, _batches(2), multi_scale=MultiScale(64, enabled=False), epoch=0, seed=0,
                                progress=False)
        results.append((stats, step.model.state_dict()))
    for key in ("train/box", "train/cls", "train/dfl"):
        assert results[0][0][key] == results[1][0][key]
    assert all(torch.equal(v, results[1][1][k]) for k, v in results[0][1].items())
    assert not any(key.startswith("graph_") for stats, _ in results for key in stats)  # no graphs: no graph columns


def test_graph_costs_report_what_an_epoch_added():
    from detector.training.cuda_graph import GraphCosts
    from detector.training.verdicts import graph_costs_text

    costs = GraphCosts(captures=2, capture_seconds=0.5, eager_steps=4)
    before = dataclasses.replace(costs)
    costs.captures, costs.capture_seconds, costs.eager_steps = 5, 1.75, 9
    epoch = costs.since(before)
    assert epoch == {"graph_captures": 3, "graph_capture_seconds": 1.25, "graph_eager_steps": 5}
    assert graph_costs_text(epoch) == ", 3 graphs captured in 1.2 s, 5 eager steps"  # 1.25 rounds to even
    assert graph_costs_text(costs.since(costs)) == "" and graph_costs_text({}) == ""
    one = {"graph_captures": 1, "graph_eager_steps": 1}
    assert graph_costs_text(one) == ", 1 graph captured in 0.0 s, 1 eager step"


def test_device_ema_matches_the_model_ema():
    torch.manual_seed(0)
    model = build_model(num_classes=2)
    host, device = ModelEMA(model, decay=0.9), ModelEMA(model, decay=0.9)
    on_device = DeviceEMA(device, model)
    largest = {k: v.abs().max() for k, v in model.state_dict().items() if v.is_floating_point()}
    for _ in range(3):
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(torch.randn_like(parameter) * 0.1)
        largest = {k: torch.maximum(m, model.state_dict()[k].abs().max()) for k, m in largest.items()}
        host.update(model)
        on_device.advance()
        on_device.update()
    assert device.updates == host.updates == 3
    # lerp(a, b, w) and a + w * (b - a) each round b - a, the product and the sum: at most 2 eps of the largest
    # value involved (M, the tensor's largest magnitude over the steps) apart per update. Three updates, each
    # keeping an earlier error at most once (weight <= 1): 6 eps M bounds the difference.
    for (name, a), b in zip(host.module.state_dict().items(), device.module.state_dict().values()):
        if a.is_floating_point():
            assert ((a - b).abs() <= 6 * FP32_EPS * largest[name]).all(), name


def test_skip_on_device_steps_or_skips_like_the_host_decision():
    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1, momentum=0.9, fused=True)
    reference = copy.deepcopy(layer)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9, fused=True)
    for module, stepper in ((layer, optimizer), (reference, reference_optimizer)):
        module(torch.ones(1, 3)).pow(2).sum().backward()
        stepper.step()  # one ordinary step first: the momentum buffers exist, as after the eager warm-up
        stepper.zero_grad()
        module(torch.ones(1, 3)).pow(2).sum().backward()
    before = [p.clone() for p in layer.parameters()]
    momentum = [optimizer.state[p]["momentum_buffer"].clone() for p in layer.parameters()]
    skip_on_device(optimizer, torch.tensor(False))
    assert all(torch.equal(a, b) for a, b in zip(before, layer.parameters()))  # skipped on the kernel's side
    assert all(torch.equal(m, optimizer.state[p]["momentum_buffer"]) for m, p in zip(momentum, layer.parameters()))
    assert not hasattr(optimizer, "found_inf")
    skip_on_device(optimizer, torch.tensor(True))
    reference_optimizer.step()
    assert all(torch.equal(a, b) for a, b in zip(reference.parameters(), layer.parameters()))
    assert not torch.equal(before[0], layer.weight)


def test_the_graph_body_does_what_the_eager_step_does():
    """The body a graph records, run eagerly on the CPU: the eager loop's loss, update and EMA."""
    batch_images = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    _, targets, _ = _batches(2)[1]
    eager, graphed = _train_step("cpu"), _train_step("cpu")

    loss, _ = eager.criterion(eager.model(batch_images), targets, (64, 64))
    loss.backward()
    parameters = [p for p in eager.model.parameters() if p.requires_grad]
    eager_result = optimizer_step(model=eager.model, parameters=parameters, optimizer=eager.optimizer,
                                  scaler=eager.scaler, ema=eager.ema, precision=eager.precision, clip_grad=10.0,
                                  loss_was_finite=True)

    padded = targets_to_padded(targets, 2, (64, 64), slots=box_slots(most_boxes_per_image(targets, 2)))
    assert padded.mask.shape[1] == 16  # padded beyond the 2 boxes per image
    ema = DeviceEMA(graphed.ema, graphed.model)
    ema.advance()
    body = graphed_body(graphed, [p for p in graphed.model.parameters() if p.requires_grad], ema)
    outputs = body(StaticBatch(batch_images.clone(), padded, torch.tensor(True)), True)

    assert bool(outputs["applied"]) and bool(eager_result.applied) and not bool(outputs["unstable"])
    assert all(torch.equal(a, b) for a, b in zip(eager.model.parameters(), graphed.model.parameters()))
    trained = [p for p in graphed.model.parameters() if p.requires_grad]
    assert all(p.grad is not None and not p.grad.any() for p in trained)  # zeroed, not freed
    # EMA: one update by two formulas, 2 eps of the largest magnitude apart (see test_device_ema_matches_the_model_ema).
    before = _train_step("cpu").model.state_dict()  # the EMA's starting point: the initial weights
    for (name, a), b in zip(eager.ema.module.state_dict().items(), graphed.ema.module.state_dict().values()):
        if a.is_floating_point():
            largest = torch.maximum(before[name].abs().max(), eager.model.state_dict()[name].abs().max())
            assert ((a - b).abs() <= 2 * FP32_EPS * largest).all(), name


def test_host_reads_sees_a_mask_index_an_item_a_tensor_from_data_and_a_copy():
    """The detector below is only as good as what it catches: four host reads it must see."""
    values = torch.rand(8)
    with HostReads() as reads:
        values[values > 0.5] = values[0]
        values.sum().item()
        torch.tensor([1.0, 2.0])
        values.tolist()
    assert [seen.split(" at ")[0] for seen in reads.seen] == ["aten::index_put_ with a boolean mask",
                                                              "aten::_local_scalar_dense", "aten::lift_fresh",
                                                              "Tensor.tolist"]
    assert not {"cpu", "tolist", "numpy"} & set(torch.Tensor.__dict__)  # the patches are undone


@pytest.mark.parametrize("precision,optimizer,chunked", [("fp32", "SGD", False), ("fp16", "SGD", True),
                                                          ("fp32", "AdamW", True), ("fp16", "AdamW", False)])
def test_the_graph_body_reads_nothing_on_the_host(optimizer, precision, chunked, monkeypatch):
    """The whole recorded step (forward, the loss on its fixed foreground slots, backward, optimizer, EMA) on the
    CPU, under HostReads: any operator that a capture would reject fails here first, with its name. As the graphs run it:
    learning rates in tensors (and AdamW capturable), and in FP16 a real GradScaler handing its inf check to the
    fused optimizer (CPU autocast does FP16 too, and torch's CPU GradScaler is the CUDA one's code). ``chunked``:
    the assigner takes one image at a time, as at batch 64 on a GPU (detector.loss.assignment_chunks)."""
    if chunked:
        monkeypatch.setattr(detector.loss, "ASSIGNER_CHUNK_ELEMENTS", 1)
    step = _train_step("cpu", optimizer=optimizer, precision=precision)
    assert step.scaler.is_enabled() == (precision == "fp16")
    images = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    _, targets, _ = _batches(3)[2]
    padded = targets_to_padded(targets, 2, (64, 64), slots=box_slots(most_boxes_per_image(targets, 2)))
    ema = DeviceEMA(step.ema, step.model)
    body = graphed_body(step, [p for p in step.model.parameters() if p.requires_grad], ema)
    batch = StaticBatch(images, padded, torch.tensor(True))
    learning_rates = [torch.full((1,), group["lr"]) for group in step.optimizer.param_groups]
    with tensor_learning_rates(step.optimizer, learning_rates):
        body(batch, True)  # as before a capture: the eager runs make the optimizer's lazy state
        ema.advance()
        with HostReads() as reads:
            outputs = body(batch, True)
    assert not reads.seen, "host reads in the captured step:\n" + "\n".join(sorted(set(reads.seen)))
    assert bool(outputs["applied"])  # read after the mode: the step ran and was applied
    assert all(isinstance(group["lr"], float) for group in step.optimizer.param_groups)  # plain floats again


# ----------------------------------------------------------------------------------------- on a GPU


@cuda_only
@pytest.mark.parametrize("precision,optimizer,warmup_steps,chunked,cuda_defaults,weighted,scale", [
    ("fp16", "SGD", 0, False, False, False, "n"), ("fp32", "AdamW", 0, False, False, False, "n"),
    ("fp16", "AdamW", 5, False, False, False, "n"), ("fp32", "SGD", 5, False, False, False, "n"),
    ("fp16", "SGD", 0, True, False, False, "n"), ("fp16", "AdamW", 3, False, True, False, "n"),
    ("fp16", "AdamW", 0, False, True, True, "n"), ("fp16", "AdamW", 3, False, True, False, "11n"),
    ("fp16", "AdamW", 0, False, True, False, "26n")])
def test_captured_steps_train_as_the_eager_ones(precision, optimizer, warmup_steps, chunked, cuda_defaults, weighted,
                                                scale, monkeypatch):
    """Graphs are captured and replayed (not failed), and train to the eager run's weights and losses; in warm-up,
    whose momentum ramps (0.8 -> 0.9 here), graphs of the forward and backward passes with eager optimizer steps.
    ``chunked``: the assigner one image at a time, as at batch 64 (detector.loss.assignment_chunks).
    ``cuda_defaults``: what a CUDA run trains with by default besides FP16 and AdamW (short runs): a channels-last
    model and input, and BatchNorm's largest outputs recomputed in the backward pass (detector/model/recompute.py).
    ``weighted``: --cls-pw's class weights, a buffer on the device multiplied into the captured BCE. ``scale`` 11n:
    YOLO11, whose attention reshapes a channels-last map inside the graph; 26n: YOLO26, two head branches and two
    assignments in one graph, and a second epoch whose branch weights (a buffer the graph reads) differ from the
    first's: the replays must follow them as the eager steps do."""
    if chunked:
        monkeypatch.setattr(detector.loss, "ASSIGNER_CHUNK_ELEMENTS", 1)
    results = []
    for choice in ("on", "off"):
        step = _train_step("cuda", precision=precision, optimizer=optimizer, cuda_graphs=choice, steps_per_epoch=10,
                           warmup_steps=warmup_steps, warmup_momentum=0.8 if warmup_steps else 0.9,
                           channels_last=cuda_defaults, recompute=cuda_defaults,
                           class_weights=frequency_weights(torch.tensor([30, 5]), 1.0) if weighted else None,
                           scale=scale)
        with same_kernels():
            for epoch in range(2 if scale == "26n" else 1):  # _train_step plans 1 epoch: the weights go 0.8 -> 0.1
                stats = train_one_epoch(step, _batches(10), multi_scale=MultiScale(64, enabled=False), epoch=epoch,
                                        seed=0, progress=False)
        results.append((stats, step))
    (graphed_stats, graphed), (eager_stats, eager) = results
    assert graphed.graphs is not None and graphed.graphs.failed is None and graphed.graphs.graphs
    # The epoch's costs, as results.csv has them: every capture (warm-up's dropped ones too) and every eager run
    assert graphed_stats["graph_captures"] >= len(graphed.graphs.graphs) > 0
    assert graphed_stats["graph_eager_steps"] == sum(graphed.graphs.runs.values()) > 0
    assert graphed_stats["graph_capture_seconds"] > 0 and "graph_captures" not in eager_stats
    if warmup_steps:  # a backward-only graph replayed in warm-up, and a whole step's after it
        assert {key[2] for key in graphed.graphs.runs} == {False, True}
    assert any(getattr(module, "recompute", False) for module in graphed.model.modules()) is cuda_defaults
    assert graphed_stats["optimizer_steps"] == eager_stats["optimizer_steps"] == 10
    assert graphed.ema.updates == eager.ema.updates == 10 * (2 if scale == "26n" else 1)
    # Replay runs the kernels the eager step launched, and same_kernels() makes cuDNN choose the same (deterministic)
    # algorithms in both runs: what may differ is rounding. 10 steps of a lr-1e-3 optimizer move weights by ~1e-2;
    # allow a thousandth of that.
    for a, b in zip(graphed.model.parameters(), eager.model.parameters()):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-3)
    for key in ("train/box", "train/cls", "train/dfl"):
        assert graphed_stats[key] == pytest.approx(eager_stats[key], rel=1e-3)


@cuda_only
def test_graphs_of_several_input_sizes_share_one_image_memory_and_train_as_the_eager_steps():
    """Multi-scale: every size's graph reads its images from the front of one memory made for the largest size, and
    each fill before a replay is what that replay reads (SGD, whose weights follow the gradients' size: see
    same_kernels)."""
    multi_scale = MultiScale(64, low=0.5, high=1.5, hold=2)  # 32-96 px, a new draw every two steps
    assert len(set(multi_scale.sizes(12, seed=0, epoch=0))) >= 3
    results = []
    for choice in ("on", "off"):
        step = _train_step("cuda", precision="fp16", cuda_graphs=choice, steps_per_epoch=12)
        with same_kernels():
            stats = train_one_epoch(step, _batches(12), multi_scale=multi_scale, epoch=0, seed=0, progress=False)
        results.append((stats, step))
    (graphed_stats, graphed), (eager_stats, eager) = results
    graphs = graphed.graphs
    assert graphs is not None and graphs.failed is None and len({key[0] for key in graphs.graphs}) >= 2
    memory = graphs.inputs.images_memory
    # made once, for the largest size, in FP16: the input's dtype under FP16 autocast (step_input_dtype)
    assert memory is not None and memory.numel() == 2 * 3 * multi_scale.largest() ** 2 * 2
    assert {batch.images.data_ptr() for batch in graphs.batches.values()} == {memory.data_ptr()}
    for a, b in zip(graphed.model.parameters(), eager.model.parameters()):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-3)  # as in test_captured_steps_train_as_the_eager_ones
    for key in ("train/box", "train/cls", "train/dfl"):
        assert graphed_stats[key] == pytest.approx(eager_stats[key], rel=1e-3)


@cuda_only
def test_device_path_inputs_rendered_into_the_graphs_memory_train_as_eager_steps_with_accumulation(tmp_path):
    """The fused kernel renders each step's mosaic batch straight into the graphs' one image memory (step_input's
    out), sizes changing every step and two micro-steps an optimizer step: the weights end as the eager run's."""
    from torch.utils.data import DataLoader

    from detector.data.dataset import collate
    from tests.conftest import write_records
    from tests.data.test_device_augment import _datasets

    _, _, device_items = _datasets(write_records(tmp_path, 4, seed=3), albumentations=0.0)
    items = [device_items[(index % 4, index // 4, True)] for index in range(48)]
    multi_scale = MultiScale(64, low=0.5, high=1.5, hold=1)  # 32-96 px, a new draw every step
    results = []
    for choice in ("on", "off"):
        step = _train_step("cuda", precision="fp32", cuda_graphs=choice, steps_per_epoch=24, nominal_batch=4,
                           num_classes=3)
        step.channels_last = True
        with same_kernels():
            stats = train_one_epoch(step, DataLoader(items, batch_size=2, collate_fn=collate), multi_scale=multi_scale,
                                    epoch=0, seed=0, progress=False)
        results.append((stats, step))
    (graphed_stats, graphed), (eager_stats, eager) = results
    graphs = graphed.graphs
    assert graphs is not None and graphs.failed is None and graphs.graphs
    assert {batch.images.data_ptr() for batch in graphs.batches.values()} == {graphs.inputs.images_memory.data_ptr()}
    assert graphed_stats["optimizer_steps"] == eager_stats["optimizer_steps"] == 12
    for a, b in zip(graphed.model.parameters(), eager.model.parameters()):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-3)  # as in test_captured_steps_train_as_the_eager_ones


@contextlib.contextmanager
def same_kernels() -> Iterator[None]:
    """cuDNN's deterministic algorithms (no autotuning) in true FP32, flags restored on exit.

    Without this, the two runs above may use different convolution algorithms (autotuning picks per run) or TF32,
    and AdamW amplifies the difference: it moves every weight by about its learning rate per step whatever the
    gradient's size, so a weight whose gradient is near zero follows the sign of rounding noise. On an H200 the
    FP32 AdamW case differed by 2e-3 after 8 steps; on the CPU, 1e-6 relative noise put on every gradient changed
    the run's total weight movement by 0.3%. SGD moves weights by lr x gradient and hides it.
    """
    cudnn = torch.backends.cudnn
    saved = cudnn.deterministic, cudnn.benchmark
    with fp32_settings_kept():
        set_strict_fp32()
        cudnn.deterministic, cudnn.benchmark = True, False
        try:
            yield
        finally:
            cudnn.deterministic, cudnn.benchmark = saved


@cuda_only
@pytest.mark.parametrize("nominal_batch", [2, 4])
def test_warm_up_graphs_are_dropped_when_it_ends_unless_accumulation_replays_them(nominal_batch):
    """Without accumulation no step after warm-up ends without the optimizer: its graphs go, and only whole steps'
    remain; with it (2 micro-batches a step here) the micro-steps replay them after warm-up too."""
    step = _train_step("cuda", precision="fp16", cuda_graphs="on", warmup_steps=4, steps_per_epoch=10,
                       nominal_batch=nominal_batch)
    stats = train_one_epoch(step, _batches(10), multi_scale=MultiScale(64, enabled=False), epoch=0, seed=0,
                            progress=False)
    graphs = step.graphs
    assert graphs is not None and graphs.failed is None
    assert {key[2] for key in graphs.runs} == {False, True}  # both kinds ran
    kept = {key[2] for key in graphs.graphs}
    assert kept == ({True} if nominal_batch == 2 else {False, True}), kept
    assert set(graphs.batches) == set(graphs.graphs)  # a dropped graph's place in the bookkeeping went with it
    # Accumulating 2: warm-up steps at 0, 1 and 3 (its accumulation ramps 1 -> 2), then at 5, 7 and the epoch's last.
    assert stats["optimizer_steps"] == (10 if nominal_batch == 2 else 6)


def _crowded_from(batches: list, indices: range) -> list:
    """``batches`` with 20 boxes an image (32 box slots) in those at ``indices``; the others keep at most 3 (16)."""
    for index in indices:
        images, _, metas = batches[index]
        rows = torch.tensor([[image, box % 2, 0.1 + 0.04 * box, 0.5, 0.03, 0.3]
                             for image in range(2) for box in range(20)])
        batches[index] = images, rows, metas
    return batches


def _graphed_against_eager(batches: list) -> StepGraphs:
    """One FP16 epoch of ``batches`` with CUDA graphs and one without; asserts they train alike (the bound of the
    test above) and returns the graphed run's graphs."""
    results = []
    for choice in ("on", "off"):
        step = _train_step("cuda", precision="fp16", cuda_graphs=choice, steps_per_epoch=len(batches))
        with same_kernels():
            stats = train_one_epoch(step, batches, multi_scale=MultiScale(64, enabled=False), epoch=0, seed=0,
                                    progress=False)
        results.append((stats, step))
    (graphed_stats, graphed), (eager_stats, eager) = results
    for a, b in zip(graphed.model.parameters(), eager.model.parameters()):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-3)
    for key in ("train/box", "train/cls", "train/dfl"):
        assert graphed_stats[key] == pytest.approx(eager_stats[key], rel=1e-3)
    assert graphed.graphs is not None and graphed.graphs.failed is None
    return graphed.graphs


@cuda_only
def test_a_new_box_slot_count_of_a_known_shape_warms_up_once_and_trains_as_eager():
    """Batches 0-4 hold at most 3 boxes an image (16 slots), 5-9 hold 20 (32 slots): the second key shares the
    first one's input shape, runs eagerly once, is captured, and the run matches an eager one."""
    graphs = _graphed_against_eager(_crowded_from(_batches(10), range(5, 10)))
    runs = sorted((key[1], runs) for key, runs in graphs.runs.items())
    assert runs == [(16, WARMUP_RUNS), (32, RUNS_FOR_A_KNOWN_SHAPE)], runs
    assert {key[1] for key in graphs.graphs} == {16, 32}


@cuda_only
def test_a_smaller_box_count_replays_the_larger_key_of_its_shape_and_trains_as_eager():
    """Batches 0-4 hold 20 boxes an image (32 slots), 5-9 at most 3 (16 slots): the key book pads the later ones to
    the 32-slot key (well within its budget at this size) instead of opening a 16-slot one, and the run matches an
    eager one (padding changes neither the assignment nor the gradients)."""
    graphs = _graphed_against_eager(_crowded_from(_batches(10), range(5)))
    assert graphs.graphs and all(key[1] == 32 for key in graphs.graphs)
    assert graphs.book.padding and all(key[1] == 16 for key in graphs.book.padding)  # the 16-slot batches rode it


@cuda_only
def test_graphs_capture_after_eager_steps_on_the_default_stream():
    """Eager steps on the default stream first (as warm-up ran until warm-up graphed its backward passes too; a run
    whose graphs are turned on later), then the captures on the graphs' own stream: a graph the eager steps'
    autograd nodes outlived failed here (tests/training/test_engine.py checks none does)."""
    step = _train_step("cuda", precision="fp16", cuda_graphs="off", warmup_steps=3, steps_per_epoch=8)
    train_one_epoch(step, _batches(8), multi_scale=MultiScale(64, enabled=False), epoch=0, seed=0, progress=False)
    assert step.graphs is None
    step.cuda_graphs, step.graphs_checked = "auto", False
    train_one_epoch(step, _batches(8), multi_scale=MultiScale(64, enabled=False), epoch=1, seed=0, progress=False)
    assert step.graphs is not None and step.graphs.failed is None and step.graphs.graphs


@cuda_only
def test_steps_in_warm_up_graph_no_optimizer_and_a_failed_capture_falls_back():
    step = _train_step("cuda", precision="fp16", cuda_graphs="on", warmup_steps=100)
    train_one_epoch(step, _batches(4), multi_scale=MultiScale(64, enabled=False), epoch=0, seed=0, progress=False)
    assert step.graphs is not None and step.graphs.failed is None
    assert step.graphs.runs and not any(key[2] for key in step.graphs.runs)  # the optimizer stayed eager

    step = _train_step("cuda", precision="fp16", cuda_graphs="on")
    lines = []
    graphs = step.step_graphs([p for p in step.model.parameters() if p.requires_grad])
    graphs.log = lines.append
    real_body = graphs.body

    def body_with_a_sync(batch, with_optimizer):
        outputs = real_body(batch, with_optimizer)
        outputs["parts"].sum().item()  # a host read: illegal inside a capture
        return outputs

    graphs.body = body_with_a_sync
    stats = train_one_epoch(step, _batches(6), multi_scale=MultiScale(64, enabled=False), epoch=0, seed=0,
                            progress=False)
    assert graphs.failed and len(lines) == 1 and "capture failed" in lines[0]
    assert stats["optimizer_steps"] == 6 and step.ema.updates == 6


def test_a_failed_capture_names_the_first_error_and_its_line():
    """What a capture raises last is CUDA's "previous error during capture"; the line names the error before it
    and the innermost line of ours that met it (here a shape error inside detector/boxes.py stands for it)."""
    from detector.boxes import distances_to_boxes
    from detector.training.cuda_graph import capture_failure

    try:
        try:
            distances_to_boxes(torch.rand(3, 2), torch.rand(4, 4))
        finally:
            raise RuntimeError("CUDA error: operation failed due to a previous error during capture\nSearch for ...")
    except RuntimeError as error:
        line = capture_failure(error)
    first = line.split(", at ")[0]
    assert "size of tensor" in first and "previous error" not in first, line
    assert re.fullmatch(r".*, at detector/boxes\.py:\d+", line), line
    assert capture_failure(ValueError("plain\nsecond line")) == "plain"  # no context, no frame of ours


def test_every_input_shape_views_one_image_memory_and_keys_of_one_box_count_share_the_targets() -> None:
    """A graph key is (input shape, box slots, with the optimizer): at batch 64 in FP32 an image buffer per input
    shape held 1.6 GB over the five default sizes, so every shape's buffer views one memory sized for the largest."""
    targets = torch.tensor([[0, 1, 0.5, 0.5, 0.2, 0.2], [1, 2, 0.3, 0.3, 0.1, 0.1]])
    inputs = StaticInputs()
    images = torch.zeros(2, 3, 64, 64).contiguous(memory_format=torch.channels_last)
    # As the engine does: the step's buffer asked for first, for the run's largest side, and the input made in it.
    buffer = inputs.image_buffer((2, 3, 64, 64), torch.device("cpu"), channels_last=True, largest_side=96)
    sixteen = inputs.for_batch(buffer, targets_to_padded(targets, 2, (64, 64), slots=16))
    again = inputs.for_batch(buffer, targets_to_padded(targets, 2, (64, 64), slots=16))
    more_slots = inputs.for_batch(images, targets_to_padded(targets, 2, (64, 64), slots=32))  # copied into it
    larger = inputs.for_batch(torch.zeros(2, 3, 96, 96), targets_to_padded(targets, 2, (96, 96), slots=16))
    assert sixteen.images is buffer and more_slots.images is buffer
    memory = inputs.images_memory
    assert memory is not None and memory.numel() == 2 * 3 * 96 * 96 * 4  # made once, for the largest input
    assert sixteen.images.data_ptr() == more_slots.images.data_ptr() == larger.images.data_ptr() == memory.data_ptr()
    assert sixteen.images.is_contiguous(memory_format=torch.channels_last)  # the layout of the batch it is for
    assert larger.images.is_contiguous() and larger.images.shape == (2, 3, 96, 96)
    assert sixteen.images.stride() == images.stride() and sixteen.images.dtype == images.dtype
    assert all(a.data_ptr() == b.data_ptr() for a, b in zip(sixteen.targets, again.targets))
    assert sixteen.targets.mask.shape[1] == 16 and more_slots.targets.mask.shape[1] == 32
    assert sixteen.earlier_finite is larger.earlier_finite
    assert len(inputs.images) == 2 and len(inputs.targets) == 2


def test_a_fill_reaches_only_its_own_views_bytes_and_memory_grows_when_the_largest_side_was_not_given() -> None:
    """Without ``largest_side`` (``for_batch`` alone) the memory is made for the first input; a larger input gets a
    larger memory, and the first key's view keeps the old one (its graph recorded that address)."""
    targets = targets_to_padded(torch.zeros(0, 6), 2, (32, 32), slots=16)
    inputs = StaticInputs()
    small = inputs.for_batch(torch.zeros(2, 3, 32, 32), targets)
    first_memory = inputs.images_memory
    pixels = torch.rand(2, 3, 32, 32)
    small.fill(pixels, targets, torch.ones((), dtype=torch.bool))
    assert torch.equal(small.images, pixels)
    large = inputs.for_batch(torch.zeros(2, 3, 64, 64, dtype=torch.float16), targets)  # another dtype too
    assert inputs.images_memory is not first_memory and inputs.images_memory.numel() == 2 * 3 * 64 * 64 * 2
    assert small.images.data_ptr() == first_memory.data_ptr() != large.images.data_ptr()
    assert torch.equal(small.images, pixels)  # the old memory lives on under the first key's view
    again = inputs.for_batch(torch.zeros(2, 3, 32, 32), targets)  # the same key: its buffer as before
    assert again.images.data_ptr() == small.images.data_ptr()
    strided = torch.zeros(2, 3, 64, 128)[..., ::2]  # not dense in any layout: a buffer of its own
    own = inputs.for_batch(strided, targets)
    assert own.images.shape == strided.shape and own.images.data_ptr() != inputs.images_memory.data_ptr()
