import pytest
import torch

from detector.device import resolve_device


def test_empty_request_picks_cuda_only_when_available():
    assert resolve_device("") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu") == torch.device("cpu")


@pytest.mark.parametrize("request_", ["gpu", "tpu:0", "cuda:x"])
def test_unknown_devices_are_one_line_naming_the_flag(request_: str):
    with pytest.raises(ValueError, match=r"--device must be cpu, cuda or cuda:N"):
        resolve_device(request_)


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
