"""The page ``onmt_doc_server`` serves at ``/``: paste or upload a document, pick a model, read the
translation sentence by sentence with what each sentence read from context.

The page is one HTML document with its style and script inline: it loads nothing from anywhere
(no CDN; the server's Content-Security-Policy forbids it) and holds no data. Its script calls the
JSON API a program calls, ``GET /models`` and ``POST /translate`` with ``"explain": true`` (so
there is no second code path, and every request limit holds), sending the API key a user types
when the server needs one. The reliance colours are the ``-explain`` page's
(``evaluation/explain_page.py``: the same style and the same levels).
"""

from __future__ import annotations

from onmt_doc.evaluation.explain_page import LEGEND, LEVELS, STYLE

_SCRIPT = """
"use strict";
const LEVELS = %(levels)d;
const $ = (id) => document.getElementById(id);
let models = [];

function headers() {
  const h = {"Content-Type": "application/json"};
  const key = $("key").value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

function status(text, error) {
  const s = $("status");
  s.textContent = text;
  s.className = error ? "error" : "note";
}

async function call(path, body) {
  const options = body === undefined ? {headers: headers()}
    : {method: "POST", headers: headers(), body: JSON.stringify(body)};
  const response = await fetch(path, options);
  let data = {};
  try { data = await response.json(); } catch (e) { data = {error: "the server answered " + response.status}; }
  if (!response.ok) {
    if (response.status === 401) $("keyrow").hidden = false;
    throw new Error(data.error || ("HTTP " + response.status));
  }
  return data;
}

async function loadModels() {
  try {
    const data = await call("/models");
    models = data.models;
    const select = $("model");
    select.textContent = "";
    for (const m of models) {
      const option = document.createElement("option");
      option.value = m.name;
      option.textContent = m.name + " (" + m.encoder + " + " + m.decoder + ", unit " + m.unit + ")";
      option.selected = m.name === data.default;
      select.appendChild(option);
    }
    const l = data.limits;
    $("limits").textContent = "Limits: " + l.max_sentences + " sentences, " + l.max_sentence_chars +
      " characters a sentence, " + l.max_request_chars + " characters in all.";
    $("translate").disabled = false;
    status("Ready.", false);
  } catch (e) {
    status(e.message, true);
  }
}

function level(value) {
  if (!(value > 0)) return 0;
  return Math.min(LEVELS - 1, Math.max(1, Math.floor(value * LEVELS)));
}

function tokens(list, measures, colourBy) {
  const span = document.createElement("span");
  list.forEach(([text, space], i) => {
    if (space) span.appendChild(document.createTextNode(" "));
    const t = document.createElement("span");
    const values = Object.entries(measures || {}).filter(([, v]) => i < v.length);
    const shown = Object.fromEntries(values.map(([k, v]) => [k, v[i]]));
    t.className = "tok r" + level(shown[colourBy] || 0);
    t.title = values.map(([k, v]) => k + " " + v[i].toFixed(3)).join("; ");
    t.textContent = text;
    span.appendChild(t);
  });
  return span;
}

function contextCell(sentence, j) {
  const td = document.createElement("td");
  const shares = sentence.context.map((v, k) => ["src " + (k + 1), k, v])
    .concat(sentence.target_context.map((v, k) => ["tgt " + (k + 1), k, v]))
    .filter(([, k, v]) => k !== j && v >= 0.005);
  if (!shares.length) {
    td.innerHTML = '<span class="ctx">no other sentence</span>';
    return td;
  }
  for (const [name, , v] of shares) {
    const line = document.createElement("div");
    line.className = "ctx";
    line.textContent = name + " ";
    const bar = document.createElement("span");
    bar.className = "bar";
    bar.style.width = Math.max(1, Math.round(60 * v)) + "px";
    line.appendChild(bar);
    line.appendChild(document.createTextNode(" " + Math.round(100 * v) + "%%"));
    td.appendChild(line);
  }
  return td;
}

function cell(child, className) {
  const td = document.createElement("td");
  if (className) td.className = className;
  if (typeof child === "string") td.textContent = child; else td.appendChild(child);
  return td;
}

let last = null;

function render() {
  if (!last) return;
  const {sentences, reply} = last;
  const colourBy = $("colour").value || "reliance";
  const table = $("result");
  table.textContent = "";
  const head = document.createElement("tr");
  for (const h of ["#", "source", "translation", "how it read context", "read from"]) {
    const th = document.createElement("th");
    th.textContent = h;
    head.appendChild(th);
  }
  table.appendChild(head);
  const explanation = reply.explanation;
  reply.translation.forEach((text, j) => {
    const tr = document.createElement("tr");
    tr.className = "sentence";
    tr.appendChild(cell(String(j + 1)));
    tr.appendChild(cell(sentences[j], "source"));
    tr.appendChild(cell(text, "translation"));
    const s = explanation ? explanation.sentences[j] : null;
    tr.appendChild(cell(s ? tokens(s.target, s.measures, colourBy) : "", "reading"));
    tr.appendChild(s ? contextCell(s, j) : cell(""));
    table.appendChild(tr);
  });
  $("about").textContent = explanation ? ("Model: " + explanation.model + ". Reliance: " +
    explanation.reliance_from + ". " + explanation.notes.join(" ")) : "";
}

function measures(explanation) {
  const names = new Set(["reliance"]);
  for (const s of (explanation ? explanation.sentences : [])) Object.keys(s.measures).forEach((k) => names.add(k));
  const select = $("colour");
  const keep = select.value;
  select.textContent = "";
  for (const name of names) {
    const option = document.createElement("option");
    option.value = option.textContent = name;
    option.selected = name === keep;
    select.appendChild(option);
  }
}

async function translate() {
  const sentences = $("text").value.split(/\\r?\\n/).map((s) => s.trim()).filter((s) => s);
  if (!sentences.length) { status("Paste or upload a document first: one sentence a line.", true); return; }
  const name = $("model").value;
  const info = models.find((m) => m.name === name) || {};
  $("translate").disabled = true;
  status("Translating " + sentences.length + " sentences…", false);
  try {
    const reply = await call("/translate", {model: name, document: sentences, explain: !info.ensemble});
    last = {sentences, reply};
    measures(reply.explanation);
    render();
    status("Translated " + sentences.length + " sentences with " + reply.model + ".", false);
  } catch (e) {
    status(e.message, true);
  } finally {
    $("translate").disabled = false;
  }
}

$("file").addEventListener("change", async (event) => {
  const file = event.target.files[0];
  if (file) $("text").value = await file.text();
});
$("translate").addEventListener("click", translate);
$("colour").addEventListener("change", render);
$("retry").addEventListener("click", loadModels);
loadModels();
"""

PAGE = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>onmt_doc: translate a document</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>{STYLE}
textarea {{ width: 100%; height: 6em; font-family: inherit; }}
.controls > * {{ margin: 0.3em 0.5em 0.3em 0; }}
.error {{ color: #b00020; }}
</style></head>
<body>
<h1>Translate a document</h1>
<p class="note">One sentence a line; the sentences are translated as one document, each in the context of
the others. Each translated word is coloured by its context reliance (how much of what the model read for it
came from other sentences); hover a word for every number.</p>
<p id="keyrow" hidden>This server needs an API key: <input id="key" type="password" autocomplete="off">
<button id="retry" type="button">use it</button></p>
<textarea id="text" placeholder="Paste a document here, one sentence a line"></textarea>
<div class="controls">
<input id="file" type="file" accept=".txt,text/plain">
<label>model <select id="model"></select></label>
<label>colour by <select id="colour"><option>reliance</option></select></label>
<button id="translate" type="button" disabled>Translate</button>
</div>
<p id="status" class="note">Loading the models…</p>
<p id="limits" class="note"></p>
{LEGEND}
<table id="result" class="doc"></table>
<p id="about" class="note"></p>
<script>{_SCRIPT % {"levels": LEVELS}}</script>
</body></html>
"""
