// peagle playground: a chat over POST /v1/chat/completions (streamed), each token coloured by how it came
// (peagle's "token_origins"), with the response's speculation figures live, and optionally the same prompt
// again without speculation ("speculative": false) beside it. Plain JS, no build step, nothing from elsewhere.
"use strict";

const $ = (id) => document.getElementById(id);
const conversation = [];   // the messages so far, as the API takes them
let inFlight = null;       // the AbortController of the request being streamed
let server = null;         // GET /v1/server_info

const ORIGIN = { 0: "cor", [-1]: "bonus", [-2]: "plain" };   // k >= 1: "acc", an accepted draft
const METHOD = { parallel: "P-EAGLE (parallel drafting)", eagle3: "EAGLE-3", none: "no speculation" };

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function authHeaders() {
  const key = $("api_key").value.trim();
  return key ? { Authorization: `Bearer ${key}` } : {};
}

async function loadServer() {
  const r = await fetch("/v1/server_info", { headers: authHeaders() }).catch(() => null);
  if (r === null || !r.ok) {
    server = null;
    $("server").textContent = r && r.status === 401 ? "This server needs its API key: enter it under API key."
      : "The server does not answer.";
    return;
  }
  server = await r.json();
  const s = server;
  let how = METHOD[s.method] || s.method;
  if (s.method !== "none") {
    how += `, K = ${s.num_speculative_tokens === "auto" ? `auto (at most ${s.max_speculative_tokens})` : s.num_speculative_tokens}`;
    if (s.speculative_token_tree !== "chain") how += `, token tree ${s.speculative_token_tree}`;
  }
  const runsOn = `${s.device}, ${s.precision}, ${s.cuda_graphs ? "CUDA graphs" : `${s.kernels} kernels`}`;
  $("server").textContent = `${s.model} · ${how} · ${runsOn} · context ${s.max_model_len} tokens`;
}

function request(messages, speculative) {
  const body = { messages, stream: true, stream_options: { include_usage: true }, token_origins: true, speculative };
  for (const [field, parse] of [["temperature", parseFloat], ["top_p", parseFloat], ["max_tokens", parseInt], ["seed", parseInt]]) {
    const value = parse($(field).value);
    if (!Number.isNaN(value)) body[field] = value;
  }
  const top = parseInt($("top_logprobs").value);
  if (!Number.isNaN(top)) Object.assign(body, { logprobs: true, top_logprobs: top });
  return body;
}

// One response as it streams: its tokens' spans and its figures, painted at most once a frame.
class Answer {
  constructor(parent, title) {
    this.box = el("article", "answer");
    this.box.setAttribute("aria-busy", "true");
    this.box.append(el("h3", "", title));
    this.textBox = el("div", "text");
    this.figures = el("div", "figures");
    this.bars = el("div", "bars");
    this.bars.setAttribute("role", "img");
    this.chart = el("figure", "chart");
    this.chart.append(this.bars, el("figcaption", "", "accepted in % of rounds, by draft position"));
    this.chart.hidden = true;
    this.box.append(this.textBox, this.figures, this.chart);
    parent.append(this.box);
    Object.assign(this, { text: "", tokens: 0, tokensFirst: 0, accepted: [], rounds: 0, logprobs: [],
      metrics: null, usage: null, start: performance.now(), first: null, last: null, painting: false });
  }

  take(event) {
    const now = performance.now();
    const chat = $("chat");
    const following = chat.scrollHeight - chat.scrollTop - chat.clientHeight < 40;   // unless the reader scrolled up
    for (const c of event.choices) {
      this.text += c.delta.content || "";
      if (c.logprobs) this.logprobs.push(...c.logprobs.content);
      for (const piece of c.token_origins || []) this.addToken(piece);
      if ((c.token_origins || []).length) {
        if (this.first === null) [this.first, this.tokensFirst] = [now, this.tokens];
        this.last = now;
      }
    }
    if (following) chat.scrollTop = chat.scrollHeight;
    if (event.metrics) this.metrics = event.metrics.speculative_decoding;
    if (event.usage) this.usage = event.usage;
    if (!this.painting) {
      this.painting = true;
      requestAnimationFrame(() => { this.painting = false; this.paint(); });
    }
  }

  addToken({ text, origin }) {
    const span = el("span", `tok ${origin >= 1 ? "acc" : ORIGIN[origin]}${origin >= 4 ? " deep" : ""}`, text);
    span.dataset.origin = origin;
    span.title = this.describe(this.tokens, origin);
    this.textBox.append(span);
    this.tokens += 1;
    if (origin >= 1) this.accepted[origin - 1] = (this.accepted[origin - 1] || 0) + 1;
    if (origin === 0 || origin === -1) this.rounds += 1;   // every round with drafts ends with one of these
  }

  describe(i, origin) {
    const how = origin >= 1 ? `draft ${origin} of its round, accepted`
      : origin === 0 ? "the target's own token: the draft here was rejected"
      : origin === -1 ? "bonus: the target's token after every draft of the round was accepted"
      : "a round without drafts";
    const lp = this.logprobs[i];
    if (!lp) return `token ${i + 1}: ${how}`;
    const alts = lp.top_logprobs.map((t) => `${JSON.stringify(t.token)} ${t.logprob.toFixed(2)}`).join(", ");
    return `token ${i + 1}: ${how}\nlogprob ${lp.logprob.toFixed(3)}${alts ? `\ntop: ${alts}` : ""}`;
  }

  // decode rate: the tokens after the first event, over the time since it (the first is the prompt's pass)
  get rate() {
    const seconds = (this.last - this.first) / 1000;
    return seconds > 0 ? (this.tokens - this.tokensFirst) / seconds : null;
  }

  paint() {
    const m = this.metrics;
    const rounds = m ? m.num_spec_steps : this.rounds;
    const acceptedAt = m ? m.accepted_per_position : this.accepted.map((a) => a || 0);
    const al = m ? m.mean_acceptance_length : rounds ? 1 + acceptedAt.reduce((a, b) => a + b, 0) / rounds : null;
    const figures = [["tokens", this.usage ? this.usage.completion_tokens : this.tokens],
      ["decode", this.rate === null ? "–" : `${this.rate.toFixed(1)} tok/s`],
      ["first token", this.first === null ? "–" : `${Math.round(this.first - this.start)} ms`],
      ["acceptance length", al === null ? "–" : al.toFixed(2)]];
    if (m && m.num_draft_tokens) figures.push(["drafts accepted", `${(100 * m.draft_acceptance_rate).toFixed(0)}%`]);
    this.figures.replaceChildren(...figures.map(([name, value]) => {
      const f = el("span", "", `${name} `);
      f.append(el("b", "", String(value)));
      return f;
    }));
    // the positions drafted: at the end the server's count; meanwhile K (auto: those accepted so far)
    const fixed = server && typeof server.num_speculative_tokens === "number" ? server.max_speculative_tokens : 0;
    const positions = m ? m.drafted_per_position.length : Math.max(acceptedAt.length, fixed);
    const shares = Array.from({ length: rounds ? positions : 0 }, (_, k) => (acceptedAt[k] || 0) / rounds);
    this.chart.hidden = !shares.length;
    this.bars.setAttribute("aria-label", shares.length ? "acceptance by draft position: "
      + shares.map((s, k) => `${k + 1}: ${Math.round(100 * s)}%`).join(", ") : "no drafts");
    this.bars.replaceChildren(...shares.map((share, k) => {
      const bar = el("div", "bar");
      bar.title = `draft position ${k + 1}: accepted in ${Math.round(100 * share)}% of rounds`;
      const fill = el("span");
      fill.style.height = `${Math.max(2, 70 * share)}%`;
      bar.append(`${Math.round(100 * share)}`, fill, el("small", "", String(k + 1)));
      return bar;
    }));
  }

  end(error) {
    this.paint();
    if (error) this.box.append(el("p", "error", error.name === "AbortError" ? "stopped" : error.message));
    this.box.setAttribute("aria-busy", "false");
  }
}

async function stream(answer, body, signal) {
  const r = await fetch("/v1/chat/completions", { method: "POST", signal, body: JSON.stringify(body),
    headers: { ...authHeaders(), "Content-Type": "application/json" } });
  if (!r.ok) {
    const e = await r.json().catch(() => null);
    throw new Error(e && e.error ? e.error.message : `HTTP ${r.status}`);
  }
  const reader = r.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const line = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      if (!line.startsWith("data: ")) continue;
      if (line === "data: [DONE]") return;
      const event = JSON.parse(line.slice(6));
      if (event.error) throw new Error(event.error.message);
      answer.take(event);
    }
  }
}

async function run(answer, body) {
  try {
    await stream(answer, body, inFlight.signal);
    answer.end(null);
    return true;
  } catch (e) {
    answer.end(e);
    return false;
  }
}

function verdict(turn, spec, plain) {
  const same = spec.text === plain.text;
  let line = same ? "Same text, token for token." : "The texts differ (expected when sampling without a seed).";
  if (spec.rate && plain.rate) line += ` Speculation decoded ${(spec.rate / plain.rate).toFixed(2)}× as fast.`;
  const p = el("p", "verdict", line);
  p.dataset.same = same;
  turn.append(p);
}

async function send(event) {
  event.preventDefault();
  const content = $("prompt").value.trim();
  if (inFlight || !content) return;
  $("prompt").value = "";
  conversation.push({ role: "user", content });
  const messages = conversation.slice();
  const turn = el("div", "turn");
  const answers = el("div", "answers");
  turn.append(el("div", "user", content), answers);
  $("chat").append(turn);
  inFlight = new AbortController();
  setRunning(true);
  try {
    const spec = new Answer(answers, server && server.method === "none" ? "the target alone" : "with speculation");
    const ok = await run(spec, request(messages, true));
    conversation.push({ role: "assistant", content: spec.text });
    // after the first, not beside it: two requests at once would share steps and slow each other's rate
    if (ok && $("compare").checked) {
      const plain = new Answer(answers, "without speculation");
      if (await run(plain, request(messages, false))) verdict(turn, spec, plain);
    }
  } finally {
    inFlight = null;
    setRunning(false);
  }
}

function setRunning(on) {
  $("send").disabled = on;
  $("stop").disabled = !on;
}

$("ask").addEventListener("submit", send);
$("prompt").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
    e.preventDefault();
    $("ask").requestSubmit();
  } else if (e.key === "Escape" && inFlight) {
    inFlight.abort();
  }
});
$("stop").addEventListener("click", () => inFlight && inFlight.abort());
$("clear").addEventListener("click", () => {
  conversation.length = 0;
  $("chat").replaceChildren();
  $("prompt").focus();
});
$("api_key").addEventListener("change", () => {
  sessionStorage.setItem("peagle-api-key", $("api_key").value);
  loadServer();
});
$("api_key").value = sessionStorage.getItem("peagle-api-key") || "";
loadServer();
$("prompt").focus();
