"""Optimizers built from the config: OUR builder's choices (fused kernel, overrides, argument
checks, parameter groups), not torch's arithmetic."""

from __future__ import annotations

import pytest
import torch

from onmt_doc.config import config_from_dict
from onmt_doc.errors import ConfigError
from onmt_doc.optim.optimizers import build_optimizer, param_groups


def build(optim: dict, groups=None):
    if groups is None:
        groups = [{"params": [torch.nn.Parameter(torch.randn(4, 3))]}]
    return build_optimizer(config_from_dict({"optim": optim}).optim, groups)


def torch_has_fused(cls) -> bool:
    """Whether this torch accepts fused=True for CPU float32 parameters (asked of torch itself)."""
    try:
        cls([torch.nn.Parameter(torch.zeros(2))], lr=0.1, fused=True)
        return True
    except (RuntimeError, TypeError, ValueError):
        return False


@pytest.mark.parametrize(
    "name,cls", [("adam", torch.optim.Adam), ("adamw", torch.optim.AdamW), ("sgd", torch.optim.SGD)]
)
def test_fused_kernel_is_chosen_where_torch_has_it(name, cls):
    opt = build({"type": name, "lr": 0.01})
    assert type(opt) is cls
    assert bool(opt.defaults.get("fused")) == torch_has_fused(cls)


def test_fused_and_foreach_overrides_are_honoured():
    opt = build({"type": "adam", "params": {"fused": False}})
    assert not opt.defaults["fused"]
    opt = build({"type": "adam", "params": {"foreach": True}})
    assert opt.defaults["foreach"] is True and not opt.defaults["fused"]  # foreach alone: no fused
    opt = build({"type": "adam", "params": {"foreach": False}})
    assert opt.defaults["foreach"] is False and not opt.defaults["fused"]


def test_config_values_reach_the_optimizer():
    opt = build(
        {
            "type": "adam",
            "lr": 0.003,
            "betas": [0.8, 0.9],
            "eps": 1e-6,
            "weight_decay": 0.01,
            "params": {"amsgrad": True},
        }
    )
    d = opt.defaults
    assert (d["lr"], d["betas"], d["eps"], d["weight_decay"], d["amsgrad"]) == (0.003, (0.8, 0.9), 1e-6, 0.01, True)
    sgd = build({"type": "sgd", "lr": 0.1, "params": {"momentum": 0.9, "nesterov": True}})
    assert sgd.defaults["momentum"] == 0.9 and sgd.defaults["nesterov"] is True
    assert "betas" not in sgd.defaults  # only arguments the constructor has are passed


def test_torch_optimizer_names_are_built():
    import torch_optimizer

    opt = build({"type": "radam", "lr": 0.002, "betas": [0.9, 0.99]})
    assert isinstance(opt, torch_optimizer.get("radam")) and opt.defaults["betas"] == (0.9, 0.99)


def test_unknown_params_key_names_it_and_the_closest_argument():
    with pytest.raises(ConfigError, match=r"optim\.params\.momentun: not an argument of sgd.*'momentum'"):
        build({"type": "sgd", "params": {"momentun": 0.9}})
    with pytest.raises(ConfigError, match=r"optim\.params\.params"):
        build({"type": "adam", "params": {"params": []}})
    with pytest.raises(ConfigError, match="unknown optimizer type 'adamm'"):
        build({"type": "adamm"})


def test_param_groups_split_copied_parameters_at_their_scale():
    a, b, c = (torch.nn.Parameter(torch.zeros(2)) for _ in range(3))
    frozen = torch.nn.Parameter(torch.zeros(2), requires_grad=False)
    named = [("enc.a", a), ("enc.b", b), ("dec.c", c), ("frozen", frozen)]
    groups = param_groups(named, scaled={"enc.a", "dec.c"}, scale=0.2)
    by_name = {g["name"]: g for g in groups}
    assert set(by_name) == {"new", "initialised"}
    assert [id(p) for p in by_name["initialised"]["params"]] == [id(a), id(c)]
    assert [id(p) for p in by_name["new"]["params"]] == [id(b)]  # frozen parameters left out
    assert (by_name["initialised"]["lr_scale"], by_name["new"]["lr_scale"]) == (0.2, 1.0)
    plain = param_groups(named, scaled=set(), scale=0.2)
    assert [(g["name"], g["lr_scale"], len(g["params"])) for g in plain] == [("default", 1.0, 3)]


def test_builder_keeps_group_names_and_scales_and_drops_empty_groups():
    a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(3))
    opt = build(
        {"type": "adam"},
        [{"name": "new", "params": [], "lr_scale": 1.0}, {"name": "initialised", "params": [a, b], "lr_scale": 0.2}],
    )
    assert len(opt.param_groups) == 1
    g = opt.param_groups[0]
    assert g["name"] == "initialised" and g["lr_scale"] == 0.2 and [id(p) for p in g["params"]] == [id(a), id(b)]
