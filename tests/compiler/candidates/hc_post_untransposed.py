"""A wrong hc_post: mixes the streams by comb instead of comb^T (equal only when comb is symmetric)."""
import torch

DESCRIPTION = "hc_post: comb @ residual (wrong: the reference mixes by comb^T)"


def hc_post(out, residual, post, comb):
    mixed = post.float().unsqueeze(-1) * out.float().unsqueeze(1) + comb.float() @ residual.float()
    return mixed.to(residual.dtype)


OVERRIDES = {"hc_post": hc_post}
