import pytest
import torch

from detector.device import resolve_device


def test_empty_request_picks_cuda_only_when_available():
    assert resolve_device("") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu") == torch.device("cpu")


@pytest.mark.parametrize("request_", ["gpu", "tpu:0", "cuda:x", "mps", "xpu"])
def test_unknown_devices_are_one_line_naming_the_flag(request_: str):
    with pytest.raises(ValueError, match=r"^--device must be cpu, cuda, cuda:N or N \(got .*\); this trainer runs on "
                                         r"CPUs and CUDA GPUs only$"):
        resolve_device(request_)


@pytest.mark.parametrize("request_", ["0,1", "cpu,0"])
def test_several_devices_point_to_torchrun(request_: str):
    with pytest.raises(ValueError, match=rf"^--device {request_}: one device per process here; for several GPUs "
                                         r"launch with torchrun --nproc_per_node N"):
        resolve_device(request_)


def test_ultralytics_spellings_read_as_there(monkeypatch):
    """``--device 0`` is cuda:0 (as ``device=0`` is through the aliases), ``CPU`` the CPU, ``-1`` the default."""
    assert resolve_device("CPU") == torch.device("cpu") and resolve_device(" Cpu ") == torch.device("cpu")
    assert resolve_device("-1") == resolve_device("")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("1") == torch.device("cuda:1") and resolve_device("CUDA:0") == torch.device("cuda:0")
    with pytest.raises(ValueError, match=r"^--device 2 was requested but this machine has 2 CUDA GPU\(s\)"):
        resolve_device("2")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_a_bare_index_without_a_gpu_says_there_is_none():
    with pytest.raises(ValueError, match="^--device 0 was requested but no CUDA GPU is available$"):
        resolve_device("0")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_cuda_without_a_gpu_is_refused():
    with pytest.raises(ValueError, match="--device cuda:1 was requested but no CUDA GPU is available"):
        resolve_device("cuda:1")


def test_a_gpu_index_past_the_machines_is_refused_in_one_line(monkeypatch):
    """cuda:N with N at or past the count of GPUs (a one-GPU machine here by mock: only the count is read)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve_device("cuda:0") == torch.device("cuda:0") and resolve_device("cuda") == torch.device("cuda")
    with pytest.raises(ValueError, match=r"--device cuda:1 was requested but this machine has 1 CUDA GPU\(s\)"):
        resolve_device("cuda:1")
