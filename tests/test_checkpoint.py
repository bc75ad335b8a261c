import copy
import os
import signal
import stat
import subprocess
import sys
import threading
import time
import types
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from detector.checkpoint import (
    CheckpointError,
    is_stripped,
    load_checkpoint,
    load_matching,
    model_from_checkpoint,
    save_checkpoint,
    strip_checkpoint,
    to_half,
    torch_floor_problem,
)
from detector.checkpoint_integrity import all_finite
from detector.exporting.parity import synthetic_images
from detector.model import build_model
from detector.postprocess import NMSConfig, decode_outputs, non_max_suppression
from tests.conftest import lively_model

WRITER = """
import sys, torch
from detector.checkpoint import save_checkpoint
path = sys.argv[1]
big = {"model": {"w": torch.randn(4_000_000)}, "epoch": 0}
for epoch in range(10_000):
    big["epoch"] = epoch
    save_checkpoint(big, path)
    print(epoch, flush=True)
"""


def test_sigkill_during_writes_leaves_a_loadable_checkpoint(tmp_path: Path):
    path = tmp_path / "last.pt"
    process = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True)
    watchdog = threading.Timer(120, process.kill)  # a writer hung before its first line ends readline() too
    watchdog.start()
    try:
        assert process.stdout.readline()  # at least one complete write
        for delay in (0.05, 0.11, 0.17):  # kill at different points of a write
            time.sleep(delay)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
    finally:
        watchdog.cancel()
        process.kill()
    state = load_checkpoint(path)
    assert state["model"]["w"].shape == (4_000_000,) and state["epoch"] >= 0
    assert not list(tmp_path.glob("*.tmp")) or all(p.name.startswith(".") for p in tmp_path.glob("*.tmp"))


def test_a_checkpoint_gets_the_permissions_of_a_plain_open_not_mkstemps_0600(tmp_path: Path):
    old_mask = os.umask(0o022)
    try:
        save_checkpoint({"model": {"w": torch.zeros(2)}, "epoch": 0}, tmp_path / "last.pt")
        plain = tmp_path / "plain"
        plain.write_bytes(b"")
    finally:
        os.umask(old_mask)
    assert stat.S_IMODE((tmp_path / "last.pt").stat().st_mode) == stat.S_IMODE(plain.stat().st_mode) == 0o644


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_non_finite_weights_are_never_written(tmp_path: Path, bad: float, dtype: torch.dtype):
    weights = {"ok": torch.ones(3, dtype=dtype), "empty": torch.zeros(0, dtype=dtype), "count": torch.tensor(7),
               "w": torch.tensor([1.0, bad], dtype=dtype)}  # one bad value among good, empty and integer tensors
    with pytest.raises(CheckpointError, match="non-finite 'ema'"):
        save_checkpoint({"model": {"ok": torch.ones(2)}, "ema": weights}, tmp_path / "bad.pt")
    assert not any(tmp_path.iterdir())
    assert all_finite({name: tensor for name, tensor in weights.items() if name != "w"})
    assert all_finite({"w": torch.tensor([1e300], dtype=torch.float64), "h": torch.ones(2, dtype=torch.float16)})


def test_checkpoints_load_weights_only_and_refuse_pickled_code(tmp_path: Path):
    model = build_model(num_classes=2)
    save_checkpoint({"model": model.state_dict(), "ema": None, "model_args": {"num_classes": 2, "scale": "n", "reg_max": 16},
                     "names": ["a", "b"], "config": {}}, tmp_path / "ok.pt")
    rebuilt, checkpoint = model_from_checkpoint(tmp_path / "ok.pt")
    assert checkpoint["names"] == ["a", "b"] and not rebuilt.training

    class Hostile:
        def __reduce__(self):
            return (print, ("pwned",))

    torch.save({"model": Hostile()}, tmp_path / "hostile.pt")
    with pytest.raises(CheckpointError, match="hostile.pt"):
        load_checkpoint(tmp_path / "hostile.pt")


def _ours(tmp_path: Path, name: str = "ok.pt", **changes) -> Path:
    """A small valid checkpoint (nano, 2 classes) with ``changes`` applied to its dict."""
    payload = {"model": build_model(num_classes=2).state_dict(), "ema": None,
               "model_args": {"num_classes": 2, "scale": "n", "reg_max": 16}, "names": ["a", "b"], "config": {}}
    payload.update(changes)
    save_checkpoint(payload, tmp_path / name)
    return tmp_path / name


def test_a_refused_checkpoint_says_why_and_never_suggests_weights_only_false(tmp_path: Path):
    class Hostile:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    torch.save({"model": Hostile()}, tmp_path / "hostile.pt")
    with pytest.raises(CheckpointError) as refused:
        load_checkpoint(tmp_path / "hostile.pt")
    message = str(refused.value)
    assert "\n" not in message and "refused" in message and "system" in message
    assert "weights_only" not in message and "Re-running" not in message


@pytest.mark.parametrize("content, problem", [
    (b"", "empty or cut short"),
    (b"PK\x03\x04 an odd zip", "a damaged PyTorch checkpoint"),
    (b"\x80\x02garbage", "not"),
])
def test_empty_odd_and_garbage_files_give_one_line(tmp_path: Path, content: bytes, problem: str):
    path = tmp_path / "bad.pt"
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match=problem) as refused:
        load_checkpoint(path)
    assert str(refused.value).startswith(str(path)) and "\n" not in str(refused.value)


def test_a_truncated_checkpoint_is_one_line(tmp_path: Path):
    path = _ours(tmp_path)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="ok.pt") as refused:
        model_from_checkpoint(path)
    assert "\n" not in str(refused.value)


def test_torch_older_than_the_floor_is_refused_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    assert torch_floor_problem("2.10.0") is None and torch_floor_problem("2.11.0a0+nv25.01") is None
    assert "CVE-2025-32434" in torch_floor_problem("2.5.1") and "torch>=2.10" in torch_floor_problem("2.9.1")
    path = _ours(tmp_path)
    monkeypatch.setattr(torch, "__version__", "2.5.1")
    with pytest.raises(CheckpointError, match="refused to load: torch 2.5.1 is older than 2.10"):
        load_checkpoint(path)
    from detector.weights.safe_pickle import load_checkpoint as load_foreign

    with pytest.raises(CheckpointError, match="torch>=2.10"):
        load_foreign(path)


@pytest.mark.parametrize("model_args, problem", [
    ([2, "n"], "'model_args' is a list"),
    ({"num_classes": 2, "scale": "q"}, "scale is 'q'"),
    ({"num_classes": -1, "scale": "n"}, "num_classes is -1"),
    ({"num_classes": "2", "scale": "n"}, "num_classes is '2'"),
    ({"num_classes": 2, "scale": "n", "depth": 9}, "unknown key 'depth'"),
    ({"num_classes": 2, "scale": "n", "class_channels": 0}, "class_channels is 0"),
])
def test_bad_model_args_are_one_line(tmp_path: Path, model_args, problem: str):
    with pytest.raises(CheckpointError, match=problem):
        model_from_checkpoint(_ours(tmp_path, model_args=model_args))


def test_weights_that_do_not_fit_name_the_file_and_the_first_key(tmp_path: Path):
    other = build_model(num_classes=2, scale="s").state_dict()
    with pytest.raises(CheckpointError, match=r"ok.pt: the weights do not fit the model: \d+ tensors of another shape"):
        model_from_checkpoint(_ours(tmp_path, model=other))
    partial = dict(list(build_model(num_classes=2).state_dict().items())[:10])
    with pytest.raises(CheckpointError, match="tensors missing"):
        model_from_checkpoint(_ours(tmp_path, model=partial))


def test_fine_tuning_needs_half_the_tensors_to_fit(tmp_path: Path):
    same_scale_other_classes = build_model(num_classes=80).state_dict()
    copied, total = load_matching(build_model(num_classes=3), same_scale_other_classes, "x.pt")
    assert copied / total > 0.85 and total == len(build_model(num_classes=3).state_dict())
    with pytest.raises(CheckpointError, match=r"x.pt: only \d+/355 tensors fit the model"):
        load_matching(build_model(num_classes=3), build_model(num_classes=3, scale="s").state_dict(), "x.pt")
    with pytest.raises(CheckpointError, match="only 0/355"):
        load_matching(build_model(num_classes=3), {"foreign.weight": torch.zeros(3)}, "x.pt")


# ------------------------------------------------------------------------------------------ stripped files
# FP16 keeps 11 significant bits: round-to-nearest moves a normal number by at most 2^-11 of itself, and a
# subnormal one (|w| < 2^-14) by at most half its spacing, 2^-25.
FP16_RELATIVE_ROUNDING = 2.0**-11
FP16_SUBNORMAL_ROUNDING = 2.0**-25


def _full_payload(model: torch.nn.Module, ema: torch.nn.Module) -> dict:
    """A full training checkpoint as the trainer writes it (optimizer with momentum buffers included)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    sum(p.sum() for p in model.parameters()).backward()
    optimizer.step()  # creates the momentum buffers, as a real run's optimizer state has
    return {"model": model.state_dict(), "ema": ema.state_dict(), "optimizer": optimizer.state_dict(),
            "scaler": {}, "epoch": 9, "model_args": {"num_classes": model.num_classes, "scale": "n", "reg_max": 16},
            "names": [str(i) for i in range(model.num_classes)], "metrics": {"mAP50-95": 0.5},
            "config": {"imgsz": 64}, "precision": "bf16", "best_fitness": 0.5, "best_epoch": 9}


def test_a_stripped_nano_checkpoint_is_small_and_holds_what_inference_needs(tmp_path: Path):
    model, ema = build_model(num_classes=80), build_model(num_classes=80)  # COCO's 80 classes: the largest head
    full = tmp_path / "full.pt"
    save_checkpoint(_full_payload(model, ema), full)
    stripped = tmp_path / "best.pt"
    save_checkpoint(strip_checkpoint(load_checkpoint(full)), stripped)
    sizes = stripped.stat().st_size, full.stat().st_size
    assert sizes[0] <= 7e6 and sizes[1] > 3 * 7e6, sizes
    state = load_checkpoint(stripped)
    assert is_stripped(state) and not is_stripped(load_checkpoint(full))
    assert {"epoch", "model_args", "names", "metrics", "config", "precision"} <= state.keys() and state["ema"] is None
    assert "optimizer" not in state and "scaler" not in state and state["precision"] == "bf16"
    # The EMA (not the raw model) is what is kept, rounded to FP16 and nothing else; integer counters stay as they are.
    for name, tensor in ema.state_dict().items():
        kept = state["model"][name]
        expected = tensor.half() if tensor.is_floating_point() else tensor
        assert kept.dtype == expected.dtype and torch.equal(kept, expected), name
    rebuilt, _ = model_from_checkpoint(stripped)
    assert all(p.dtype == torch.float32 for p in rebuilt.state_dict().values() if p.is_floating_point())


def test_values_beyond_fp16_range_stay_fp32():
    stripped = to_half({"small": torch.tensor([1.0, -2.0]), "large": torch.tensor([1.0, 7e4]),
                        "count": torch.tensor(3)})
    assert stripped["small"].dtype == torch.float16 and stripped["large"].dtype == torch.float32
    assert stripped["count"].dtype == torch.int64


def test_to_half_copies_every_tensor_so_training_may_go_on():
    """The stripped weights are kept while the run trains on (best.pt held until last.pt is due): none may share
    memory with the live state dict, including those that keep their type."""
    live = {"small": torch.tensor([1.0, -2.0]), "large": torch.tensor([1.0, 7e4]), "count": torch.tensor(3),
            "empty": torch.zeros(0), "half": torch.tensor([0.5], dtype=torch.float16)}
    stripped = to_half(live)
    for tensor in live.values():
        tensor.add_(1)
    assert stripped["small"].tolist() == [1.0, -2.0] and stripped["large"].tolist() == [1.0, 7e4]
    assert stripped["count"].item() == 3 and stripped["half"].item() == 0.5 and stripped["empty"].numel() == 0


@pytest.mark.parametrize("gather_bytes", [None, 16])
def test_copies_made_together_equal_copies_made_one_by_one_and_share_nothing(gather_bytes, monkeypatch):
    """What a GPU's tensors take (one transfer per dtype, cut back into tensors), run here on CPU tensors: the same
    values, shapes and dtypes as copying each, every copy in memory of its own; the live tensors may change after.
    ``gather_bytes`` 16: each transfer holds at most 16 bytes (tensors larger than that alone), as a large model's
    checkpoint goes in parts of detector.checkpoint.GATHER_BYTES."""
    import detector.checkpoint
    from detector.checkpoint import host_copies

    if gather_bytes is not None:
        monkeypatch.setattr(detector.checkpoint, "GATHER_BYTES", gather_bytes)

    generator = torch.Generator().manual_seed(0)
    live = [torch.randn(4, 3, 3, 3, generator=generator).contiguous(memory_format=torch.channels_last),
            torch.randn(5, generator=generator), torch.tensor(7), torch.zeros(0), torch.tensor([True, False]),
            torch.randn(2, 3, generator=generator).half(), torch.randn(6, generator=generator)[::2],
            torch.tensor([1.5], dtype=torch.float16)]
    one_by_one = host_copies(live, together=lambda device: False)
    together = host_copies(live, together=lambda device: True)
    for tensor, single, joint in zip(live, one_by_one, together):
        assert joint.dtype == tensor.dtype and joint.shape == tensor.shape and torch.equal(joint, single)
        # in its tensor's layout (the channels-last weight's too: a fused optimizer's state must match its
        # parameter's), a tensor that is not dense (the slice) contiguous, as a copy one by one makes them
        assert joint.stride() == single.stride()
    assert together[0].is_contiguous(memory_format=torch.channels_last) and together[6].is_contiguous()
    pointers = [made.untyped_storage().data_ptr() for made in together if made.numel()]
    assert len(set(pointers)) == len(pointers)  # saved alone: torch.save writes a shared storage whole
    assert all(made.untyped_storage().nbytes() == made.numel() * made.element_size() for made in together)
    expected = [made.clone() for made in together]
    for tensor in live:
        if tensor.dtype == torch.bool:
            tensor.logical_not_()
        else:
            tensor.add_(1)
    assert all(torch.equal(made, before) for made, before in zip(together, expected))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="copies out of a GPU")
def test_a_gpu_state_dict_strips_and_snapshots_as_its_cpu_copy_does():
    from detector.training.checkpoint_writer import snapshot

    torch.manual_seed(0)
    model = build_model(num_classes=3, scale="n").to(memory_format=torch.channels_last)
    on_gpu = copy.deepcopy(model).cuda().state_dict()
    on_cpu = model.state_dict()
    stripped, expected = to_half(on_gpu), to_half(on_cpu)
    copied = snapshot({"model": on_gpu})["model"]
    for name, tensor in on_cpu.items():
        assert stripped[name].device.type == "cpu" and stripped[name].dtype == expected[name].dtype
        assert torch.equal(stripped[name], expected[name]) and torch.equal(copied[name], tensor)


def test_a_snapshot_copies_every_tensor_of_a_nested_checkpoint_in_place_of_each():
    from detector.training.checkpoint_writer import snapshot

    weights = {"a": torch.ones(2), "b": torch.arange(3)}
    state = {"model": weights, "optimizer": {"state": {0: {"step": torch.tensor(4.0)}}, "param_groups": [{"lr": 0.1}]},
             "epochs": [1, (torch.zeros(1), "x")], "name": "run"}
    copied = snapshot(state)
    assert copied["name"] == "run" and copied["optimizer"]["param_groups"] == [{"lr": 0.1}]
    assert torch.equal(copied["model"]["b"], weights["b"]) and copied["model"]["b"] is not weights["b"]
    assert copied["optimizer"]["state"][0]["step"].item() == 4.0 and isinstance(copied["epochs"][1], tuple)
    weights["a"].add_(1)
    assert copied["model"]["a"].tolist() == [1.0, 1.0]


def _explicit_batch_norm(self: torch.nn.BatchNorm2d, x: torch.Tensor) -> torch.Tensor:
    """Eval-mode BatchNorm as a formula, so autograd reaches the running statistics too."""
    scale = self.weight * torch.rsqrt(self.running_var + self.eps)
    return (x - self.running_mean[:, None, None]) * scale[:, None, None] + self.bias[:, None, None]


def fp16_storage_bounds(model: torch.nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Decoded outputs ``[B, A, 4 + C]`` of ``model`` and, per element, the first-order bound of how far FP16
    storage of every floating tensor (weights and BatchNorm statistics) can move it.

    Each stored value w becomes w + d with |d| <= 2^-11 |w| + 2^-25 (see above), so to first order an output
    o moves by at most  sum_w |do/dw| (2^-11 |w| + 2^-25):  the worst case, every rounding error pushing o the
    same way. One backward pass per output element.
    """
    model = copy.deepcopy(model).eval()
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.forward = types.MethodType(_explicit_batch_norm, module)
    stored = [t for t in model.state_dict(keep_vars=True).values() if t.is_floating_point()]
    for tensor in stored:
        tensor.requires_grad_(True)
    with torch.enable_grad():
        outputs = decode_outputs(model(images), model.strides, model.reg_max)
        bounds = torch.empty(outputs.numel())
        rounding = [FP16_RELATIVE_ROUNDING * w.detach().abs() + FP16_SUBNORMAL_ROUNDING for w in stored]
        for index, value in enumerate(outputs.flatten()):
            grads = torch.autograd.grad(value, stored, retain_graph=True, allow_unused=True)
            bounds[index] = sum(float((g.abs() * r).sum()) for g, r in zip(grads, rounding) if g is not None)
    return outputs.detach(), bounds.view_as(outputs)


def test_stripped_weights_give_the_same_outputs_within_the_fp16_storage_bound(tmp_path: Path):
    model = lively_model()
    payload = _full_payload(build_model(num_classes=3), model)  # the EMA slot holds the model under test
    full, stripped = tmp_path / "last.pt", tmp_path / "best.pt"
    save_checkpoint(payload, full)
    save_checkpoint(strip_checkpoint(payload), stripped)
    images = synthetic_images(32, count=1, seed=3).float() / 255  # 32 px: 21 anchors x 7 values, each bounded
    expected, bounds = fp16_storage_bounds(model_from_checkpoint(full)[0], images)
    with torch.no_grad():
        rebuilt = model_from_checkpoint(stripped)[0]
        actual = decode_outputs(rebuilt(images), rebuilt.strides, rebuilt.reg_max)
    # Beyond the first-order bound: second-order terms (the bound times its own size relative to the output,
    # at most 1.4% here) and FP32 arithmetic rounding (2^-24 per operation, 2^13 times finer than the
    # storage rounding); a factor of 2 covers both.
    difference = (actual - expected).abs()
    # (Measured: the largest difference is 0.4% of its bound; the bound is the worst case, where the rounding
    # errors all agree. That the stored values are exactly the FP16 roundings is checked bitwise above.)
    assert (difference <= 2 * bounds).all(), float((difference / bounds).max())
    assert difference.max() > 0  # the weights really were rounded: the comparison is not vacuous
    # Detections after NMS: the same boxes, labels and scores, within the same bounds.
    detections = [non_max_suppression(out, NMSConfig(conf_threshold=0.01))[0] for out in (expected, actual)]
    assert torch.equal(detections[0]["labels"], detections[1]["labels"]) and len(detections[0]["labels"]) > 0
    box_bound = 2 * bounds[0, :, :4].max()
    torch.testing.assert_close(detections[1]["boxes"], detections[0]["boxes"], rtol=0, atol=float(box_bound))
    torch.testing.assert_close(detections[1]["scores"], detections[0]["scores"], rtol=0,
                               atol=float(2 * bounds[0, :, 4:].max()))


def _channels_last_conv(device: str) -> tuple[nn.Module, Callable[[nn.Module, torch.optim.Optimizer], None]]:
    """A channels-last convolution on ``device`` and one training step of it (on a fixed batch) by an optimizer."""
    torch.manual_seed(0)
    live = nn.Conv2d(8, 16, 3).to(device, memory_format=torch.channels_last)
    images = torch.randn(2, 8, 10, 10, device=device).contiguous(memory_format=torch.channels_last)

    def step(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        model(images).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)

    return live, step


@pytest.mark.parametrize("name", ["AdamW", "SGD"])
def test_a_resumed_fused_optimizer_steps_as_the_saved_one_whatever_layout_its_state_came_in(name: str):
    """A channels-last weight's moments loaded channels-first (a copy that lost the layout, or a resume that
    switched --channels-last) are put in the weight's layout: the fused CPU kernels walk memory flat and, on the
    loaded layout, stepped with other elements' moments (0.16 apart after one AdamW step at lr 0.1)."""
    from detector.checkpoint import matched_to_parameters

    def make(parameters) -> torch.optim.Optimizer:
        if name == "AdamW":
            return torch.optim.AdamW(parameters, lr=0.1, fused=True)
        return torch.optim.SGD(parameters, lr=0.1, momentum=0.9, nesterov=True, fused=True)

    live, step = _channels_last_conv("cpu")
    optimizer = make(live.parameters())
    step(live, optimizer)
    saved = copy.deepcopy(optimizer.state_dict())
    for state in saved["state"].values():
        for key, value in state.items():
            state[key] = value.contiguous()  # channels-first, where the weight is channels-last
    resumed = copy.deepcopy(live)
    loaded = make(resumed.parameters())
    loaded.load_state_dict(saved)
    assert matched_to_parameters(loaded) == (2 if name == "AdamW" else 1)  # the weight's moments, not the bias's
    assert all(value.stride() == parameter.stride() for parameter, state in loaded.state.items()
               for value in state.values() if value.shape == parameter.shape)
    step(live, optimizer)
    step(resumed, loaded)
    assert torch.equal(resumed.weight, live.weight) and torch.equal(resumed.bias, live.bias)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="copies out of a GPU")
def test_a_gpu_optimizers_snapshot_keeps_its_layout_and_resumes_the_fused_step(monkeypatch):
    """A CUDA run's last.pt (its tensors copied out together, detector.checkpoint.host_copies) holds a channels-last
    weight's moments channels-last: resumed, the fused CUDA AdamW steps (on channels-first moments it refused: the
    same layout for params, grads and moments) to the weights of the optimizer it was saved from."""
    from detector.training.checkpoint_writer import snapshot

    # The two models' weight gradients must come from the same algorithm to be equal: cuDNN may otherwise pick a
    # non-deterministic one (atomics, split reductions) for each backward pass.
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    live, step = _channels_last_conv("cuda")
    optimizer = torch.optim.AdamW(live.parameters(), lr=0.1, fused=True)
    step(live, optimizer)
    saved = snapshot(optimizer.state_dict())
    assert saved["state"][0]["exp_avg"].device.type == "cpu"
    assert saved["state"][0]["exp_avg"].stride() == live.weight.stride()
    resumed = copy.deepcopy(live)
    loaded = torch.optim.AdamW(resumed.parameters(), lr=0.1, fused=True)
    loaded.load_state_dict(saved)
    step(live, optimizer)
    step(resumed, loaded)
    assert torch.equal(resumed.weight, live.weight)


def test_a_resume_keeps_this_runs_optimizer_settings_and_takes_the_files_state():
    """load_state_dict replaces each group's settings with the saved ones; weight decay is scaled by the global batch,
    which another number of torchrun processes changes: the run's own settings stay, the moments come from the file."""
    from detector.checkpoint import RunState, Trained, restore_run, run_checkpoint

    torch.manual_seed(0)
    model, ema = build_model(num_classes=2, scale="n"), build_model(num_classes=2, scale="n")
    saved_optimizer = torch.optim.SGD([{"params": list(model.parameters()), "weight_decay": 1e-3}], lr=0.1,
                                      momentum=0.9)
    model(torch.rand(1, 3, 64, 64))[0].sum().backward()
    saved_optimizer.step()
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    checkpoint = run_checkpoint(Trained(model, ema, saved_optimizer, scaler), RunState(epoch=0, config={}, names=[],
                                                                                       precision="fp32"))
    resumed = copy.deepcopy(model)
    optimizer = torch.optim.SGD([{"params": list(resumed.parameters()), "weight_decay": 5e-4}], lr=0.1, momentum=0.9)
    restore_run(checkpoint, Trained(resumed, copy.deepcopy(ema), optimizer, scaler))
    assert optimizer.param_groups[0]["weight_decay"] == 5e-4
    first = next(iter(resumed.parameters()))
    assert torch.equal(optimizer.state[first]["momentum_buffer"],
                       saved_optimizer.state[next(iter(model.parameters()))]["momentum_buffer"])
