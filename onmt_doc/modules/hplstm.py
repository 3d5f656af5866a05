"""Multi-head highly parallelized LSTM (Xu et al., 2021, "Multi-Head Highly Parallelized LSTM
Decoder for Neural Machine Translation", sec. 3, eqs. 9–21).

Everything with a weight matrix (input projection, gates, hidden state, output gate, output
projection) depends only on the current input and the bag-of-words prefix sum of the previous
inputs, so it is computed for the whole sequence at once. What remains sequential is the
element-wise cell recurrence ``c_t = c_{t−1} ⊙ f_t + h_r,t`` (eq. 16), a linear recurrence run by
:func:`linear_scan` (one custom operator with a hand-written backward: a TorchScript loop on the CPU,
the fastest exact candidate there, docs/benchmarks.md "MHPLSTM: the cell scan"; recursive doubling on
the GPU's kernel path).

The heads are independent HPLSTMs (eq. 20); their weights are stored per head and applied as one
batched matrix product over heads (:class:`GroupedLinear`), never as a Python loop. Tensors inside
the module are head-major, ``[H, T, B, d]``: the grouped products see ``[H, T·B, d]`` without a
copy, and the scan walks time slices ``[H, B, d]`` in place.

Incremental decoding carries only ``(running input sum, cell)`` per layer, ``[B, D]`` each,
whatever the prefix length.

Layer norms take their statistics per head (``norm_group="per_head"``, the paper's independent
HPLSTMs) or over all heads of a position (``"all_heads"``, the authors' released code); see
:class:`GroupedLayerNorm` and docs/models/mhplstm.md.
"""

from __future__ import annotations

import warnings
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from onmt_doc import devices
from onmt_doc.modules.dropout import Dropout

# (running sum of the inputs i over the prefix, cell c of the last position), both [B, D]
HPLSTMState = tuple[torch.Tensor, torch.Tensor]


class GroupedLinear(nn.Module):
    """``heads`` independent linear maps ``in → out`` as one batched matmul over ``[H, N, in]``.

    The weight is stored 2-D (``[H·in, out]``, viewed as ``[H, in, out]``) and the bias 1-D, so
    the builder's Xavier re-initialisation treats the weight like a dense map of the concatenated
    heads and leaves the bias alone.
    """

    def __init__(self, heads: int, d_in: int, d_out: int) -> None:
        """Xavier-initialised weight, zero bias."""
        super().__init__()
        self.heads, self.d_in, self.d_out = heads, d_in, d_out
        self.weight = nn.Parameter(torch.empty(heads * d_in, d_out))
        self.bias = nn.Parameter(torch.zeros(heads * d_out))
        nn.init.xavier_uniform_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[H, N, in] -> [H, N, out]."""
        w = self.weight.view(self.heads, self.d_in, self.d_out)
        return torch.baddbmm(self.bias.view(self.heads, 1, self.d_out), x, w)


class GroupedLayerNorm(nn.Module):
    """Layer norm (eq. 6) of ``[H, ..., dim]`` (``[H, ..., parts, dim]`` for several parts) with
    its own gain and bias per head and part; 1-D parameters, so the builder's Xavier
    re-initialisation leaves them at ones and zeros.

    ``over_heads=False``: mean and deviation over the ``dim`` features of each head and part (the
    paper's independent per-head HPLSTMs). ``True``: over all heads and parts of a position
    together, as ``nn.LayerNorm((heads, [parts,] dim))`` in the authors' released code."""

    def __init__(self, heads: int, dim: int, parts: int = 1, eps: float = 1e-5, over_heads: bool = False) -> None:
        """``parts``: number of ``dim``-sized groups normalised side by side (2 for the gates of eqs. 11, 12)."""
        super().__init__()
        self.heads, self.dim, self.eps, self.over_heads = heads, dim, eps, over_heads
        self.tail = (parts, dim) if parts > 1 else (dim,)
        self.weight = nn.Parameter(torch.ones(heads * parts * dim))
        self.bias = nn.Parameter(torch.zeros(heads * parts * dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` [H, ..., [parts,] dim] normalised, then scaled and shifted per head and part."""
        shape = (self.heads,) + (1,) * (x.dim() - 1 - len(self.tail)) + self.tail
        if self.over_heads:  # statistics over dim 0 (heads) and the tail (parts, features)
            dims = (0,) + tuple(range(x.dim() - len(self.tail), x.dim()))
            var, mean = torch.var_mean(x, dim=dims, correction=0, keepdim=True)
            y = (x - mean) * torch.rsqrt(var + self.eps)
        else:
            y = F.layer_norm(x, (self.dim,), eps=self.eps)
        return torch.addcmul(self.bias.view(shape), y, self.weight.view(shape))


# ----------------------------------------------------------------------------- the cell scan
# Eq. 16 is a linear recurrence; two kernels compute it, chosen by the device's kernel path
# (``onmt_doc.devices.fused``), each a (forward, backward) pair:
#
# - packed (CPU): a loop over time slices, compiled with TorchScript: one multiply-add per step and
#   the least memory traffic, measured fastest on a CPU (docs/benchmarks.md, "MHPLSTM: the cell scan");
# - fused (GPU): recursive doubling (Hillis and Steele, 1986): ⌈log₂ T⌉ rounds, each a few kernels
#   over the whole tensor, where the loop launches two kernels per time step (~900 a training step at
#   Transformer-base shape; a GPU step is bound by launches).
#
# Both run inside one custom operator (``onmt_doc::hplstm_scan``) with a hand-written backward, so
# autograd records one node instead of T, and ``torch.compile`` traces the decoder around it in one
# graph: it sees an operator of known output shape instead of a TorchScript function or a loop whose
# length is a batch's, which it would cut the graph at or unroll per length.


def scan_forward_loop(f: torch.Tensor, hr: torch.Tensor, c0: torch.Tensor) -> torch.Tensor:
    """c_t = c_{t-1} ⊙ f_t + hr_t along dim 1 (eq. 16), from c0; no autograd inside."""
    c = torch.empty_like(hr)
    prev = c0
    for t in range(f.size(1)):
        prev = torch.addcmul(hr[:, t], f[:, t], prev)
        c[:, t] = prev
    return c


def scan_backward_loop(f: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """dL/dc_t in total: grad_t + f_{t+1} ⊙ dL/dc_{t+1}, the same recurrence run backwards."""
    total = torch.empty_like(grad)
    last = f.size(1) - 1
    acc = grad[:, last]
    total[:, last] = acc
    for t in range(last - 1, -1, -1):
        acc = torch.addcmul(grad[:, t], f[:, t + 1], acc)
        total[:, t] = acc
    return total


def doubling_scan(a: torch.Tensor, b: torch.Tensor, reverse: bool = False) -> torch.Tensor:
    """x_t = a_t ⊙ x_{t−1} + b_t along dim 1 from x_{−1} = 0 (``reverse``: x_t = a_t ⊙ x_{t+1} + b_t
    from the end) by recursive doubling: after the round of offset k, (a_t, b_t) compose the steps
    t−2k+1 … t, so ⌈log₂ T⌉ rounds leave x in b. Products of gates only, no division or logarithm:
    gates near 0 underflow to an exact 0 (the prefix forgotten), never to a NaN."""
    t, k = a.size(1), 1
    while k < t:
        # the steps that compose with the step k before them (k after them, reversed), and those
        into, source = (slice(0, t - k), slice(k, t)) if reverse else (slice(k, t), slice(0, t - k))
        b_next = b.clone()
        torch.addcmul(b[:, into], a[:, into], b[:, source], out=b_next[:, into])
        if 2 * k < t:  # the last round's products are never read
            a_next = a.clone()
            torch.mul(a[:, into], a[:, source], out=a_next[:, into])
            a = a_next
        b, k = b_next, 2 * k
    return b


def scan_forward_doubling(f: torch.Tensor, hr: torch.Tensor, c0: torch.Tensor) -> torch.Tensor:
    """:func:`scan_forward_loop`'s cells by :func:`doubling_scan`, c0 folded into the first input."""
    first = torch.addcmul(hr[:, :1], f[:, :1], c0.unsqueeze(1))
    return doubling_scan(f, torch.cat([first, hr[:, 1:]], dim=1))


def scan_backward_doubling(f: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """:func:`scan_backward_loop`'s totals by :func:`doubling_scan` run from the end (step t's
    factor is f_{t+1}; nothing follows the last step)."""
    following = torch.cat([f[:, 1:], torch.zeros_like(f[:, :1])], dim=1)
    return doubling_scan(following, grad, reverse=True)


def _torchscript(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``fn`` compiled with TorchScript: measured fastest on a CPU (docs/benchmarks.md), deprecated in
    torch 2.13 (its DeprecationWarning is silenced here; the plain loops are the documented fallback)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return torch.jit.script(fn)


ScanKernels = tuple[Callable[..., torch.Tensor], Callable[..., torch.Tensor]]  # (forward, backward)
SCAN_KERNELS: dict[str, ScanKernels] = {
    "packed": (_torchscript(scan_forward_loop), _torchscript(scan_backward_loop)),
    "fused": (scan_forward_doubling, scan_backward_doubling),
}


def scan_kernels(device: torch.device) -> ScanKernels:
    """The (forward, backward) kernels of eq. 16 on ``device``'s kernel path."""
    return SCAN_KERNELS["fused" if devices.fused(device) else "packed"]


def scan_cells(f: torch.Tensor, hr: torch.Tensor, c0: torch.Tensor) -> torch.Tensor:
    """Cells c [G, T, ...] of eq. 16 by the kernel path's forward kernel: the body of :data:`scan_op`."""
    return scan_kernels(f.device)[0](f.contiguous(), hr.contiguous(), c0.contiguous())


def scan_totals(f: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """dL/dc_t in total by the kernel path's backward kernel: the body of :data:`scan_backward_op`."""
    return scan_kernels(f.device)[1](f.contiguous(), grad.contiguous())


scan_op = torch.library.custom_op("onmt_doc::hplstm_scan", scan_cells, mutates_args=())
scan_backward_op = torch.library.custom_op("onmt_doc::hplstm_scan_backward", scan_totals, mutates_args=())


# what torch.compile traces in place of the bodies: both return contiguous tensors of the input's
# shape (the kernels work on contiguous copies; a compiled graph asserts the strides it was told)
@scan_op.register_fake
def _scan_shape(f: torch.Tensor, hr: torch.Tensor, c0: torch.Tensor) -> torch.Tensor:
    return hr.new_empty(hr.shape)


@scan_backward_op.register_fake
def _scan_backward_shape(f: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    return grad.new_empty(grad.shape)


def cell_gradients(
    f: torch.Tensor, c: torch.Tensor, c0: torch.Tensor, total: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of (f, hr, c0) from the cells and dL/dc in total: ``total_t ⊙ c_{t−1}``,
    ``total_t`` and ``total_1 ⊙ f_1``."""
    previous = torch.cat([c0.unsqueeze(1), c[:, :-1]], dim=1)  # c_{t-1}
    return total * previous, total, total[:, 0] * f[:, 0]


def _save_for_backward(ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: torch.Tensor) -> None:
    f, _, c0 = inputs
    ctx.save_for_backward(f, output, c0)


def _scan_backward(
    ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    f, c, c0 = ctx.saved_tensors
    return cell_gradients(f, c, c0, scan_backward_op(f, grad))


scan_op.register_autograd(_scan_backward, setup_context=_save_for_backward)


def linear_scan(f: torch.Tensor, hr: torch.Tensor, c0: Optional[torch.Tensor] = None) -> torch.Tensor:
    """All cells of eq. 16 for ``f``, ``hr`` ``[G, T, ...]`` (time on dim 1); ``c0`` ``[G, ...]``
    is the cell before the first step (zeros if None). No division or logarithm of the gates, so
    f → 0 cannot underflow into NaNs or infinities; on the packed path the same multiply-adds as a
    step-by-step loop, on the fused path the same products in another order (float rounding)."""
    if c0 is None:
        c0 = torch.zeros_like(hr[:, 0])
    if f.size(1) == 1:  # a decoding step: no scan machinery
        return torch.addcmul(hr, f, c0.unsqueeze(1))
    return scan_op(f, hr, c0)


# ----------------------------------------------------------------------------- the module


class MultiHeadHPLSTM(nn.Module):
    """MHPLSTM sublayer ``[B, T, D] -> [B, T, D]``, causal, replacing decoder self-attention."""

    def __init__(
        self,
        d_model: int,
        heads: int,
        dropout: float,
        hidden_layers: int = 2,
        hidden_ratio: int = 4,
        norm_group: str = "per_head",
    ) -> None:
        """``hidden_layers``: 2 for eq. 14 (inner width ``hidden_ratio``·d_head) or 1 for eq. 13;
        ``norm_group``: ``per_head`` or ``all_heads`` (module docstring). Raises ValueError otherwise."""
        super().__init__()
        if d_model % heads:
            raise ValueError(f"d_model {d_model} is not divisible by {heads} heads")
        if hidden_layers not in (1, 2):
            raise ValueError(f"hidden_layers must be 1 or 2, got {hidden_layers}")
        if norm_group not in ("per_head", "all_heads"):
            raise ValueError(f"norm_group must be per_head or all_heads, got {norm_group}")
        self.heads, self.d_head = heads, d_model // heads
        d = self.d_head
        self.d_hidden = hidden_ratio * d if hidden_layers == 2 else d
        over = norm_group == "all_heads"  # the released code's grouping (docs/models/mhplstm.md)
        self.split = nn.Linear(d_model, d_model)  # eq. 19: W_s
        self.sum_norm = GroupedLayerNorm(heads, d, over_heads=over)  # eq. 10: LN(s)
        # eqs. 11, 12, 13/14 read the same v: one product for both gates and the hidden layer
        self.gates_hidden = GroupedLinear(heads, 2 * d, 2 * d + self.d_hidden)
        # all_heads with eq. 13: the released code normalises both gates and h in one group
        joint = over and hidden_layers == 1
        self.gate_norm = GroupedLayerNorm(heads, d, parts=3 if joint else 2, over_heads=over)  # LN of eqs. 11, 12
        self.hidden_norm = None if joint else GroupedLayerNorm(heads, self.d_hidden, over_heads=over)  # eq. 13/14
        self.hidden_out = GroupedLinear(heads, self.d_hidden, d) if hidden_layers == 2 else None
        self.hidden_dropout = Dropout(dropout)
        self.out_gate = GroupedLinear(heads, 2 * d, d)  # eq. 17: W_o
        self.out_gate_norm = GroupedLayerNorm(heads, d, over_heads=over)
        self.merge = nn.Linear(d_model, d_model)  # eq. 21: W_m

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """[B, T, D] -> [H, T, B, d]."""
        b, t, _ = x.shape
        return x.view(b, t, self.heads, self.d_head).permute(2, 1, 0, 3)

    def _batch_first(self, x: torch.Tensor) -> torch.Tensor:
        """[H, T, B, d] -> [B, T, D]."""
        h, t, b, d = x.shape
        return x.permute(2, 1, 0, 3).reshape(b, t, h * d)

    def _state_heads(self, x: torch.Tensor) -> torch.Tensor:
        """[B, D] state -> [H, 1, B, d]."""
        return self._heads(x.unsqueeze(1))

    def _gates_and_hidden(self, fused: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Input gate, forget gate (eqs. 11, 12) and h (eq. 13/14) from the fused product."""
        d = self.d_head
        if self.hidden_norm is None:  # eq. 13 with all_heads: one LN over gates and h
            normed = self.gate_norm(fused.unflatten(-1, (3, d)))
            in_gate, forget_gate = torch.sigmoid(normed[..., :2, :]).unbind(-2)
            return in_gate, forget_gate, torch.relu(normed[..., 2, :])
        gates = torch.sigmoid(self.gate_norm(fused[..., : 2 * d].unflatten(-1, (2, d))))  # eqs. 11, 12
        in_gate, forget_gate = gates.unbind(-2)  # [H, T·B, d] each
        return in_gate, forget_gate, self._hidden(self.hidden_norm(fused[..., 2 * d :]))

    def _hidden(self, normed: torch.Tensor) -> torch.Tensor:
        """h from the normalised hidden part of the fused product: eq. 14 (2 layers) or eq. 13."""
        a = torch.relu(normed)  # α(LN(W_h1 v + b_h1)), α = ReLU
        if self.hidden_out is None:
            return a  # eq. 13
        return self.hidden_out(self.hidden_dropout(a))  # eq. 14: W_h2 α(·) + b_h2

    def forward(self, x: torch.Tensor, state: Optional[HPLSTMState] = None) -> tuple[torch.Tensor, HPLSTMState]:
        """Outputs for ``x`` [B, T, D] following the prefix summarised by ``state`` (None: no
        prefix), and the state after position T (what decoding carries; target padding sits at
        the end of a row, so it never reaches a real position)."""
        h, d = self.heads, self.d_head
        i = self._heads(self.split(x)).contiguous()  # eq. 19: [H, T, B, d]
        _, t, b, _ = i.shape
        # eq. 9: exclusive prefix sum s_t = Σ_{k<t} i_k (s_1 = 0), continued from the state
        start = torch.zeros_like(i[:, :1]) if state is None else self._state_heads(state[0])
        c0 = None if state is None else self._state_heads(state[1])[:, 0]
        if t == 1:  # a decoding step
            s, total = start, i + start
        else:
            total = torch.cumsum(i, dim=1) if state is None else torch.cumsum(i, dim=1) + start
            s = torch.cat([start, total[:, :-1]], dim=1)
        v = torch.cat([i, self.sum_norm(s)], dim=-1)  # eq. 10: v = i | LN(s)
        fused = self.gates_hidden(v.view(h, t * b, 2 * d))  # [H, T·B, 2d + hidden]
        in_gate, forget_gate, hidden = self._gates_and_hidden(fused)
        hr = hidden * in_gate  # eq. 15: h_r = h ⊙ i_g
        c = linear_scan(forget_gate.view(h, t, b, d), hr.view(h, t, b, d), c0)  # eq. 16
        ic = torch.cat([i, c], dim=-1).view(h, t * b, 2 * d)
        out_gate = torch.sigmoid(self.out_gate_norm(self.out_gate(ic)))  # eq. 17
        o = c * out_gate.view(h, t, b, d)  # eq. 18: o = c ⊙ o_g
        new_state = (self._batch_first(total[:, -1:])[:, 0], self._batch_first(c[:, -1:])[:, 0])
        return self.merge(self._batch_first(o)), new_state  # eq. 21: heads concatenated, W_m
