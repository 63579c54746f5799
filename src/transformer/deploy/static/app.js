// The page: translate sentences with POST /translate, then show the attention of the chosen
// sentence (POST /attention) as one heatmap per head of the chosen layer and kind.
// Plain JavaScript, no libraries: everything it needs comes from this server.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { info: null, lines: [], report: null, selected: -1, request: 0 };

// Viridis at five points; weights between them are interpolated.
const VIRIDIS = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];

function colour(t) {
  const x = Math.min(Math.max(t, 0), 1) * (VIRIDIS.length - 1);
  const i = Math.min(Math.floor(x), VIRIDIS.length - 2), f = x - i;
  const [a, b] = [VIRIDIS[i], VIRIDIS[i + 1]];
  return `rgb(${a.map((v, k) => Math.round(v + f * (b[k] - v))).join(",")})`;
}

async function post(path, body) {
  // -> the JSON answer; throws an Error carrying the server's one-line message.
  const response = await fetch(path, {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
  });
  const data = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(data.error || `${path}: HTTP ${response.status}`);
  return data;
}

function setStatus(element, text, isError) {
  element.textContent = text;
  element.classList.toggle("error", Boolean(isError));
}

async function loadInfo() {
  const info = await (await fetch("/info")).json();
  state.info = info;
  const targets = info.target_languages || [];
  if (targets.length > 1) {  // a multilingual model: the page asks for one of its languages
    $("target-lang").replaceChildren(...targets.map((lang) => new Option(lang, lang)));
    $("target-lang-label").hidden = false;
  }
  const into = targets.length > 1 ? targets.join(", ") : info.languages.target;
  const langs = info.languages.source ? `${info.languages.source} → ${into}` : "";
  const model = info.model
    ? `${info.model.num_encoder_layers}+${info.model.num_decoder_layers} layers, ` +
      `${info.model.num_heads} heads, ${(info.parameters / 1e6).toFixed(1)}M parameters`
    : "";
  $("model-info").textContent = [langs, `${info.engine} engine`, model,
    `default beam ${info.decoding.beam_size}`].filter(Boolean).join(" · ");
  $("beam").value = info.decoding.beam_size;
  $("beam").max = info.limits.beam_size;
}

// The request's choices: the beam size and, for a multilingual model, the target language.
function choices() {
  const out = { beam_size: Number($("beam").value) };
  if (!$("target-lang-label").hidden) out.target_lang = $("target-lang").value;
  return out;
}

async function translate() {
  const lines = $("source").value.split("\n").map((l) => l.trim()).filter((l) => l);
  if (!lines.length) { setStatus($("status"), "type a sentence first", true); return; }
  setStatus($("status"), "translating…");
  document.body.dataset.state = "busy";
  try {
    const data = await post("/translate", { text: lines, ...choices() });
    state.lines = lines;
    showTranslations(lines, data.translations);
    setStatus($("status"), "");
    await select(0);
  } catch (error) {
    setStatus($("status"), error.message, true);
    document.body.dataset.state = "error";
  }
}

function showTranslations(lines, translations) {
  const list = $("translations");
  list.replaceChildren();
  translations.forEach((text, i) => {
    const item = document.createElement("li");
    const source = document.createElement("span");
    source.className = "source";
    source.textContent = lines[i];
    item.append(source, document.createTextNode(text));
    item.addEventListener("click", () => select(i));
    list.append(item);
  });
}

async function select(index) {
  state.selected = index;
  [...$("translations").children].forEach((li, i) => li.classList.toggle("selected", i === index));
  const request = ++state.request;  // answers to older clicks are dropped
  setStatus($("attention-note"), "computing the attention…");
  try {
    const report = await post("/attention", { text: state.lines[index], ...choices() });
    if (request !== state.request) return;
    state.report = report;
    setStatus($("attention-note"), `“${report.text}” → “${report.translation}”`);
    fillSelectors();
    draw();
    document.body.dataset.state = "ready";
  } catch (error) {
    if (request !== state.request) return;
    state.report = null;
    $("heads").replaceChildren();
    setStatus($("attention-note"), error.message, true);
    document.body.dataset.state = "error";
  }
}

function fillSelectors() {
  const report = state.report, kind = $("kind"), layer = $("layer");
  const kinds = Object.keys(report.kinds).filter((k) => report.layers.some((l) => l.kind === k));
  const keepKind = kinds.includes(kind.value) ? kind.value : "enc-dec";
  kind.replaceChildren(...kinds.map((k) => new Option(report.kinds[k], k)));
  kind.value = kinds.includes(keepKind) ? keepKind : kinds[0];
  const layers = report.layers.filter((l) => l.kind === kind.value).map((l) => l.layer);
  const keepLayer = layer.value === "" ? NaN : Number(layer.value);  // first time: the last
  layer.replaceChildren(...layers.map((n) => new Option(String(n), String(n))));
  layer.value = String(layers.includes(keepLayer) ? keepLayer : layers[layers.length - 1]);
}

function draw() {
  const report = state.report;
  if (!report) return;
  const kind = $("kind").value, number = Number($("layer").value);
  const layer = report.layers.find((l) => l.kind === kind && l.layer === number);
  const labels = report.labels[kind];
  const vmax = Math.max(...layer.weights.flat(2), 1e-9);
  $("scale").textContent = `colour: 0 … ${vmax.toFixed(3)}`;
  const figures = [];
  for (let head = 0; head < report.num_heads; head++) {
    const i = layer.heads.indexOf(head);
    figures.push(i < 0 ? prunedHead(head)
                       : heatmap(head, layer.weights[i], labels.queries, labels.keys, vmax));
  }
  $("heads").replaceChildren(...figures);
}

function prunedHead(head) {
  const figure = document.createElement("figure");
  figure.className = "head pruned";
  figure.dataset.head = head;
  const absent = document.createElement("div");
  absent.className = "absent";
  absent.textContent = "pruned";
  const caption = document.createElement("figcaption");
  caption.textContent = `head ${head} (pruned)`;
  figure.append(absent, caption);
  return figure;
}

function heatmap(head, weights, queries, keys, vmax) {
  // One head: rows = queries, columns = keys; labels left of and above the cells.
  const canvas = document.createElement("canvas");
  canvas.className = "heatmap";
  canvas.dataset.head = head;
  const ctx = canvas.getContext("2d");
  const font = "10px system-ui, sans-serif";
  ctx.font = font;
  const width = (labels) => Math.max(...labels.map((s) => ctx.measureText(s).width)) + 6;
  const cell = Math.max(6, Math.min(22, Math.floor(360 / Math.max(queries.length, keys.length))));
  const left = width(queries), top = width(keys);
  const w = left + keys.length * cell, h = top + queries.length * cell;
  const scale = window.devicePixelRatio || 1;
  canvas.width = w * scale;
  canvas.height = h * scale;
  canvas.style.width = `${w}px`;
  canvas.style.height = `${h}px`;
  ctx.scale(scale, scale);
  ctx.font = font;
  ctx.fillStyle = "#222";
  ctx.textBaseline = "middle";
  ctx.textAlign = "right";
  queries.forEach((q, r) => ctx.fillText(q, left - 3, top + (r + 0.5) * cell));
  keys.forEach((k, c) => {
    ctx.save();
    ctx.translate(left + (c + 0.5) * cell, top - 3);
    ctx.rotate(-Math.PI / 2);
    ctx.textAlign = "left";
    ctx.fillText(k, 0, 0);
    ctx.restore();
  });
  weights.forEach((row, r) => row.forEach((value, c) => {
    ctx.fillStyle = colour(value / vmax);
    ctx.fillRect(left + c * cell, top + r * cell, cell, cell);
  }));
  canvas.addEventListener("mousemove", (event) => {
    const box = canvas.getBoundingClientRect();
    const c = Math.floor((event.clientX - box.left - left) / cell);
    const r = Math.floor((event.clientY - box.top - top) / cell);
    if (r < 0 || c < 0 || r >= queries.length || c >= keys.length) { hideTooltip(); return; }
    showTooltip(event, `head ${head}: ${queries[r]} → ${keys[c]}: ${weights[r][c].toFixed(4)}`);
  });
  canvas.addEventListener("mouseleave", hideTooltip);
  const figure = document.createElement("figure");
  figure.className = "head";
  const caption = document.createElement("figcaption");
  caption.textContent = `head ${head}`;
  figure.append(canvas, caption);
  return figure;
}

function showTooltip(event, text) {
  const tip = $("tooltip");
  tip.textContent = text;
  tip.style.left = `${event.clientX + 12}px`;
  tip.style.top = `${event.clientY + 12}px`;
  tip.hidden = false;
}

function hideTooltip() { $("tooltip").hidden = true; }

$("translate").addEventListener("click", translate);
$("source").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) translate();
});
$("kind").addEventListener("change", () => { fillSelectors(); draw(); });
$("layer").addEventListener("change", draw);
loadInfo().catch((error) => setStatus($("model-info"), `cannot read /info: ${error.message}`, true));
