"""Strict nested configuration: one dataclass per YAML section, one module per group of sections.

The package is layered so that nothing imports in a circle:

- ``options.py`` (the bottom): ``option()`` and its ``Bounds``, ``PartConfig`` / ``LossConfig`` and the
  ``validate(path, root)`` contract, ``part()``, the checks parts share, the validation walk;
  what a part's author imports;
- the sections, each importing only ``options``: ``data.py`` (``data:``, ``vocab:``), ``model.py``
  (``model:`` and the parameter-size estimate), ``train.py`` (``optim:``, ``train:``, ``log:``),
  ``translate.py`` (``translate:``);
- ``loading.py`` (the top): the root ``Config``, the strict YAML loader, dotted overrides,
  ``load_config`` / ``config_from_dict`` / ``config_to_dict`` / ``save_config``.

Besides ``onmt_doc.errors``, ``onmt_doc.outputs`` and ``onmt_doc.registry`` the package imports nothing
of onmt_doc: the parts' config classes and the data units are reached through ``registry_for(kind)``
when a config is read, because the parts import ``options`` themselves.

This module re-exports the names the rest of the code uses, so ``from onmt_doc.config import X`` keeps
working; the section modules hold the rest (``from onmt_doc.config.data import DataConfig``).
"""

from onmt_doc.config.data import CorpusConfig
from onmt_doc.config.loading import Config, apply_overrides, config_from_dict, config_to_dict, load_config, save_config
from onmt_doc.config.model import ModelConfig
from onmt_doc.config.options import (
    FORMAT_VERSION,
    LossConfig,
    PartConfig,
    check_heads,
    check_top_layers,
    option,
)
from onmt_doc.config.train import OptimConfig, TrainConfig
from onmt_doc.config.translate import TranslateConfig
from onmt_doc.errors import ConfigError

__all__ = [
    "FORMAT_VERSION",
    "Config",
    "ConfigError",
    "CorpusConfig",
    "LossConfig",
    "ModelConfig",
    "OptimConfig",
    "PartConfig",
    "TrainConfig",
    "TranslateConfig",
    "apply_overrides",
    "check_heads",
    "check_top_layers",
    "config_from_dict",
    "config_to_dict",
    "load_config",
    "option",
    "save_config",
]
