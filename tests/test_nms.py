"""torchvision's NMS kernel without the torchvision package: the same answers, and ``val``/``predict`` without
``torch._dynamo``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torchvision.ops

from detector import nms as nms_module
from detector.nms import batched_nms, library_files, nms

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))]
ROOT = Path(__file__).resolve().parents[1]


def clustered(count: int, *, seed: int, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Overlapping boxes (so NMS suppresses) and distinct scores (so no answer depends on a tie)."""
    generator = torch.Generator().manual_seed(seed)
    centres = torch.rand(count, 2, generator=generator) * 200
    sizes = torch.rand(count, 2, generator=generator) * 40 + 5
    scores = torch.randperm(count, generator=generator).float() / count
    return torch.cat((centres - sizes / 2, centres + sizes / 2), 1).to(device), scores.to(device)


@pytest.mark.parametrize("device", DEVICES)
def test_nms_keeps_what_torchvision_keeps(device):
    boxes, scores = clustered(600, seed=0, device=device)
    for threshold in (0.3, 0.5, 0.7):
        assert torch.equal(nms(boxes, scores, threshold), torchvision.ops.nms(boxes, scores, threshold))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("count", [0, 40, 1_100, 30_000])  # one NMS over shifted boxes up to 1,000 boxes on the
# CPU and 25,000 on CUDA, one per group above
def test_batched_nms_keeps_what_torchvision_keeps_on_either_side_of_its_size_limit(device, count):
    boxes, scores = clustered(count, seed=1, device=device)
    groups = torch.randint(0, 7, (count,), generator=torch.Generator().manual_seed(2)).to(device)
    got = batched_nms(boxes, scores, groups, 0.5)
    assert torch.equal(got, torchvision.ops.batched_nms(boxes, scores, groups, 0.5))
    assert got.dtype == torch.int64 and got.device.type == device


@pytest.mark.parametrize("device", DEVICES)
def test_batched_nms_switches_to_one_nms_per_group_where_torchvision_does(device, monkeypatch):
    """Both strategies keep the same boxes, so the answers cannot tell which one ran; the kernel's calls can, with
    torchvision's own batched_nms as the oracle, just below and just above each device's size limit."""
    import torchvision.ops.boxes

    ours, theirs = [], []
    monkeypatch.setattr(nms_module, "nms", lambda boxes, scores, threshold: ours.append(len(boxes)) or
                        torchvision.ops.nms(boxes, scores, threshold))
    real = torchvision.ops.boxes.nms
    monkeypatch.setattr(torchvision.ops.boxes, "nms", lambda boxes, scores, threshold: theirs.append(len(boxes)) or
                        real(boxes, scores, threshold))
    limit = nms_module.CPU_COORDINATE_LIMIT if device == "cpu" else nms_module.COORDINATE_LIMIT
    for count in (limit // 4, limit // 4 + 1):
        boxes, scores = clustered(count, seed=6, device=device)
        groups = torch.arange(count, device=device) % 3
        ours.clear(), theirs.clear()
        batched_nms(boxes, scores, groups, 0.5)
        torchvision.ops.batched_nms(boxes, scores, groups, 0.5)
        assert ours == theirs and len(ours) == (1 if count == limit // 4 else 3)


def test_the_compiled_library_is_found_in_the_installed_torchvision():
    """The loader's knowledge of torchvision's layout (``_C_stable`` or ``_C``) holds for the torchvision here."""
    assert library_files(Path(torchvision.__file__).parent)


@pytest.mark.parametrize("found", ["nothing", "a file that is no library"])
def test_without_a_library_that_loads_it_falls_back_to_importing_torchvision(found, monkeypatch, tmp_path):
    broken = tmp_path / "_C.so"
    broken.write_text("not a shared library")
    monkeypatch.setattr(nms_module, "registered_nms", lambda: None)  # as if nothing were loaded yet
    monkeypatch.setattr(nms_module, "library_files", lambda folder: [] if found == "nothing" else [broken])
    nms_module.nms_kernel.cache_clear()
    try:
        boxes, scores = clustered(50, seed=5)
        assert torch.equal(nms(boxes, scores, 0.5), torchvision.ops.nms(boxes, scores, 0.5))
    finally:
        nms_module.nms_kernel.cache_clear()


def test_val_and_predict_never_import_torchvision_or_dynamo(checkpoint: Path, yolo_yaml: Path, tmp_path: Path):
    """Both commands run in a fresh interpreter (at most 110 s); what they imported is read there after they
    return. Then torchvision is imported there, as ``export`` may do after its parity check's NMS loaded the kernel
    alone: torchvision loads the library a second time, which must change nothing."""
    data = yolo_yaml
    image = next(data.parent.glob("images/val/*"))
    script = (
        "import sys\n"
        "from detector.cli import main\n"
        f"assert main(['val', '--weights', {str(checkpoint)!r}, '--data', {str(data)!r}, '--imgsz', '64',"
        f" '--workers', '0', '--device', 'cpu', '--project', {str(tmp_path / 'runs')!r}]) == 0\n"
        f"assert main(['predict', '--weights', {str(checkpoint)!r}, '--source', {str(image)!r}, '--imgsz', '64',"
        f" '--device', 'cpu', '--project', {str(tmp_path / 'runs')!r}]) == 0\n"
        "print(sorted(name for name in ('torchvision', 'torch._dynamo') if name in sys.modules))\n"
        "import torch, torchvision.ops\n"
        "from detector.nms import nms\n"
        "boxes = torch.tensor([[0.0, 0.0, 10.0, 10.0], [1.0, 1.0, 11.0, 11.0], [50.0, 50.0, 60.0, 60.0]])\n"
        "scores = torch.tensor([0.9, 0.8, 0.7])\n"
        "print(torchvision.ops.nms(boxes, scores, 0.5).tolist(), nms(boxes, scores, 0.5).tolist())\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-2:] == ["[]", "[0, 2] [0, 2]"]


