"""The fused warp + pixel-operations kernel against the PyTorch functions it replaces on CUDA.

On the CPU the kernel runs under Triton's interpreter (``TRITON_INTERPRET=1``), the same kernel source the GPU
compiles. Triton reads that variable when it is imported, so the interpreter cases run in a child pytest that
starts with it set (:func:`test_the_kernel_checks_pass_under_the_interpreter`); in this process they skip. On a
GPU the same checks run compiled (they skip without CUDA).
"""

import dataclasses
import importlib
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from detector.data import warp_kernel
from detector.data.augment import PAD_VALUE
from detector.data.batch_augment import TABLE_COLUMNS, PixelOps, apply_pixel_ops
from detector.data.device_augment import WarpBatch, pack_warp_batch, render
from detector.data.warp_kernel import fused_unavailable, render_fused
from detector.training.step_input import step_input
from tests.data.test_device_augment import DEVICE_WEIGHTS_LEVELS, EPS, _fixed_sources, device_position_px

pytest.importorskip("triton")

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEVICES = [pytest.param("interpreter", marks=pytest.mark.skipif(not INTERPRETED, reason="run by the child pytest of "
                                                                "test_the_kernel_checks_pass_under_the_interpreter")),
           pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available() or INTERPRETED,
                                                         reason="needs CUDA"))]

# Hue shifts, saturation and value gains, flips in every combination, the channel swap (--bgr) after HSV and a
# flip, one image left as it is. A shifted hue is continuous where the hue wraps from 1 to 0 (the channels are
# continuous around the wrap), so samples rounded either side of it stay close.
OPS = [PixelOps(0.015, 1.5, 0.7, flip_lr=True), PixelOps(-0.01, 0.4, 1.35, flip_ud=True, swap_channels=True),
       PixelOps(0.0, 1.0, 1.0, flip_lr=True, flip_ud=True), PixelOps()]


@pytest.fixture
def device(request) -> torch.device:
    return torch.device("cpu" if request.param == "interpreter" else "cuda")


@pytest.mark.skipif(INTERPRETED, reason="this is the child")
def test_the_kernel_checks_pass_under_the_interpreter():
    root = Path(__file__).resolve().parents[2]
    child = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-k", "interpreter", str(Path(__file__))],
        # One thread: the child's tensors are tiny, and the suite's two workers hold the cores already.
        cwd=root, env={**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
        timeout=300,
    )
    summary = child.stdout.strip().splitlines()[-1] if child.stdout.strip() else child.stderr[-2000:]
    assert child.returncode == 0, child.stdout[-4000:] + child.stderr[-2000:]
    # 3 sizes and layouts, the hue shift, a given buffer, a half-precision one, two failures
    assert summary.startswith("8 passed"), summary


def hsv_lipschitz(ops: list[PixelOps]) -> float:
    """How much the HSV round trip with a hue shift and gains (gs, gv) can magnify a change of the input RGB (max
    over channels).

    Output channel = v' - v's' f(k), v' = clamp(v gv), s' = clamp(s gs), k = 6 (h + shift) + n, f 1-Lipschitz and
    continuous around the hue's wrap. A change d of the input moves v' by gv d; v s is the chroma (max - min, moves
    by 2d), so v's' moves by 2 gs gv d; the hue (g - b) / (6 chroma) moves by at most 4d / (6 chroma), so f(k) moves
    by 4 d / chroma, times v's' <= chroma gs gv. Sum: gv + 2 gs gv + 4 gs gv.
    """
    return max(v + 2 * s * v + 4 * s * v for _, s, v in (op.hsv for op in ops))


@pytest.mark.parametrize("device", DEVICES, indirect=True)
# The warp's own size and multi-scale sizes folded in; both memory layouts (the kernel writes through strides).
@pytest.mark.parametrize("size,channels_last", [(56, True), (64, False), (72, True)])
def test_fused_kernel_matches_render_then_pixel_ops(device, size, channels_last):
    batch = pack_warp_batch([source for _, _, source in _fixed_sources(64)])
    fused = render_fused(batch, device, size=size, channels_last=channels_last, pixel_ops=OPS)
    expected = apply_pixel_ops(render(batch, device, size=size, channels_last=channels_last), OPS)
    assert fused.shape == expected.shape == (4, 3, size, size) and fused.dtype == torch.float32
    layout = torch.channels_last if channels_last else torch.contiguous_format
    assert fused.is_contiguous(memory_format=layout)
    # Before HSV: each side places its samples within device_position_px of the exact point (the same formulas,
    # rounded in another order), on pixels up to 255 levels apart in x and in y, plus each side's float32 weights.
    before_hsv = (2 * device_position_px(batch) * 2 * 255 + 2 * DEVICE_WEIGHTS_LEVELS) / 255
    # The HSV round trip magnifies that by at most hsv_lipschitz, and rounds ~30 times on values up to 6, each by
    # at most 2 ulp compiled (Triton's divisions are within 2 ulp, not correctly rounded).
    tolerance = hsv_lipschitz(OPS) * before_hsv + 30 * 6 * 2 * EPS
    torch.testing.assert_close(fused.cpu(), expected.cpu(), rtol=0, atol=tolerance)
    # The flips are exact mirrors, not a coincidence of symmetric content: unflipped, image 0 differs.
    plain = render_fused(batch, device, size=size, channels_last=channels_last,
                         pixel_ops=[PixelOps(*OPS[0].hsv)] + OPS[1:])
    assert (plain[0] - fused[0].flip(2)).abs().max() <= tolerance < (plain[0] - fused[0]).abs().max()
    # The swap reorders the stores and nothing else: image 1 unswapped, the same values in the other channel order.
    unswapped = render_fused(batch, device, size=size, channels_last=channels_last,
                             pixel_ops=[OPS[0], dataclasses.replace(OPS[1], swap_channels=False), *OPS[2:]])
    assert torch.equal(fused[1], unswapped[1].flip(0)) and not torch.equal(fused[1], unswapped[1])
    assert torch.equal(fused[[0, 2, 3]], unswapped[[0, 2, 3]])  # a flag of its own image only


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_the_kernel_writes_into_a_given_buffer_through_its_strides(device):
    """A captured training step's input buffer is a view of a larger memory (detector/training/cuda_graph.py): the
    kernel fills exactly the view, through its strides, with what it renders into a new tensor."""
    batch = pack_warp_batch([source for _, _, source in _fixed_sources(64)])
    fresh = render_fused(batch, device, size=56, channels_last=True, pixel_ops=OPS)
    used = fresh.numel()
    memory = torch.full((used + 1000,), -1.0, device=device)
    out = memory[:used].as_strided(fresh.shape, fresh.stride())
    written = render_fused(batch, device, size=56, channels_last=True, pixel_ops=OPS, out=out)
    assert written is out and torch.equal(out, fresh)
    assert bool((memory[used:] == -1).all())
    with pytest.raises(ValueError, match="renders float"):
        render_fused(batch, device, size=56, channels_last=True, pixel_ops=OPS, out=fresh.double())


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_a_half_precision_buffer_holds_the_fp32_render_rounded_as_autocast_rounds(device):
    """A step's input under autocast is made in its dtype (detector/training/step_input.py): the kernel computes in
    FP32 and its store rounds to FP16 to nearest even, as autocast's cast of the FP32 input did, bit for bit."""
    batch = pack_warp_batch([source for _, _, source in _fixed_sources(64)])
    fresh = render_fused(batch, device, size=56, channels_last=True, pixel_ops=OPS)
    half = torch.empty_like(fresh, dtype=torch.float16)
    assert render_fused(batch, device, size=56, channels_last=True, pixel_ops=OPS, out=half) is half
    assert torch.equal(half, fresh.to(torch.float16)) and half.is_contiguous(memory_format=torch.channels_last)
    bf16 = torch.empty_like(fresh, dtype=torch.bfloat16)
    render_fused(batch, device, size=56, channels_last=True, pixel_ops=OPS, out=bf16)
    if device.type == "cuda":  # compiled: the store rounds to nearest even (cvt.rn.bf16.f32), as the cast does
        assert torch.equal(bf16, fresh.to(torch.bfloat16))
    else:  # Triton's interpreter casts to BF16 by truncation: within one BF16 step of the rounded value
        step = 2.0**-7 * fresh.abs()  # a BF16 step (7 stored mantissa bits) at the value; zero is exact
        assert bool(((bf16.float() - fresh).abs() <= step).all())


@pytest.mark.skipif(INTERPRETED or torch.cuda.is_available(), reason="the CUDA cases compile and run it")
@pytest.mark.parametrize("hsv,out", [(True, "fp32"), (False, "fp32"), (True, "fp16"), (False, "bf16")])
@pytest.mark.parametrize("unit_stride", ["stride_c", "stride_x"])  # channels-last, contiguous
def test_the_kernel_compiles_for_an_h100_without_one(hsv, out, unit_stride):
    """What the interpreter cannot show: that Triton's compiler takes the kernel (types, constexpr branches, the
    unrolled corners) down to an sm_90 binary, here on a machine without a GPU (Triton brings its own ptxas).
    As a launch specialises it: int32 scalars, the output's stride of 1 a constant; the output FP32, or FP16 / BF16
    as a step's input under autocast (detector/training/step_input.py, ``step_input_dtype``)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel = warp_kernel._kernel(False)
    pointers = {"atlas": "*u8", "theta": "*fp32", "bounds": "*fp32", "table": "*fp32", "out": f"*{out}"}
    constants = {"HSV": hsv, "COLUMNS": TABLE_COLUMNS, "BLOCK": warp_kernel.BLOCK, unit_stride: 1}
    signature = {name: pointers.get(name, "constexpr" if name in constants else "i32") for name in kernel.arg_names}
    compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constants),
                              target=GPUTarget("cuda", 90, 32))
    assert compiled.asm["cubin"] and ".target sm_90" in compiled.asm["ptx"]


@pytest.mark.skipif(INTERPRETED, reason="the parent runs it")
def test_a_launch_binds_what_render_fused_passes(monkeypatch):
    """What neither the interpreter nor the compile test reaches: the binder Triton generates for a compiled launch.
    Its parameters become locals of a generated function beside its own (``params``, ``specialization``,
    ``options``): a kernel parameter named ``params`` was shadowed by a dict there, and every launch on the H100
    failed with 'failed to specialize argument of type: dict'. Here render_fused's own arguments go through that
    binder (the compiled kernel's, built without a GPU) on the CPU."""
    from triton.backends.compiler import BaseBackend

    create_function_from_signature = getattr(importlib.import_module("triton.runtime.jit"),
                                             "create_function_from_signature", None)
    if create_function_from_signature is None:  # internal to Triton (3.6 and 3.8 have it): a later one may move it
        pytest.skip("this Triton builds its launch binder elsewhere")
    kernel = warp_kernel._kernel(False)
    binder = create_function_from_signature(kernel.signature, kernel.params, BaseBackend)
    bound: list[list[tuple]] = []

    class Launcher:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: bound.append(binder(*args, **kwargs)[1])

    monkeypatch.setattr(warp_kernel, "_kernel", lambda interpret: Launcher())
    monkeypatch.setattr(warp_kernel, "interpreting", lambda: True)  # the CPU device takes the kernel's path
    monkeypatch.setattr(warp_kernel, "_failed", [])
    batch = pack_warp_batch([source for _, _, source in _fixed_sources(64)])
    render_fused(batch, torch.device("cpu"), size=64, channels_last=True, pixel_ops=OPS)
    assert len(bound) == 1 and not warp_kernel._failed
    kinds = dict(zip(kernel.arg_names, (kind for kind, _ in bound[0])))
    assert [kinds[name] for name in ("atlas", "theta", "bounds", "table", "out")] == ["*u8"] + ["*fp32"] * 4
    assert kinds["HSV"] == kinds["COLUMNS"] == kinds["BLOCK"] == "constexpr"


def block_atlas(size: int, count: int, rng: np.random.Generator) -> tuple[WarpBatch, torch.Tensor]:
    """``count`` images of ``size`` px made of 8x8 blocks of one colour each, far from the hue's wrap, in an atlas
    whose matrices sample every output pixel at (up to rounding) its own pixel centre; -> the batch and the
    images as float [count, 3, size, size] in [0, 1].

    Every block is a colour whose hue is at least ~0.04 turns from 0 and whose channels differ by 20+ levels, so
    a sample that rounding moves a hair off a pixel centre keeps its hue on the same side of the wrap.
    """
    blocks = size // 8
    colours = []
    while len(colours) < count * blocks * blocks:
        red, green, blue = (int(v) for v in rng.integers(0, 256, 3))
        if min(abs(red - green), abs(green - blue), abs(red - blue)) >= 20:
            colours.append((red, green, blue))
    images = np.array(colours, np.uint8).reshape(count, blocks, blocks, 3).repeat(8, 1).repeat(8, 2)
    gap = 1
    height, width = count * (size + gap) + gap, size + 2 * gap
    atlas = np.full((height, width, 3), PAD_VALUE, np.uint8)
    thetas, bounds = [], []
    for index, image in enumerate(images):
        top = gap + index * (size + gap)
        atlas[top : top + size, gap : gap + size] = image
        # Output pixel x -> atlas column gap + x: (2 (gap + x) + 1) / width - 1 = (n + 1) size / width + 2 gap / width
        # - 1, with n = (2x + 1) / size - 1 the output's normalised coordinate (likewise rows, from top).
        thetas.append([[size / width, 0, (size + 2 * gap) / width - 1],
                       [0, size / height, (size + 2 * top) / height - 1]])
        first_x, first_y = (2 * gap + 1) / width - 1, (2 * top + 1) / height - 1
        last_x, last_y = (2 * (gap + size - 1) + 1) / width - 1, (2 * (top + size - 1) + 1) / height - 1
        bounds.append([first_x, first_y, last_x, last_y])
    batch = WarpBatch(torch.from_numpy(atlas), torch.tensor(thetas, dtype=torch.float32),
                      torch.tensor(bounds, dtype=torch.float32), size)
    return batch, torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_fused_kernel_applies_the_hue_shift_as_the_pytorch_path_does(device):
    batch, images = block_atlas(64, 4, np.random.default_rng(3))
    # The matrices put each sample on its own pixel: the render reproduces the images (float32 positions only).
    rendered = render(batch, device, size=64, channels_last=True).cpu()
    torch.testing.assert_close(rendered, images, rtol=0, atol=1e-4)
    ops = [PixelOps(0.015, 1.3, 0.8), PixelOps(-0.015, 0.6, 1.2, flip_lr=True), PixelOps(0.01, 1.0, 1.0),
           PixelOps(-0.01, 1.69, 1.39, flip_ud=True)]
    fused = render_fused(batch, device, size=64, channels_last=True, pixel_ops=ops).cpu()
    expected = apply_pixel_ops(images, ops)
    # Each sample sits within device_position_px of its pixel centre (8 px blocks: a neighbour's weight is at
    # most that, on colours up to 255 levels apart), magnified by the HSV round trip, plus its own roundings.
    before_hsv = (device_position_px(batch) * 255 + DEVICE_WEIGHTS_LEVELS) / 255
    tolerance = hsv_lipschitz(ops) * before_hsv + 30 * 6 * 2 * EPS  # as above
    torch.testing.assert_close(fused, expected, rtol=0, atol=tolerance)
    # The shift is applied, not dropped: with the hue left alone the result is measurably different.
    unhued = apply_pixel_ops(images, [PixelOps(0.0, *op.hsv[1:], flip_lr=op.flip_lr, flip_ud=op.flip_ud)
                                      for op in ops])
    assert (unhued - fused).abs().amax((1, 2, 3)).min() > 3 * tolerance


@pytest.mark.skipif(INTERPRETED, reason="the interpreter makes the CPU a kernel device")
def test_the_cpu_renders_with_pytorch_and_step_input_agrees():
    assert fused_unavailable(torch.device("cpu")) == "not a CUDA device"
    batch = pack_warp_batch([source for _, _, source in _fixed_sources(64)])
    assert render_fused(batch, torch.device("cpu"), size=64, channels_last=True, pixel_ops=OPS) is None
    stepped = step_input(batch, 64, torch.device("cpu"), channels_last=True, pixel_ops=OPS)
    assert torch.equal(stepped, apply_pixel_ops(render(batch, torch.device("cpu"), size=64, channels_last=True), OPS))


@pytest.mark.parametrize("device", DEVICES[:1], indirect=True)
def test_a_failing_kernel_says_so_once_and_leaves_the_rest_to_pytorch(device, monkeypatch, capsys):
    monkeypatch.setattr(warp_kernel, "_failed", [])

    class Broken:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                raise RuntimeError("PTX assembly failed\nmore detail")
            return launch

    monkeypatch.setattr(warp_kernel, "_kernel", lambda interpret: Broken())
    batch = pack_warp_batch([source for _, _, source in _fixed_sources(64)])
    assert render_fused(batch, device, size=64, channels_last=True, pixel_ops=OPS) is None
    assert capsys.readouterr().out == ("device augmentation: fused augmentation kernel failed (RuntimeError: PTX "
                                       "assembly failed); using PyTorch ops\n")
    assert fused_unavailable(torch.device("cpu")).startswith("fused augmentation kernel failed")
    assert render_fused(batch, device, size=64, channels_last=True, pixel_ops=OPS) is None
    assert capsys.readouterr().out == ""  # said once
    stepped = step_input(batch, 64, torch.device("cpu"), channels_last=True, pixel_ops=OPS)
    assert torch.equal(stepped, apply_pixel_ops(render(batch, torch.device("cpu"), size=64, channels_last=True), OPS))


@pytest.mark.parametrize("device", DEVICES[:1], indirect=True)
def test_a_triton_that_does_not_import_is_said_once(device, monkeypatch, capsys):
    monkeypatch.setattr(warp_kernel, "_failed", [])

    def no_triton(interpret):
        raise ImportError("No module named 'triton'")

    monkeypatch.setattr(warp_kernel, "_kernel", no_triton)
    batch = pack_warp_batch([source for _, _, source in _fixed_sources(64)])
    for _ in range(2):
        assert render_fused(batch, device, size=64, channels_last=True, pixel_ops=OPS) is None
    assert capsys.readouterr().out == ("device augmentation: triton is not usable (ImportError: No module named "
                                       "'triton'); using PyTorch ops\n")


@pytest.mark.skipif(INTERPRETED, reason="the parent runs it")
def test_a_variants_slow_first_launch_is_said_once(monkeypatch, capsys):
    """Triton compiles each variant of the kernel at its first launch (seconds on a fresh machine, inside a run's
    first epoch): that launch is named in one line; a fast first launch (a cached kernel), a later slow launch of
    the same variant and a device that does not report say nothing."""
    monkeypatch.setattr(warp_kernel, "_launched", set())
    slow = lambda: time.sleep(warp_kernel.SLOW_FIRST_LAUNCH_S + 0.01)  # noqa: E731
    fast = lambda: None  # noqa: E731
    warp_kernel.timed_launch(fast, (torch.float16, True), report=True)
    warp_kernel.timed_launch(slow, (torch.float16, True), report=True)  # seen already: not its first launch
    warp_kernel.timed_launch(slow, (torch.float32, False), report=False)
    assert capsys.readouterr().out == ""
    warp_kernel.timed_launch(slow, (torch.bfloat16, True), report=True)
    warp_kernel.timed_launch(slow, (torch.bfloat16, True), report=True)
    said = capsys.readouterr().out.splitlines()
    assert len(said) == 1 and said[0].startswith("device augmentation: the fused kernel's first launch (bfloat16, HSV)")
