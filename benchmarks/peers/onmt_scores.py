"""Forced decoding by OpenNMT-py's own code, run by the peers venv's python (``ctranslate2`` stage):
``python onmt_scores.py CKPT SRC TGT N OUT`` writes each sentence's target token log-probabilities
(OpenNMT-py 3.x sequences: bare source, decoder ``<s> t``, scored up to ``</s>``)."""

import json
import sys

import torch
from onmt.inputters.inputter import dict_to_vocabs
from onmt.model_builder import build_base_model
from onmt.utils.parse import ArgumentParser

ckpt_path, src_path, tgt_path, n, out = sys.argv[1:]
ck = torch.load(ckpt_path, map_location="cpu", weights_only=False)  # OpenNMT-py's own file, its own loader
opt = ArgumentParser.ckpt_model_opts(ck["opt"])
ArgumentParser.update_model_opts(opt)
ArgumentParser.validate_model_opts(opt)
opt.update_vocab = False
vocabs = dict_to_vocabs(ck["vocab"])
model = build_base_model(opt, vocabs)
model.load_state_dict(ck, precision=torch.float32, device=torch.device("cpu"), strict=True, offset=0)
model.eval()
sv, tv = vocabs["src"], vocabs["tgt"]
rows = []
with open(src_path, encoding="utf-8") as fs, open(tgt_path, encoding="utf-8") as ft:
    pairs = list(zip(fs, ft))[: int(n)]
with torch.no_grad():
    for s, t in pairs:
        src = torch.tensor([sv.lookup_token(w) for w in s.split()])[None, :, None]
        dec = [tv.lookup_token(w) for w in ["<s>", *t.split(), "</s>"]]
        hidden, _ = model(src, torch.tensor(dec)[None, :, None], torch.tensor([src.size(1)]))
        lp = torch.log_softmax(model.generator(hidden)[0].float(), -1)
        rows.append([lp[j, i].item() for j, i in enumerate(dec[1:])])
with open(out, "w", encoding="utf-8") as f:
    json.dump(rows, f)
