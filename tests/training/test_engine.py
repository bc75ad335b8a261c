import math

import pytest
import torch

from detector.data.device_augment import pack_warp_batch
from detector.data.letterbox import ImageMeta
from detector.loss import targets_to_padded
from detector.model import build_model
from detector.precision import Precision, cpu_has_native_bf16, fp32_settings_kept, resolve_precision
from detector.training import engine
from detector.training.engine import timed, train_one_epoch
from detector.training.step_input import resize_batch, step_input
from detector.training.multiscale import MultiScale
from tests.conftest import make_train_step


def _loader(batches: int = 2):
    generator = torch.Generator().manual_seed(0)
    images = (torch.rand(batches, 2, 3, 64, 64, generator=generator) * 255).to(torch.uint8)
    targets = torch.tensor([[0, 1, 0.5, 0.5, 0.4, 0.4], [1, 0, 0.3, 0.3, 0.2, 0.3]])
    metas = [ImageMeta(i, (64, 64), 1.0, (0.0, 0.0)) for i in range(2)]
    return [(images[i], targets, metas) for i in range(batches)]


def _run_epoch(precision: Precision):
    torch.manual_seed(0)
    model = build_model(num_classes=2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    step = make_train_step(model, precision=precision.name, channels_last=True)
    stats = train_one_epoch(step, _loader(), multi_scale=MultiScale(64, enabled=False), epoch=0, seed=0,
                            progress=False)
    changed = any(not torch.equal(before[k], v) for k, v in model.state_dict().items() if v.is_floating_point())
    return stats, changed, step.ema


@pytest.mark.parametrize("name", ["fp32", "bf16"])
def test_one_training_step_updates_weights(name):
    if name == "bf16" and not cpu_has_native_bf16():
        pytest.skip("CPU without native BF16")
    stats, changed, ema = _run_epoch(Precision(name, "cpu", "test"))
    assert changed and stats["optimizer_steps"] == 2 and stats["skipped_steps"] == 0
    assert all(stats[k] > 0 for k in ("train/box", "train/cls", "train/dfl"))
    assert ema.updates == 2


def test_unamp_means_fp32_without_scaler():
    with fp32_settings_kept():  # --unamp turns TF32 off for its run: not for the tests after this one
        precision = resolve_precision("auto", torch.device("cpu"), unamp=True)
        assert precision.name == "fp32" and precision.dtype is None and not precision.make_scaler().is_enabled()
        assert not torch.backends.cuda.matmul.allow_tf32


def test_auto_precision_on_cpu_follows_hardware():
    precision = resolve_precision("auto", torch.device("cpu"))
    assert precision.name == ("bf16" if cpu_has_native_bf16() else "fp32") and precision.reason


def test_step_input_resizes_in_uint8_on_cpu_close_to_the_float_path():
    generator = torch.Generator().manual_seed(0)
    images = (torch.rand(2, 3, 64, 64, generator=generator) * 255).to(torch.uint8)
    images = images.contiguous(memory_format=torch.channels_last)
    out = step_input(images, 96, torch.device("cpu"), channels_last=True)
    assert out.shape == (2, 3, 96, 96) and out.dtype == torch.float32
    assert out.is_contiguous(memory_format=torch.channels_last)
    # The float path (what a GPU step does): resizing before or after the conversion differs by the uint8
    # rounding of the interpolated value, one grey level at most (plus float error).
    reference = resize_batch(images.float() / 255, 96)
    assert (out - reference).abs().max() <= 1.01 / 255


def test_step_input_into_a_captured_steps_buffer_is_that_buffer_with_what_it_would_have_made():
    """``out`` (a CUDA graph's image buffer, detector/training/cuda_graph.py): filled and returned, for a uint8 batch
    and a device-path WarpBatch (PyTorch's ops here, where the fused kernel does not run)."""
    from detector.training.cuda_graph import StaticInputs
    from tests.data.test_device_augment import _fixed_sources

    generator = torch.Generator().manual_seed(0)
    uint8 = (torch.rand(4, 3, 64, 64, generator=generator) * 255).to(torch.uint8)
    warp = pack_warp_batch([source for _, _, source in _fixed_sources(64)])
    inputs = StaticInputs()
    for batch in (uint8, warp):
        out = inputs.image_buffer((4, 3, 96, 96), torch.device("cpu"), channels_last=True, largest_side=128)
        made = step_input(batch, 96, torch.device("cpu"), channels_last=True, out=out)
        assert made is out and torch.equal(out, step_input(batch, 96, torch.device("cpu"), channels_last=True))
        assert out.data_ptr() == inputs.images_memory.data_ptr() and inputs.images_memory.numel() == 4 * 3 * 128**2 * 4
    targets = targets_to_padded(torch.zeros(0, 6), 4, (96, 96), slots=16)
    assert inputs.for_batch(out, targets).images is out  # the key's buffer: its fill copies nothing


def test_a_step_input_under_cuda_autocast_is_made_in_its_dtype_and_holds_what_autocast_would_cast():
    """On CUDA under autocast the step's input is made in autocast's dtype, its FP32 form never kept: the same values
    the first convolution read from autocast's cast (both round to nearest even), in half the buffer. The CPU keeps
    FP32, and so does a run in FP32."""
    from detector.training.cuda_graph import StaticInputs
    from detector.training.step_input import step_input_dtype
    from tests.data.test_device_augment import _fixed_sources

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert step_input_dtype(Precision("fp16", "cuda", "test"), cuda) == torch.float16
    assert step_input_dtype(Precision("bf16", "cuda", "test"), cuda) == torch.bfloat16
    assert step_input_dtype(Precision("fp32", "cuda", "test"), cuda) == torch.float32
    assert step_input_dtype(Precision("bf16", "cpu", "test"), cpu) == torch.float32
    warp = pack_warp_batch([source for _, _, source in _fixed_sources(64)])
    for dtype in (torch.float16, torch.bfloat16):
        inputs = StaticInputs()
        out = inputs.image_buffer((4, 3, 96, 96), cpu, channels_last=True, largest_side=128, dtype=dtype)
        assert out.dtype == dtype and inputs.images_memory.numel() == 4 * 3 * 128**2 * 2  # half the FP32 bytes
        made = step_input(warp, 96, cpu, channels_last=True, out=out)  # PyTorch's ops here, then copied in
        assert made is out and torch.equal(out, step_input(warp, 96, cpu, channels_last=True).to(dtype))
        targets = targets_to_padded(torch.zeros(0, 6), 4, (96, 96), slots=16)
        assert inputs.for_batch(out, targets).images is out  # the key's own buffer, found by its dtype


def _step_with_gradient(value: float, precision: Precision, scale: float):
    from detector.training.engine import optimizer_step

    layer = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=scale, enabled=precision.uses_scaler)
    loss = layer(torch.ones(1, 2)).sum() * value
    scaler.scale(loss).backward()
    return optimizer_step(model=layer, parameters=list(layer.parameters()), optimizer=optimizer, scaler=scaler,
                          ema=None, precision=precision, clip_grad=10.0, loss_was_finite=bool(torch.isfinite(loss)))


def test_gradscaler_calibration_skips_are_not_instability():
    fp16 = Precision("fp16", "cpu", "test")
    # Overflowing gradients at a large loss scale: GradScaler halves the scale and skips; that is normal.
    calibrating = _step_with_gradient(1e38, fp16, scale=2.0**16)
    assert not calibrating.applied and not calibrating.unstable
    # The same at scale 1: no room left to scale down, FP16 cannot hold these gradients.
    exhausted = _step_with_gradient(1e38, fp16, scale=1.0)
    assert not exhausted.applied and exhausted.unstable
    # A non-finite loss is never the scaler's business; without a scaler any skip is real.
    assert _step_with_gradient(float("nan"), fp16, scale=2.0**16).unstable
    assert _step_with_gradient(float("inf"), Precision("bf16", "cpu", "test"), scale=1.0).unstable
    assert _step_with_gradient(1.0, fp16, scale=2.0**16).applied


def test_fallback_waits_for_unstable_steps_and_stops_in_fp32():
    import pytest as _pytest

    from detector.training.trainer import fallback_after_epoch

    fp16 = Precision("fp16", "cpu", "test")
    # coco128 in FP16: 8 optimizer steps in epoch 1, half of them GradScaler's calibration skips.
    assert fallback_after_epoch(fp16, {"unstable_steps": 0, "skipped_steps": 4, "optimizer_steps": 8}, "cpu") is None
    safer, message = fallback_after_epoch(fp16, {"unstable_steps": 5, "skipped_steps": 5, "optimizer_steps": 8}, "cpu")
    assert safer == ("bf16" if cpu_has_native_bf16() else "fp32") and "5/8" in message
    # The threshold is half the steps, as the docs say: 4 of 9 is under it, 4 of 8 is not.
    assert fallback_after_epoch(fp16, {"unstable_steps": 4, "skipped_steps": 4, "optimizer_steps": 9}, "cpu") is None
    assert fallback_after_epoch(fp16, {"unstable_steps": 4, "skipped_steps": 4, "optimizer_steps": 8}, "cpu")
    # After the run's last epoch there is nothing to switch: the precision stays, the line says so
    kept, message = fallback_after_epoch(fp16, {"unstable_steps": 5, "optimizer_steps": 8}, "cpu", ending=True)
    assert kept == "fp16" and "5/8" in message and "last epoch" in message and "switching" not in message
    with _pytest.raises(FloatingPointError, match="diverged"):
        fallback_after_epoch(Precision("fp32", "cpu", "t"), {"unstable_steps": 8, "optimizer_steps": 8}, "cpu")


def test_statistics_a_forward_pass_made_non_finite_are_put_back_at_the_epochs_end():
    """An overflowed forward leaves inf/NaN in BatchNorm's running statistics before any step can be skipped, and
    the EMA averages them in: at the epoch's end both are put back as they were at its start, with a warning. An
    epoch without that keeps what it learnt."""
    torch.manual_seed(0)
    model = build_model(num_classes=2)
    step = make_train_step(model)
    norm = next(module for module in model.modules() if isinstance(module, torch.nn.BatchNorm2d))

    def overflowed(module: torch.nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        module.running_var.data.fill_(float("nan"))  # what an inf activation leaves there (.data: autograd unaware)

    hook = norm.register_forward_hook(overflowed)
    buffers = lambda: [b.clone() for m in (model, step.ema.module) for b in m.buffers() if b.is_floating_point()]
    before = buffers()
    with pytest.warns(UserWarning, match="epoch 1: BatchNorm running statistics became non-finite"):
        train_one_epoch(step, _loader(), multi_scale=MultiScale(64, enabled=False), epoch=0, seed=0, progress=False)
    assert all(torch.equal(a, b) for a, b in zip(before, buffers(), strict=True))
    hook.remove()
    train_one_epoch(step, _loader(), multi_scale=MultiScale(64, enabled=False), epoch=0, seed=0, progress=False)
    after = buffers()
    assert all(torch.isfinite(b).all() for b in after) and not all(torch.equal(a, b) for a, b in zip(before, after))


def test_the_epochs_mean_loss_leaves_out_non_finite_steps_and_is_nan_when_none_was_finite():
    """A non-finite loss counted as 0 halved the reported mean when half the steps overflowed, and showed an epoch
    that broke entirely as a perfect 0: the mean is over the finite steps, NaN when there were none."""
    torch.manual_seed(0)
    step = make_train_step(build_model(num_classes=2), steps_per_epoch=4)
    criterion, seen = step.criterion, []

    def every_other_broken(outputs, targets, size):
        loss, parts = criterion(outputs, targets, size)
        if len(seen) % 2:
            loss, parts = loss * float("nan"), {k: v * float("inf") for k, v in parts.items()}
        seen.append(torch.stack([parts["box"], parts["cls"], parts["dfl"]]).detach())
        return loss, parts

    every_other_broken.set_epoch = criterion.set_epoch  # what the epoch asks of its criterion first
    step.criterion = every_other_broken
    stats = train_one_epoch(step, _loader(4), multi_scale=MultiScale(64, enabled=False), epoch=0, seed=0,
                            progress=False)
    finite_mean = torch.stack(seen[0::2]).mean(0)
    assert stats["nonfinite_losses"] == 2
    assert [stats["train/box"], stats["train/cls"], stats["train/dfl"]] == pytest.approx(finite_mean.tolist())

    def all_broken(outputs, targets, size):
        loss, parts = criterion(outputs, targets, size)
        return loss * float("nan"), parts

    all_broken.set_epoch = criterion.set_epoch
    step.criterion = all_broken
    stats = train_one_epoch(step, _loader(2), multi_scale=MultiScale(64, enabled=False), epoch=1, seed=0,
                            progress=False)
    assert stats["nonfinite_losses"] == 2 and all(math.isnan(stats[f"train/{part}"]) for part in ("box", "cls", "dfl"))


def _accumulator(parameter: torch.Tensor):
    """The parameter's AccumulateGrad node: the one a live autograd graph still holds, else a new one."""
    return parameter.expand_as(parameter).grad_fn.next_functions[0][0]


def test_no_step_keeps_the_previous_steps_autograd_graph_alive():
    """A step's graph (and its AccumulateGrad nodes) is gone before the next step's forward.

    On a GPU the first captured step failed in every run ("operation would make the legacy stream depend on a
    capturing blocking stream"): the last eager step's loss and outputs were still held by the loop, so the
    parameters' AccumulateGrad nodes made on the default stream outlived it, and the capture's backward on its
    own stream had to synchronise with them. Each forward tags the node its graph holds; the next forward reads
    the tag back before building its own graph, and finds it only if the node lived on.
    """
    torch.manual_seed(0)
    model = build_model(num_classes=2)
    parameter = next(p for p in model.parameters() if p.requires_grad)
    survived = []

    def read_tag(module, inputs):
        survived.append(_accumulator(parameter).metadata.get("step"))  # None: a new node, the last graph is gone

    def tag(module, inputs, outputs):
        _accumulator(parameter).metadata["step"] = len(survived)  # the node this step's graph holds

    model.register_forward_pre_hook(read_tag)
    model.register_forward_hook(tag)
    step = make_train_step(model, steps_per_epoch=3)
    train_one_epoch(step, _loader(3), multi_scale=MultiScale(64, enabled=False), epoch=0, seed=0, progress=False)
    assert survived == [None, None, None]


def test_the_data_wait_counts_the_loaders_time_and_not_the_steps(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(engine.time, "perf_counter", lambda: clock[0])

    def loader():
        for batch in range(3):
            clock[0] += 2.0  # the loader takes 2 s to hand over each batch
            yield batch

    waited = [0.0]
    seen = []
    for batch in timed(loader(), waited):
        seen.append(batch)
        clock[0] += 5.0  # the step
    assert seen == [0, 1, 2] and waited == [6.0]


def test_under_ddp_micro_steps_keep_their_gradients_local_until_the_optimizer_steps(tmp_path):
    """Accumulating 2 micro-batches per optimizer step, DDP reduces gradients once per optimizer step, not once per
    micro-batch (what DDP's no_sync is for), and the run trains as the same steps without DDP. One process of a gloo
    group: DDP's reducer runs as it does for several."""
    import dataclasses

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    if dist.is_initialized():
        pytest.skip("a process group is already running in this process")

    def run(wrap: bool):
        torch.manual_seed(0)
        model = build_model(num_classes=2)
        step = make_train_step(model, steps_per_epoch=4, optimizer="SGD")
        step.schedule = dataclasses.replace(step.schedule, nominal_batch=4)  # batches of 2: 2 per optimizer step
        reductions = []
        if wrap:
            step.model = DistributedDataParallel(model)

            def counted(state, bucket):
                reductions.append(len(bucket.gradients()))
                return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda f: f.value()[0])

            step.model.register_comm_hook(None, counted)
        train_one_epoch(step, _loader(4), multi_scale=MultiScale(64, enabled=False), epoch=0, seed=0, progress=False)
        return model, reductions

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        wrapped, reductions = run(wrap=True)
    finally:
        dist.destroy_process_group()
    plain, _ = run(wrap=False)
    trainable = sum(1 for p in plain.parameters() if p.requires_grad)
    assert sum(reductions) == 2 * trainable  # each gradient reduced at the 2 optimizer steps of the 4 micro-steps
    for (name, value), (_, expected) in zip(wrapped.state_dict().items(), plain.state_dict().items(), strict=True):
        assert torch.equal(value, expected), name


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("optimizer", ["SGD", "AdamW"])
def test_an_eager_step_without_a_scaler_reads_nothing_on_the_host_and_skips_non_finite_gradients(precision, optimizer):
    """BF16 and FP32 steps leave the skip to the fused kernel (on a GPU a host read waits for the device: every
    eager step of warm-up under graphs, of DDP, of graphs off); a gradient that is not finite still changes nothing."""
    from tests.host_reads import HostReads

    torch.manual_seed(0)
    model = build_model(num_classes=2)
    step = make_train_step(model, precision=precision, optimizer=optimizer)
    assert step.optimizer.defaults["fused"] and not step.precision.uses_scaler
    parameters = [p for p in model.parameters() if p.requires_grad]

    loss_was_finite = torch.tensor(True)

    def step_with(gradient: float):
        for parameter in parameters:
            parameter.grad = torch.full_like(parameter, gradient)
        return engine.optimizer_step(model=model, parameters=parameters, optimizer=step.optimizer, scaler=step.scaler,
                                     ema=step.ema, precision=step.precision, clip_grad=10.0,
                                     loss_was_finite=loss_was_finite)

    step_with(0.1)  # the optimizer's lazy state is made on its first step, as before any graph
    before = [p.detach().clone() for p in parameters]
    with HostReads() as reads:
        result = step_with(float("nan"))
    assert not reads.seen, "host reads in the eager step:\n" + "\n".join(sorted(set(reads.seen)))
    assert not bool(result.applied) and all(torch.equal(a, p) for a, p in zip(before, parameters))
    result = step_with(0.1)
    assert bool(result.applied) and not all(torch.equal(a, p) for a, p in zip(before, parameters))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the uploaded atlas is freed on a GPU")
def test_each_uploaded_atlas_is_freed_once_rendered(monkeypatch):
    """A device-path batch's atlas on the GPU goes as soon as the step's input is rendered from it, not after the
    step (it would sit at the step's peak beside the next batch's); the training still runs."""
    from tests.data.test_device_augment import _fixed_sources

    seen = []
    real = engine.step_input

    def recording(images, *args, **kwargs):
        seen.append(images)
        return real(images, *args, **kwargs)

    monkeypatch.setattr(engine, "step_input", recording)
    sources = [source for _, _, source in _fixed_sources(64)]
    metas = [ImageMeta(i, (64, 64), 1.0, (0.0, 0.0)) for i in range(len(sources))]
    targets = torch.tensor([[0, 1, 0.5, 0.5, 0.4, 0.4]])
    loader = [(pack_warp_batch(sources).pin_memory(), targets, metas) for _ in range(2)]
    torch.manual_seed(0)
    step = make_train_step(build_model(num_classes=2).cuda(), device="cuda")
    stats = train_one_epoch(step, loader, multi_scale=MultiScale(64, enabled=False), epoch=0, seed=0, progress=False)
    assert stats["peak_reserved_mb"] >= stats["peak_mem_mb"] > 0  # results.csv's two GPU memory columns
    assert len(seen) == 2 and all(batch.atlas.is_cuda and batch.atlas.untyped_storage().nbytes() == 0
                                  for batch in seen)
    assert all(batch[0].atlas.untyped_storage().nbytes() > 0 for batch in loader)  # the host's copies are kept


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs capture on a GPU")
def test_a_precision_fallback_gives_its_graphs_memory_back_at_once():
    """The graphs of the precision a run leaves hold a step's activations in their pool: it goes back to the GPU
    when they are dropped, not at the new precision's first capture, after eager steps beside it."""
    torch.manual_seed(0)
    step = make_train_step(build_model(num_classes=2).cuda(), precision="fp16", device="cuda", steps_per_epoch=4)
    step.cuda_graphs = "on"
    train_one_epoch(step, _loader(4), multi_scale=MultiScale(64, enabled=False), epoch=0, seed=0, progress=False)
    assert step.graphs is not None and step.graphs.graphs  # captured: the pool holds memory
    held = torch.cuda.memory_reserved()
    step.set_precision(Precision("bf16", "cuda", "test fallback"))
    assert step.graphs is None and torch.cuda.memory_reserved() < held
