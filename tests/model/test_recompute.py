"""BatchNorm and SiLU with the activation between them recomputed in the backward pass (detector/model/recompute.py).

On the CPU both paths run the same kernels (native BatchNorm, SiLU and their backward functions) on the same inputs,
so outputs, gradients and running statistics are compared bit for bit.
"""

import copy

import pytest
import torch

from detector.model import build_model
from detector.model.blocks import Conv
from detector.model.recompute import RECOMPUTED, recompute_activations, recompute_wanted


def _conv_pair(channels_last: bool) -> tuple[Conv, Conv, torch.Tensor]:
    torch.manual_seed(0)
    plain = Conv(8, 16, 3, 2).train()
    with torch.no_grad():  # BatchNorm's affine parameters away from 1 and 0, so their gradients are not trivial
        plain.bn.weight.uniform_(0.5, 1.5)
        plain.bn.bias.uniform_(-0.5, 0.5)
    recomputed = copy.deepcopy(plain)
    recomputed.recompute = True
    layout = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(4, 8, 20, 20).contiguous(memory_format=layout)
    return plain, recomputed, x


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("autocast", [False, True])
def test_a_recomputed_block_trains_bit_for_bit_as_the_plain_one(channels_last, autocast):
    plain, recomputed, x = _conv_pair(channels_last)
    results = []
    for module in (plain, recomputed):
        given = x.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = module(given)
        weight = torch.linspace(-1, 1, out.numel()).view_as(out)
        (out.float() * weight).sum().backward()
        results.append((out, given.grad, [p.grad for p in module.parameters()], list(module.bn.buffers())))
    (out_a, grad_a, params_a, buffers_a), (out_b, grad_b, params_b, buffers_b) = results
    assert torch.equal(out_a, out_b) and torch.equal(grad_a, grad_b)
    assert all(torch.equal(a, b) for a, b in zip(params_a, params_b))
    assert all(torch.equal(a, b) for a, b in zip(buffers_a, buffers_b))  # running stats and the counter, moved once
    assert int(recomputed.bn.num_batches_tracked) == 1


def _saved_storages(module: torch.nn.Module, x: torch.Tensor) -> list[int]:
    """The sizes in bytes of the distinct storages the forward pass keeps for backward."""
    storages = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        module(x)
    return list(storages.values())


def test_a_recomputed_block_keeps_one_activation_less():
    plain, recomputed, x = _conv_pair(channels_last=True)
    activation = 4 * 16 * 10 * 10 * 4  # one float tensor of the block's output size
    # Plain: the convolution's output (BatchNorm's input) and BatchNorm's output (SiLU's); recomputed: the first.
    assert _saved_storages(plain, x).count(activation) == 2
    assert _saved_storages(recomputed, x).count(activation) == 1
    assert x.untyped_storage().nbytes() in _saved_storages(recomputed, x)  # the convolution's input, as before


def test_evaluation_and_no_grad_take_the_plain_path():
    plain, recomputed, x = _conv_pair(channels_last=False)
    with torch.no_grad():
        assert torch.equal(plain(x), recomputed(x))  # training mode, no graph: BatchNorm's own module
    given = x.clone().requires_grad_(True)
    trained = copy.deepcopy(recomputed)  # (its running statistics move)
    assert type(trained(given).grad_fn).__name__ == "BatchNormSiLUBackward"  # training with a graph: ours
    plain.eval(), recomputed.eval()
    assert torch.equal(plain(x), recomputed(x))
    assert type(recomputed(given).grad_fn).__name__ == type(plain(given).grad_fn).__name__ != "BatchNormSiLUBackward"


def test_the_model_recomputes_its_largest_blocks_and_trains_the_same():
    torch.manual_seed(0)
    plain = build_model(num_classes=3).train()
    recomputed = copy.deepcopy(plain)
    assert recompute_activations(recomputed, True) == list(RECOMPUTED)
    flagged = {name.split(".")[0] for name, module in recomputed.named_modules()
               if isinstance(module, Conv) and module.recompute}
    assert flagged == set(RECOMPUTED)
    images = torch.rand(2, 3, 64, 64)
    for model in (plain, recomputed):
        outputs = model(images)
        sum((out.float() ** 2).mean() for out in outputs).backward()
    for (name, a), (_, b) in zip(plain.named_parameters(), recomputed.named_parameters()):
        assert (a.grad is None) == (b.grad is None), name  # a parameter the loss does not reach has none in both
        assert a.grad is None or torch.equal(a.grad, b.grad), name
    assert recompute_activations(recomputed, False) == []
    assert not any(isinstance(module, Conv) and module.recompute for module in recomputed.modules())


def test_recompute_is_on_by_default_on_cuda_only():
    assert recompute_wanted("auto", torch.device("cuda")) and not recompute_wanted("auto", torch.device("cpu"))
    assert recompute_wanted("on", torch.device("cpu")) and not recompute_wanted("off", torch.device("cuda"))
    with pytest.raises(ValueError, match="--recompute must be one of"):
        recompute_wanted("sometimes", torch.device("cpu"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_under_fp16_autocast_the_gradients_match_the_plain_block():
    plain, recomputed, x = _conv_pair(channels_last=True)
    plain, recomputed, x = plain.cuda(), recomputed.cuda(), x.cuda()
    grads = []
    for module in (plain, recomputed):
        with torch.autocast("cuda", dtype=torch.float16):
            out = module(x)
        out.float().square().mean().backward()
        grads.append([p.grad.float() for p in module.parameters()])
    # cuDNN's BatchNorm may serve the plain block and the native kernel ours: the same arithmetic summed in another
    # order. FP16 activations carry 2**-11 relative rounding; a gradient summed over 4 x 10 x 10 positions from
    # such terms differs by a few of those: 1e-2 relative (with an absolute floor for near-zero sums) bounds it.
    for a, b in zip(*grads):
        assert torch.allclose(a, b, rtol=1e-2, atol=1e-4)


def test_a_sync_batch_norm_keeps_its_own_path():
    """--sync-bn's SyncBatchNorm computes its statistics across ranks: the recomputed path would use this rank's."""
    _, recomputed, x = _conv_pair(channels_last=False)
    recomputed.bn = torch.nn.SyncBatchNorm.convert_sync_batchnorm(recomputed.bn)
    given = x.clone().requires_grad_(True)
    assert type(recomputed(given).grad_fn).__name__ != "BatchNormSiLUBackward"  # SyncBatchNorm's forward ran


def test_one_value_a_channel_is_refused_as_batch_norm_refuses_it():
    plain, recomputed, _ = _conv_pair(channels_last=False)
    x = torch.randn(1, 8, 1, 1)
    for module in (plain, recomputed):
        with pytest.raises(ValueError, match="Expected more than 1 value per channel when training"):
            module(x)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_recomputed_batch_norm_output_is_the_forwards_bit_for_bit():
    """What the exact gradients rest on: BatchNorm's kernel run again on the kept FP16 channels-last input, without
    the running statistics, gives the forward's output."""
    torch.manual_seed(0)
    x = torch.randn(8, 32, 40, 40, device="cuda").half().contiguous(memory_format=torch.channels_last)
    weight, bias = torch.rand(32, device="cuda") + 0.5, torch.randn(32, device="cuda")
    running_mean, running_var = torch.zeros(32, device="cuda"), torch.ones(32, device="cuda")
    forward = torch.native_batch_norm(x, weight, bias, running_mean, running_var, True, 0.03, 1e-3)[0]
    again = torch.native_batch_norm(x, weight, bias, None, None, True, 0.0, 1e-3)[0]
    assert forward.dtype == torch.float16 and torch.equal(forward, again)
