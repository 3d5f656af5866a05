"""EncoderDecoder: an encoder, a decoder and the output projection (generator)."""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

import torch
from torch import nn

from onmt_doc import devices
from onmt_doc.contracts import Batch, DecoderState, EncoderOut, LengthLimit, ModelOut
from onmt_doc.data.vocab import PAD_ID, UNK_ID
from onmt_doc.decoders.base import Decoder
from onmt_doc.encoders.base import Encoder
from onmt_doc.errors import ConfigError
from onmt_doc.modules.word_dropout import word_dropout


def resolve_unit(encoder: Encoder, decoder: Decoder) -> str:
    """The translation unit: a document-level part decides; two different ones conflict."""
    units = {encoder.unit, decoder.unit} - {"sentence"}
    if len(units) > 1:
        raise ConfigError(
            f"model: encoder {type(encoder).__name__} works on {encoder.unit} units but "
            f"decoder {type(decoder).__name__} on {decoder.unit} units"
        )
    return units.pop() if units else "sentence"


class EncoderDecoder(nn.Module):
    """The one model class: any registered encoder and decoder, so training and search need no per-model code."""

    def __init__(
        self,
        encoder: Encoder,
        decoder: Decoder,
        generator: nn.Linear,
        word_dropout: float = 0.0,
        word_dropout_id: int = UNK_ID,
    ):
        super().__init__()
        self.encoder, self.decoder, self.generator = encoder, decoder, generator
        self.unit = resolve_unit(encoder, decoder)
        self.word_dropout, self.word_dropout_id = word_dropout, word_dropout_id

    def forward(self, batch: Batch) -> ModelOut:
        """Teacher-forced pass; logits only where the target is not padding (saves the V-sized
        projection on padding, the largest matrix product of a small model)."""
        if self.training and self.word_dropout > 0:  # inputs only; the targets stay intact
            p, token = self.word_dropout, self.word_dropout_id
            batch = replace(batch, src=word_dropout(batch.src, p, token), tgt_in=word_dropout(batch.tgt_in, p, token))
        enc_out = self.encoder(batch)
        dec_out = self.decoder(batch.tgt_in, enc_out, batch)
        mask = batch.tgt_out.ne(PAD_ID)
        if batch.tgt_index is None:  # a batch made without collate: select on the device
            return ModelOut(
                self.generator(dec_out.hidden[mask]), batch.tgt_out[mask], mask, dec_out.hidden, enc_out, dec_out.aux
            )
        if batch.tgt_target is not None:  # a static shape: every row of tgt_index, the losses weigh out <pad>
            logits = self.generator(dec_out.hidden.flatten(0, 1).index_select(0, batch.tgt_index))
            return ModelOut(logits, batch.tgt_target, mask, dec_out.hidden, enc_out, dec_out.aux, padded_targets=True)
        # positions chosen on the host (collate): no device sync. On a GPU the output layer also
        # computes the rows that round the count up (Batch.tgt_index) and drops them after
        n = batch.n_tgt_tokens
        index = batch.tgt_index if dec_out.hidden.is_cuda else batch.tgt_index[:n]
        logits = self.generator(dec_out.hidden.flatten(0, 1).index_select(0, index))[:n]
        target = batch.tgt_out.reshape(-1).index_select(0, batch.tgt_index[:n])
        return ModelOut(logits, target, mask, dec_out.hidden, enc_out, dec_out.aux)

    def prepare(self, batch: Batch, device: torch.device) -> Batch:
        """``batch``, still on the host, with its parts' plans for ``device``'s fused path in
        :attr:`Batch.plans`: the trainer calls it where batches are made (the prefetch thread on a
        GPU), so a step neither plans on the host between its kernels nor leaves its compiled graph
        to plan. On the packed path (and for a batch already on a device) the batch as it is: the
        parts plan in their forward."""
        if not devices.fused(device) or batch.src.device.type != "cpu":
            return batch
        plans = {**self.encoder.host_plans(batch), **self.decoder.host_plans(batch)}
        return replace(batch, plans=plans) if plans else batch

    def encode(self, batch: Batch) -> EncoderOut:
        """Encode once per batch; search then calls :meth:`step` many times on the result."""
        return self.encoder(batch)

    def init_state(self, enc_out: EncoderOut, batch: Batch, limit: Optional[LengthLimit] = None) -> DecoderState:
        """The decoder's state before the first :meth:`step`; ``limit`` is the search's output length limit."""
        return self.decoder.init_state(enc_out, batch, limit)

    def step(self, tokens: torch.Tensor, state: DecoderState) -> tuple[torch.Tensor, DecoderState]:
        """Log-probabilities [B, V] of the next token after ``tokens`` [B]."""
        hidden, state = self.decoder.step(tokens, state)
        return torch.log_softmax(self.generator(hidden).float(), dim=-1), state

    def n_params(self) -> int:
        """Parameter count, for logs and the model-scaling ratio (``onmt_doc_scale_model``)."""
        return sum(p.numel() for p in self.parameters())


def full_log_probs(model: EncoderDecoder, batch: Batch, enc_out: Optional[EncoderOut] = None) -> torch.Tensor:
    """[B, T, V] teacher-forced log-probabilities (forced decoding, tests)."""
    if not isinstance(model, EncoderDecoder):  # an ensemble (translate/ensemble.py) averages its members'
        return model.full_log_probs(batch, enc_out)
    enc_out = enc_out if enc_out is not None else model.encode(batch)
    hidden = model.decoder(batch.tgt_in, enc_out, batch).hidden
    return torch.log_softmax(model.generator(hidden).float(), dim=-1)
