import torch

from detector.model.blocks import concat


def _parts() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [
        torch.randn(2, c, 5, 6, generator=generator, dtype=torch.double)
        .contiguous(memory_format=torch.channels_last)
        .requires_grad_(True)
        for c in (3, 4, 2)
    ]


def test_concat_equals_torch_cat_and_its_gradients():
    parts = _parts()
    torch.autograd.gradcheck(lambda *xs: concat(xs, 1), parts)
    weight = torch.randn(2, 9, 5, 6, dtype=torch.double)
    (concat(parts, 1) * weight).sum().backward()
    ours = [p.grad.clone() for p in parts]
    for p in parts:
        p.grad = None
    (torch.cat(parts, 1) * weight).sum().backward()
    for mine, reference in zip(ours, (p.grad for p in parts)):
        assert torch.equal(mine, reference)


def _dense_channels_last_grads(cat) -> list[bool]:
    """Which of the parts' gradients arrive dense in channels-last memory after ``cat(parts, 1)``."""
    parts, seen = _parts(), []
    for p in parts:
        p.register_hook(lambda grad: seen.append(grad.is_contiguous(memory_format=torch.channels_last)))
    upstream = torch.randn(2, 9, 5, 6, dtype=torch.double).contiguous(memory_format=torch.channels_last)
    cat(parts, 1).backward(upstream)
    return seen


def test_concat_hands_back_dense_channels_last_gradients():
    assert _dense_channels_last_grads(concat) == [True, True, True]
    # torch.cat alone hands back channel slices, which are not dense: the case concat exists for.
    assert _dense_channels_last_grads(torch.cat) == [False, False, False]


def test_concat_is_the_plain_op_without_autograd():
    parts = _parts()
    with torch.no_grad():
        out = concat(parts, 1)
    assert out.grad_fn is None and torch.equal(out, torch.cat([p.detach() for p in parts], 1))


def test_c2f_gives_the_same_output_with_and_without_gradients():
    """Without gradients C2f concatenates its first convolution's output whole instead of as two halves (a layout
    Inductor compiles better); the values are the same ones, bit for bit."""
    from detector.model.blocks import C2f

    torch.manual_seed(0)
    block = C2f(16, 32, n=2, shortcut=True).eval()
    x = torch.randn(2, 16, 12, 12).contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        without = block(x)
    with_grad = block(x.requires_grad_())
    assert with_grad.requires_grad and torch.equal(without, with_grad.detach())
