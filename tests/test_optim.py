"""Optimizers built from the config."""
import torch

from onmt_doc.config import config_from_dict
from onmt_doc.optim.optimizers import build_optimizer


def test_adam_is_fused_where_torch_has_it_and_matches_the_loop():
    """The default optimizer uses torch's fused kernel when available (torch ≥ 2.4 on CPU) and
    makes the same updates as the per-parameter loop; ``params.fused: false`` opts out."""
    def run(optim: dict):
        torch.manual_seed(0)
        w = torch.nn.Parameter(torch.randn(20, 5))
        opt = build_optimizer(config_from_dict({"optim": optim}).optim, [{"params": [w]}])
        for i in range(5):
            opt.zero_grad()
            (w.sin() * (i + 1)).sum().backward()
            opt.step()
        return opt, w.detach()

    fused, w_fused = run({"type": "adam", "lr": 0.01})
    loop, w_loop = run({"type": "adam", "lr": 0.01, "params": {"fused": False}})
    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    if (major, minor) >= (2, 4):
        assert fused.defaults["fused"] is True
    assert not loop.defaults["fused"]
    assert torch.allclose(w_fused, w_loop, atol=1e-6)
