"""Starting a run from another run's weights (``train.init_from``).

Checkpoint surgery kept out of the trainer: copy every parameter the checkpoint shares with the
new model (same name, same shape, same vocabularies) and give the copied ones their own learning
rate group (``train.init_lr_scale``), so fine-tuning can move pretrained weights more gently.
"""

from __future__ import annotations

import logging

from onmt_doc.config.model import ModelConfig
from onmt_doc.config.train import TrainConfig
from onmt_doc.data.codec import Codec
from onmt_doc.errors import UserError
from onmt_doc.models.builder import layer_options
from onmt_doc.models.checkpoint import load_checkpoint
from onmt_doc.models.model import EncoderDecoder
from onmt_doc.optim.optimizers import param_groups

log = logging.getLogger("onmt_doc")


def init_from(model: EncoderDecoder, path: str, codec: Codec) -> set[str]:
    """Copy every parameter the checkpoint shares with ``model``; return the copied names."""
    try:
        ckpt = load_checkpoint(path)  # verified: damaged weights never reach a new run
    except UserError as e:
        raise UserError(f"train.init_from: {e}") from None
    if ckpt["codec"]["src_vocab"] != codec.src_vocab.itos or ckpt["codec"]["tgt_vocab"] != codec.tgt_vocab.itos:
        raise UserError(
            f"train.init_from: {path} was trained with other vocabularies than this run's; "
            f"use the same run folder vocabularies (copy its vocab files into log.dir)"
        )
    check_layer_options(model, ckpt["config"].get("model", {}), path)
    own = model.state_dict()
    copied = set()
    for name, tensor in ckpt["model"].items():
        if name in own:
            if own[name].shape != tensor.shape:
                raise UserError(
                    f"train.init_from: parameter {name} has shape {tuple(tensor.shape)} in "
                    f"{path} but {tuple(own[name].shape)} in this model"
                )
            own[name].copy_(tensor)
            copied.add(name)
    log.info("init_from %s: copied %d of %d tensors", path, len(copied), len(own))
    return {n for n, _ in model.named_parameters() if n in copied}


def check_layer_options(model: EncoderDecoder, saved: dict, path: str) -> None:
    """The checkpoint's model-wide block options (activation, layer-norm eps, position layout,
    embedding scale) must be this model's: weights trained with swish and Marian's positions
    (onmt_doc_import_marian) compute something else in ReLU blocks, with no error otherwise."""
    defaults = ModelConfig()
    for key, value in layer_options(model).items():
        theirs = saved.get(key, getattr(defaults, key))  # checkpoints older than the key: its default
        if theirs != value:
            raise UserError(
                f"train.init_from: {path} has model.{key}: {theirs} but this run {value}; "
                f"set model.{key}: {theirs} (the weights only fit the blocks they were trained in)"
            )


def initial_param_groups(model: EncoderDecoder, cfg: TrainConfig, codec: Codec) -> list[dict]:
    """The optimizer's parameter groups of a new run, after copying ``cfg.init_from``'s weights
    into ``model`` (when set): copied parameters learn at ``cfg.init_lr_scale`` × lr."""
    scaled = init_from(model, cfg.init_from, codec) if cfg.init_from else set()
    return param_groups(model.named_parameters(), scaled, cfg.init_lr_scale)
