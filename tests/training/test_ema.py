import torch

from detector.model import build_model
from detector.training.ema import ModelEMA


def test_ema_update_is_the_documented_lerp_of_every_float_tensor():
    torch.manual_seed(0)
    model = build_model(num_classes=2)
    ema = ModelEMA(model, decay=0.9, tau=1.0)
    before = {k: v.clone() for k, v in ema.module.state_dict().items()}
    with torch.no_grad():
        for value in model.state_dict().values():
            if value.dtype.is_floating_point:
                value.add_(torch.randn_like(value))
            else:
                value.add_(5)  # BatchNorm's batch counter: an integer, not averaged
    ema.update(model)
    decay = 0.9 * (1 - torch.exp(torch.tensor(-1.0, dtype=torch.float64)).item())
    after, source = ema.module.state_dict(), model.state_dict()
    for name, value in after.items():
        if value.dtype.is_floating_point:
            # The reference is the per-tensor lerp the fused update replaces: identical arithmetic (one
            # FP32 lerp per element), so any difference is a different operation, not rounding.
            expected = before[name].lerp(source[name], 1 - decay)
            torch.testing.assert_close(value, expected, rtol=0, atol=0)
        else:
            assert torch.equal(value, before[name])
    assert ema.updates == 1


def test_ema_follows_weights_loaded_into_its_module():
    model = build_model(num_classes=2)
    ema = ModelEMA(model, decay=0.5, tau=1e-9)  # decay ~0.5 from the first update
    state = {k: torch.zeros_like(v) for k, v in ema.module.state_dict().items()}
    ema.module.load_state_dict(state)  # what a resume does: the fused update must see these tensors
    ema.update(model)
    name, value = next((k, v) for k, v in ema.module.state_dict().items() if v.dtype.is_floating_point)
    torch.testing.assert_close(value, model.state_dict()[name] * 0.5)
