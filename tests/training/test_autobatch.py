import pytest
import torch

from detector.model import build_model
from detector.precision import Precision
from detector.training.autobatch import DEFAULT_BATCH, MAX_BATCH, auto_batch, fit_batch

GIB = 2**30


def test_the_fit_takes_the_largest_batch_under_the_budget():
    # 1 GiB of weights and workspaces, 0.5 GiB per image: a 48.2 GiB budget fits (48.2 - 1) / 0.5 = 94.4 images.
    measurements = [(batch, 1 * GIB + 0.5 * GIB * batch) for batch in (1, 2, 4, 8, 16)]
    assert fit_batch(measurements, 48.2 * GIB) == 94
    # Noise of +/-2% on each measurement moves the least-squares line a little, not the answer's order.
    noisy = [(batch, peak * factor) for (batch, peak), factor in zip(measurements, (1.02, 0.98, 1.02, 0.98, 1.0))]
    assert 90 <= fit_batch(noisy, 48.2 * GIB) <= 98


def test_the_fit_falls_back_where_the_line_cannot_be_trusted():
    assert fit_batch([(1, GIB)], 48 * GIB) == DEFAULT_BATCH  # one batch: no slope
    assert fit_batch([(1, 2 * GIB), (2, 2 * GIB)], 48 * GIB) == DEFAULT_BATCH  # flat: memory does not grow
    assert fit_batch([(1, 1 * GIB), (2, 2 * GIB)], 0.5 * GIB) == 1  # not even one image: the smallest batch
    assert fit_batch([(1, GIB), (2, 2 * GIB)], 1e18) == MAX_BATCH


def test_on_a_cpu_the_default_batch_is_kept_with_one_line():
    lines = []
    model = build_model(num_classes=3, scale="n")
    assert auto_batch(model, 64, Precision("fp32", "cpu", "test"), torch.device("cpu"), lines.append) == DEFAULT_BATCH
    assert len(lines) == 1 and lines[0].startswith("--batch -1: no CUDA device")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: measures GPU memory")
def test_on_cuda_the_chosen_batch_fits_the_fraction():
    device = torch.device("cuda")
    model = build_model(num_classes=3, scale="n").to(device)
    before = {name: buffer.clone() for name, buffer in model.named_buffers()}
    lines = []
    batch = auto_batch(model, 320, Precision("fp16", "cuda", "test"), device, lines.append, fraction=0.1)
    assert 1 <= batch <= MAX_BATCH and "fits 10% of" in lines[0]
    for name, buffer in model.named_buffers():  # the probe ran on a copy
        assert torch.equal(buffer, before[name]), name


def test_a_run_is_sized_at_its_largest_multi_scale_input(monkeypatch):
    import detector.training.autobatch as autobatch
    from detector.training.config import TrainConfig

    sizes = []
    monkeypatch.setattr(autobatch, "auto_batch", lambda model, size, *args, **kwargs: sizes.append(size) or 8)
    for multi_scale in (True, False):
        config = TrainConfig(imgsz=640, batch=-1, multi_scale=multi_scale)
        assert autobatch.batch_for(config, None, None, 20, None, torch.device("cpu"), print) == 8
    assert sizes == [704, 640]  # 1.125 x 640 = 720, down to a multiple of 32


def test_the_probe_runs_the_training_loss_over_full_box_slots(monkeypatch):
    import detector.loss
    from detector.training.autobatch import padded_loss, probe_step
    from detector.training.builders import build_criterion
    from detector.training.config import TrainConfig

    model = build_model(num_classes=3, scale="n").train()
    seen = []
    real_assign = detector.loss.assign_targets

    def recording(class_logits, pred_boxes, anchor_points, gt_labels, gt_boxes, gt_mask, **kwargs):
        seen.append((gt_labels.shape, int(gt_mask.sum())))
        return real_assign(class_logits, pred_boxes, anchor_points, gt_labels, gt_boxes, gt_mask, **kwargs)

    monkeypatch.setattr(detector.loss, "assign_targets", recording)
    probe_step(model, 64, 2, Precision("fp32", "cpu", "test"), torch.device("cpu"),
               padded_loss(build_criterion(TrainConfig(), model), slots=32))
    assert seen == [((2, 32), 64)]  # 2 images x 32 box slots, every slot a real box
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


def test_the_probe_feeds_images_in_the_dtype_the_step_makes_its_input_in(monkeypatch):
    """Under CUDA's FP16 autocast the step's input is FP16 (detector.training.step_input.step_input_dtype); an FP32
    probe input and autocast's copy of it would count 1.5x the input's bytes in a peak the run never reaches. The
    function is asked for the probe's precision and device, and its answer is what the model gets."""
    import detector.training.autobatch as autobatch

    model = build_model(num_classes=3, scale="n").train()
    dtypes, asked = [], []
    model.register_forward_pre_hook(lambda module, args: dtypes.append(args[0].dtype))
    precision = Precision("fp32", "cpu", "test")
    autobatch.probe_step(model, 64, 2, precision, torch.device("cpu"))
    monkeypatch.setattr(autobatch, "step_input_dtype",
                        lambda precision, device: asked.append((precision.name, device.type)) or torch.bfloat16)
    autobatch.probe_step(model.bfloat16(), 64, 2, precision, torch.device("cpu"))
    assert dtypes == [torch.float32, torch.bfloat16] and asked == [("fp32", "cpu")]


def test_the_probe_feeds_images_in_the_training_layout(monkeypatch):
    """A run's step gives the model channels-last images (``--channels-last``, the default); channels-first ones
    would make the model copy them first, and the copy would count in the measured peak."""
    import detector.training.autobatch as autobatch
    from detector.training.config import TrainConfig

    model = build_model(num_classes=3, scale="n").train().to(memory_format=torch.channels_last)
    layouts = []
    model.register_forward_pre_hook(
        lambda module, args: layouts.append(args[0].is_contiguous(memory_format=torch.channels_last)))
    for channels_last in (True, False):
        autobatch.probe_step(model, 64, 2, Precision("fp32", "cpu", "test"), torch.device("cpu"),
                             channels_last=channels_last)
    assert layouts == [True, False]
    passed = []
    monkeypatch.setattr(autobatch, "auto_batch", lambda *args, **kwargs: passed.append(kwargs["step"].channels_last) or 8)
    for channels_last in (True, False):
        autobatch.batch_for(TrainConfig(batch=-1, channels_last=channels_last), None, None, 4, None,
                            torch.device("cpu"), print)
    assert passed == [True, False]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: measures GPU memory")
def test_on_cuda_the_loss_is_part_of_the_measured_peak():
    from detector.training.autobatch import measure_peak_memory, padded_loss
    from detector.training.builders import build_criterion
    from detector.training.config import TrainConfig

    device = torch.device("cuda")
    model = build_model(num_classes=3, scale="n").to(device).train()
    precision = Precision("fp16", "cuda", "test")
    outputs_only = measure_peak_memory(model, 640, 8, precision, device)
    with_loss = measure_peak_memory(model, 640, 8, precision, device,
                                    padded_loss(build_criterion(TrainConfig(), model), slots=256))
    assert with_loss > outputs_only


def test_batch_minus_one_is_a_valid_flag_and_other_negatives_are_not():
    from detector.training.config import TrainConfig

    assert TrainConfig(batch=-1).with_defaults().validate().batch == -1
    with pytest.raises(ValueError, match=r"--batch must be at least 1, or -1 for auto \(got -2\)"):
        TrainConfig(batch=-2).with_defaults().validate()


def test_where_cuda_graphs_will_run_the_activations_count_twice(monkeypatch):
    """The graphs' pool keeps one step's activations while each new key's first steps run eagerly beside it."""
    import detector.training.autobatch as autobatch
    from detector.training.config import TrainConfig

    line = [(1, 1.0e9), (2, 1.5e9), (4, 2.5e9), (8, 4.5e9), (16, 8.5e9)]  # 0.5 GB + 0.5 GB per image
    assert fit_batch(line, 20.6e9) == 40 and fit_batch(line, 20.6e9, activation_copies=2) == 20
    graphs = []
    monkeypatch.setattr(autobatch, "auto_batch", lambda *args, **kwargs: graphs.append(kwargs["step"].cuda_graphs) or 8)
    cuda = torch.device("cuda")  # only named: auto_batch is replaced, nothing runs on it
    for choice, world_size in (("auto", 1), ("off", 1), ("auto", 2)):
        autobatch.batch_for(TrainConfig(batch=-1, cuda_graphs=choice), None, None, 4, None, cuda, print,
                            world_size=world_size)
    autobatch.batch_for(TrainConfig(batch=-1), None, None, 4, None, torch.device("cpu"), print)
    assert graphs == [True, False, False, False]  # not with --cuda-graphs off, under torchrun, or on the CPU


def test_the_share_of_memory_is_the_runs_and_ultralytics_batch_share_asks_for_it(monkeypatch):
    """``--batch-memory`` reaches the probe's fit; Ultralytics' ``batch=0.7`` is ``--batch -1 --batch-memory 0.7``."""
    import detector.training.autobatch as autobatch
    from detector.cli.train import parse_args
    from detector.training.config import TrainConfig

    fractions = []
    monkeypatch.setattr(autobatch, "auto_batch", lambda *args, **kwargs: fractions.append(kwargs["fraction"]) or 8)
    for share in (0.6, 0.35):
        autobatch.batch_for(TrainConfig(batch=-1, batch_memory=share), None, None, 4, None, torch.device("cpu"), print)
    assert fractions == [0.6, 0.35]
    args = parse_args(["batch=0.7"])
    assert (args.batch, args.batch_memory) == (-1, 0.7)
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="--batch-memory"):
            TrainConfig(batch=-1, batch_memory=bad).validate()
