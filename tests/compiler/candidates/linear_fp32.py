"""linear through an fp32 matmul for small M: on CPU a bf16 GEMV is several times slower than fp32."""
import torch


def linear(x, weight, bias):
    if x.dtype == torch.float32 or x.numel() // max(x.shape[-1], 1) > 16:
        return torch.nn.functional.linear(x, weight, bias)
    y = torch.matmul(x.float(), weight.float().t())
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


OVERRIDES = {"linear": linear}
DESCRIPTION = "linear in fp32 for small M"
