// The Sluice dashboard: loads the last minutes from GET /v1/stats/history, then polls
// GET /v1/stats every second and GET /v1/policies and GET /v1/top every few seconds, and draws
// what it gets. No framework, no network access beyond this server. The admin token (if the
// server has one) stays in this tab's sessionStorage; without a valid one the page stops
// polling and asks for it. A panel whose data the server does not give stays hidden.
"use strict";

const POLL_MS = 1000;
const KEEP = 3600; // seconds of per-second samples kept for the chart
const $ = (id) => document.getElementById(id);
const collator = new Intl.Collator(undefined, { numeric: true, sensitivity: "base" });
const byName = (a, b) => collator.compare(a, b);

const state = {
  previous: null, // the last /v1/stats reading
  series: [], // [{t, allowed, denied, degraded}], one per second, oldest first, for the chart
  policies: [], // from /v1/policies
  polling: false,
  timers: [],
  generation: 0, // bumped when the chart's selection changes: late answers are dropped
  report: null, // the playground's last answer, redrawn at a new width
};

const zero = () => ({ allowed: 0, denied: 0, degraded: 0, errors: 0 });
const checks = (c) => c.allowed + c.denied + c.degraded + c.errors;
const ruleName = (r) => `${r.domain}/${r.rule}`;
const entriesText = (entries) => entries.map((e) => `${e.key} = ${e.value}`).join(", ");

// ----- the token and the polling ------------------------------------------------------------

class Unauthorized extends Error {}

$("token").value = sessionStorage.getItem("sluice-token") || "";
$("token").addEventListener("change", () => {
  sessionStorage.setItem("sluice-token", $("token").value.trim());
  start();
});
$("chart-policy").addEventListener("change", loadHistory);
$("chart-window").addEventListener("change", loadHistory);
$("top-policy").addEventListener("change", refreshTop);
$("top-by").addEventListener("change", refreshTop);
window.addEventListener("resize", () => {
  drawChart();
  if (state.report) drawSimulation(state.report);
});

async function api(path, options = {}) {
  const headers = { ...(options.headers || {}) };
  const token = $("token").value.trim();
  if (token) headers.authorization = "Bearer " + token;
  const response = await fetch(path, { ...options, headers });
  if (response.status === 401) {
    stop(
      token
        ? "This token is not one of the server's admin tokens: paste another above."
        : "This server needs an admin token: paste one of its admin tokens above.",
    );
    throw new Unauthorized("unauthorized");
  }
  if (response.status === 204) return null;
  const body = await response.json();
  if (!response.ok) {
    const e = new Error((body.error && body.error.message) || response.statusText);
    e.status = response.status;
    throw e;
  }
  return body;
}

// No polling without a token the server takes: every timer stops until one is entered.
function stop(message) {
  state.polling = false;
  for (const t of state.timers) clearInterval(t);
  state.timers = [];
  notice(message);
  if (message) $("status").textContent = "waiting for an admin token";
}

async function start() {
  stop("");
  try {
    state.policies = (await api("/v1/policies")).policies;
  } catch (e) {
    if (!(e instanceof Unauthorized)) $("status").textContent = "not connected: " + e.message;
    if (e instanceof Unauthorized) return;
  }
  state.polling = true;
  state.timers.push(setInterval(refreshStats, POLL_MS), setInterval(refreshSlow, 3 * POLL_MS));
  await refreshStats();
  await loadHistory();
  await refreshTop();
}

function notice(text) {
  const n = $("notice");
  n.textContent = text || "";
  n.style.display = text ? "block" : "none";
}

// ----- small helpers --------------------------------------------------------------------------

function cell(row, text, className) {
  const td = row.insertCell();
  td.textContent = text;
  if (className) td.className = className;
  return td;
}

function plural(n, word) {
  return `${n} ${word}${n === 1 ? "" : "s"}`;
}

function rate(x) {
  if (!Number.isFinite(x)) return "—";
  return x < 10 ? x.toFixed(1) : Math.round(x).toString();
}

function percent(denied, allowed) {
  const total = denied + allowed;
  return total > 0 ? ((denied * 100) / total).toFixed(1) + " %" : "—";
}

function ms(x) {
  return x === undefined || x === null ? "—" : x < 10 ? x.toFixed(2) : x.toFixed(1);
}

function clock(msSinceEpoch) {
  return new Date(msSinceEpoch).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false });
}

function limitsText(policy) {
  const span = (ms) => (ms >= 1000 ? ms / 1000 + "s" : ms + "ms");
  return policy.limits
    .map((l) =>
      l.algorithm === "concurrency"
        ? `${l.max} at once (leases of ${span(l.per_ms)})`
        : `${l.max}/${span(l.per_ms)} ${l.algorithm}`,
    )
    .join(", ");
}

// Options of a select as [value, label] pairs; rebuilt only when they change.
function fillSelect(select, options, keepFirst) {
  const current = select.value;
  const fixed = keepFirst ? [select.options[0]] : [];
  const wanted = JSON.stringify(options);
  if (select.dataset.options === wanted) return;
  select.dataset.options = wanted;
  select.replaceChildren(...fixed);
  for (const [value, label] of options) select.add(new Option(label, value));
  if ([...select.options].some((o) => o.value === current)) select.value = current;
}

// 1, 2 or 5 × 10^n: the step of about `count` ticks from 0 to `max`.
function niceStep(max, count) {
  const raw = Math.max(max, 1e-9) / count;
  const power = 10 ** Math.floor(Math.log10(raw));
  for (const m of [1, 2, 5, 10]) if (m * power >= raw) return m * power;
  return 10 * power;
}

// A time step (ms) giving at most about `count` labels over `spanMs`.
function timeStep(spanMs, count) {
  const steps = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 86400].map((s) => s * 1000);
  return steps.find((s) => spanMs / s <= count) || steps[steps.length - 1];
}

function duration(msValue) {
  if (msValue === null || msValue === undefined) return "—";
  const s = msValue / 1000;
  if (s >= 3600 && s % 3600 === 0) return s / 3600 + " h";
  if (s >= 60 && s % 60 === 0) return s / 60 + " min";
  return (msValue % 1000 ? s.toFixed(1) : s.toString()) + " s";
}

// A time from the start of a simulation for its axis: `45 s` within the first minute of a
// short traffic, else `m:ss` or `h:mm:ss`.
function offset(msValue, totalMs) {
  const s = Math.round(msValue / 1000);
  if (totalMs < 60000) return s + " s";
  const two = (n) => String(n).padStart(2, "0");
  if (totalMs < 3600000) return `${Math.floor(s / 60)}:${two(s % 60)}`;
  return `${Math.floor(s / 3600)}:${two(Math.floor(s / 60) % 60)}:${two(s % 60)}`;
}

const SVG = "http://www.w3.org/2000/svg";
function el(name, attrs, text) {
  const e = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}
const color = (name) => getComputedStyle(document.documentElement).getPropertyValue(name).trim();

// ----- the live numbers --------------------------------------------------------------------

// Every name the chart and the top keys can show: configured policies, each Envoy rule once
// (`domain/rule`), and, from a server that does not group rules, its statistics keys.
function chartNames(stats) {
  const names = new Set(state.policies.map((p) => p.name));
  for (const name of Object.keys(stats.policies)) names.add(name);
  for (const r of stats.rules || []) names.add(ruleName(r));
  return [...names].sort(byName);
}

// The counts the chart sums for its selection in one /v1/stats reading.
function selected(stats, name) {
  const out = { allowed: 0, denied: 0, degraded: 0 };
  const add = (c) => {
    out.allowed += c.allowed;
    out.denied += c.denied;
    out.degraded += c.degraded + c.errors;
  };
  for (const [n, c] of Object.entries(stats.policies)) if (!name || n === name) add(c);
  for (const r of stats.rules || []) if (!name || ruleName(r) === name) add(r.counts);
  return out;
}

async function refreshStats() {
  if (!state.polling) return;
  let stats;
  try {
    stats = await api("/v1/stats");
  } catch (e) {
    if (!(e instanceof Unauthorized)) $("status").textContent = "not connected: " + e.message;
    return;
  }
  notice("");
  const names = chartNames(stats);
  fillSelect($("chart-policy"), names.map((n) => [n, n]), true);
  fillSelect($("top-policy"), topChoices(stats), false);
  const prev = state.previous;
  if (prev) {
    const dt = Math.max(1, stats.now_ms - prev.now_ms) / 1000;
    const name = $("chart-policy").value;
    const a = selected(stats, name), b = selected(prev, name);
    pushSample({
      t: stats.now_ms,
      allowed: (a.allowed - b.allowed) / dt,
      denied: (a.denied - b.denied) / dt,
      degraded: (a.degraded - b.degraded) / dt,
    });
    drawPolicies(stats, prev, dt);
    drawRules(stats, prev, dt);
  }
  state.previous = stats;
  drawChart();
  drawLatency(stats);
  drawStore(stats);
  drawRegions(stats);
  drawReloads(stats);
  drawRlqs(stats);
  $("status").textContent =
    `${stats.store.kind} store · configuration generation ${stats.config.generation}` +
    (stats.config.last_reload_error ? " · last reload FAILED" : "");
}

function pushSample(sample) {
  const last = state.series[state.series.length - 1];
  if (last && sample.t <= last.t) return;
  state.series.push(sample);
  if (state.series.length > KEEP) state.series.splice(0, state.series.length - KEEP);
}

// The chart's past from the server's history (the last hour, per second), so that it is full
// on load; polling extends it. A server without history starts the chart empty.
async function loadHistory() {
  const generation = ++state.generation;
  state.series = [];
  state.previous = null;
  const seconds = Number($("chart-window").value);
  let history;
  try {
    history = await api(`/v1/stats/history?seconds=${seconds}`);
  } catch (e) {
    if (e.status === 404) $("chart").dataset.history = "none";
    drawChart();
    return;
  }
  if (generation !== state.generation) return;
  const name = $("chart-policy").value;
  const step = (history.step_s || 1) * 1000;
  let length = 0;
  for (const s of Object.values(history.series)) length = Math.max(length, s.allowed.length);
  const samples = [];
  for (let i = 0; i < length; i++) {
    samples.push({ t: history.end_ms - (length - 1 - i) * step, allowed: 0, denied: 0, degraded: 0 });
  }
  for (const [n, s] of Object.entries(history.series)) {
    if (name && n !== name) continue;
    const offset = length - s.allowed.length;
    s.allowed.forEach((v, i) => (samples[offset + i].allowed += v / (step / 1000)));
    s.denied.forEach((v, i) => (samples[offset + i].denied += v / (step / 1000)));
    (s.degraded || []).forEach((v, i) => (samples[offset + i].degraded += v / (step / 1000)));
  }
  state.series = samples.concat(state.series.filter((p) => p.t > history.end_ms));
  $("chart").dataset.history = samples.length.toString();
  $("chart").dataset.historyDenied = samples.reduce((sum, p) => sum + p.denied, 0).toString();
  drawChart();
}

function drawPolicies(stats, prev, dt) {
  const body = $("policies").tBodies[0];
  body.replaceChildren();
  const configured = Object.fromEntries(state.policies.map((p) => [p.name, p]));
  const grouped = Array.isArray(stats.rules);
  const names = [...new Set([...Object.keys(configured), ...Object.keys(stats.policies)])]
    .sort(byName)
    .map((name) => {
      const now = stats.policies[name] || zero();
      const was = prev.policies[name] || zero();
      return {
        name,
        allowed: (now.allowed - was.allowed) / dt,
        denied: (now.denied - was.denied) / dt,
        degraded: (now.degraded + now.errors - was.degraded - was.errors) / dt,
        total: now.allowed + now.denied + now.degraded + now.errors,
      };
    });
  for (const p of names) {
    const row = body.insertRow();
    row.dataset.policy = p.name;
    cell(row, p.name, "name");
    cell(row, configured[p.name] ? limitsText(configured[p.name]) : grouped ? "—" : "Envoy rule", "muted");
    cell(row, rate(p.allowed), "n allowed");
    cell(row, rate(p.denied), "n denied");
    cell(row, percent(p.denied, p.allowed), "n");
    cell(row, rate(p.degraded), "n degraded");
    cell(row, p.total.toString(), "n");
  }
}

// Envoy rules grouped under domain → rule; a rule's detailed keys folded under it, shown as
// their descriptor entries, the heaviest first, with how many there are in all.
function drawRules(stats, prev, dt) {
  const card = $("rules-card");
  if (!Array.isArray(stats.rules)) {
    card.hidden = true;
    return;
  }
  card.hidden = stats.rules.length === 0;
  const box = $("rules");
  const open = new Set([...box.querySelectorAll("details[open]")].map((d) => d.dataset.rule));
  const before = new Map();
  for (const r of prev.rules || []) {
    before.set(ruleName(r), r.counts);
    for (const k of r.keys || []) before.set(ruleName(r) + "\n" + entriesText(k.entries), k.counts);
  }
  const rates = (id, c) => {
    const was = before.get(id) || zero();
    return {
      allowed: (c.allowed - was.allowed) / dt,
      denied: (c.denied - was.denied) / dt,
      degraded: (c.degraded + c.errors - was.degraded - was.errors) / dt,
    };
  };
  const rules = [...stats.rules].sort((a, b) => byName(a.domain, b.domain) || byName(a.rule, b.rule));
  const line = (tag, parts) => {
    const l = document.createElement(tag);
    l.className = "rule-line";
    for (const [text, cls] of parts) {
      const span = document.createElement("span");
      span.className = cls;
      span.textContent = text;
      l.append(span);
    }
    return l;
  };
  const children = [
    line("div", [["rule", "name"], ["allowed/s", ""], ["denied/s", ""], ["denied %", ""], ["checks", ""], ["detailed keys", ""]]),
  ];
  children[0].classList.add("rule-head");
  let domain = null;
  for (const r of rules) {
    if (r.domain !== domain) {
      domain = r.domain;
      const h = document.createElement("div");
      h.className = "domain";
      h.textContent = "domain " + domain;
      children.push(h);
    }
    const id = ruleName(r);
    const rr = rates(id, r.counts);
    const total = r.counts.allowed + r.counts.denied + r.counts.degraded + r.counts.errors;
    const parts = [
      [r.rule, "name"],
      [rate(rr.allowed), "allowed"],
      [rate(rr.denied), "denied"],
      [percent(rr.denied, rr.allowed), ""],
      [total.toString(), ""],
      [r.keys_total ? r.keys_total + (r.keys_capped ? "+ (capped)" : "") : "—", "muted"],
    ];
    if (!(r.keys || []).length) {
      const l = line("div", parts);
      l.dataset.rule = id;
      children.push(l);
      continue;
    }
    const d = document.createElement("details");
    d.className = "rule";
    d.dataset.rule = id;
    d.open = open.has(id);
    d.append(line("summary", parts));
    const wrap = document.createElement("div");
    wrap.className = "scroll";
    const table = document.createElement("table");
    table.createTHead().innerHTML =
      '<tr><th>descriptor entries</th><th class="n">allowed/s</th><th class="n">denied/s</th><th class="n">denied %</th><th class="n">total checks</th></tr>';
    const body = table.createTBody();
    const keys = [...r.keys].sort((a, b) => checks(b.counts) - checks(a.counts) || byName(entriesText(a.entries), entriesText(b.entries)));
    for (const k of keys) {
      const text = entriesText(k.entries);
      const kr = rates(id + "\n" + text, k.counts);
      const row = body.insertRow();
      row.dataset.entries = text;
      cell(row, text, "name");
      cell(row, rate(kr.allowed), "n allowed");
      cell(row, rate(kr.denied), "n denied");
      cell(row, percent(kr.denied, kr.allowed), "n");
      cell(row, checks(k.counts).toString(), "n");
    }
    wrap.append(table);
    d.append(wrap);
    if (r.keys_total > r.keys.length) {
      const more = document.createElement("div");
      more.className = "muted";
      more.style.marginLeft = "1.5rem";
      more.textContent = `the ${r.keys.length} heaviest of ${r.keys_total} keys`;
      d.append(more);
    }
    children.push(d);
  }
  box.replaceChildren(...children);
  $("rules-note").textContent = plural(rules.length, "rule") + " with traffic";
}

// ----- the chart ---------------------------------------------------------------------------

function drawChart() {
  const svg = $("chart");
  const W = Math.max(200, svg.clientWidth || 600), H = 200;
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  const left = 44, right = 8, top = 8, bottom = 22;
  const spanMs = Number($("chart-window").value) * 1000;
  const points = state.series;
  const end = points.length ? points[points.length - 1].t : Date.now();
  const begin = end - spanMs;
  const shown = points.filter((p) => p.t >= begin);
  const peak = Math.max(0, ...shown.map((p) => Math.max(p.allowed, p.denied, p.degraded)));
  const step = niceStep(peak || 1, 4);
  const max = Math.max(step, Math.ceil(peak / step) * step);
  const x = (t) => left + ((t - begin) * (W - left - right)) / spanMs;
  const y = (v) => H - bottom - (v * (H - top - bottom)) / max;
  const children = [];
  const ticks = [];
  for (let v = 0; v <= max + step / 2; v += step) {
    ticks.push(+v.toPrecision(12));
    children.push(el("line", { class: "grid", x1: left, x2: W - right, y1: y(v), y2: y(v) }));
    children.push(el("text", { x: left - 4, y: y(v) + 4, "text-anchor": "end", class: "ytick" }, +v.toPrecision(12) + ""));
  }
  const tstep = timeStep(spanMs, Math.max(2, Math.floor((W - left) / 90)));
  for (let t = Math.ceil(begin / tstep) * tstep; t <= end; t += tstep) {
    children.push(el("line", { class: "grid", x1: x(t), x2: x(t), y1: top, y2: H - bottom }));
    const label = tstep >= 60000
      ? new Date(t).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", hour12: false })
      : clock(t);
    const anchor = x(t) > W - right - 30 ? "end" : x(t) < left + 30 ? "start" : "middle";
    children.push(el("text", { x: x(t), y: H - 6, "text-anchor": anchor, class: "xtick" }, label));
  }
  children.push(el("line", { class: "axis", x1: left, x2: W - right, y1: y(0), y2: y(0) }));
  if (shown.length > 1) {
    for (const [key, name] of [["allowed", "--allowed"], ["denied", "--denied"], ["degraded", "--degraded"]]) {
      const d = shown.map((p, i) => `${i ? "L" : "M"}${x(p.t).toFixed(1)},${y(p[key]).toFixed(1)}`).join("");
      children.push(el("path", { d, fill: "none", "stroke-width": 1.5, stroke: color(name), "data-series": key }));
    }
  }
  svg.replaceChildren(...children);
  const last = shown[shown.length - 1];
  svg.dataset.points = shown.length.toString();
  svg.dataset.ticks = ticks.join(",");
  svg.dataset.lastAllowed = last ? last.allowed.toFixed(2) : "0";
  svg.dataset.lastDenied = last ? last.denied.toFixed(2) : "0";
  const sum = (k) => shown.reduce((s, p) => s + p[k], 0);
  $("chart-now").textContent = last
    ? `now: ${rate(last.allowed)} allowed/s, ${rate(last.denied)} denied/s, ${percent(last.denied, last.allowed)} denied; ` +
      `over the window: ${percent(sum("denied"), sum("allowed"))} denied`
    : "";
}

// ----- latency, store, reloads, RLQS -------------------------------------------------------

function drawLatency(stats) {
  const l = stats.latency;
  $("latency-card").hidden = !l;
  if (!l) return;
  $("latency-window").textContent = `over the last ${duration((l.window_s || 0) * 1000)}`;
  const body = $("latency").tBodies[0];
  body.replaceChildren();
  for (const [name, d] of Object.entries(l.decision || {}).sort(([a], [b]) => byName(a, b))) {
    const row = body.insertRow();
    row.dataset.protocol = name;
    cell(row, name);
    cell(row, d.count.toString(), "n");
    cell(row, ms(d.p50_ms), "n");
    cell(row, ms(d.p99_ms), "n");
  }
}

function drawStore(stats) {
  $("store-kind").textContent =
    stats.store.kind === "memory" ? `in this process: ${plural(stats.store.keys, "key")}` : stats.store.kind;
  const body = $("shards").tBodies[0];
  body.replaceChildren();
  const latency = stats.store.shards.some((s) => s.p50_ms !== undefined);
  for (const th of $("shards").querySelectorAll("th[data-latency]")) th.hidden = !latency;
  $("shards").hidden = stats.store.shards.length === 0;
  for (const s of stats.store.shards) {
    const row = body.insertRow();
    row.dataset.shard = s.name;
    cell(row, s.name, "name");
    cell(
      row,
      (s.circuit || "—") + (s.opened_total ? ` (opened ${s.opened_total}×)` : ""),
      s.circuit && s.circuit !== "closed" ? "denied" : "allowed",
    );
    cell(row, s.ok ? ms(s.latency_ms) : "—", "n");
    if (latency) {
      cell(row, ms(s.p50_ms), "n");
      cell(row, ms(s.p99_ms), "n");
    }
    const columns = row.cells.length;
    if (!s.ok) {
      const e = body.insertRow();
      cell(e, s.error, "error").colSpan = columns;
    }
    for (const r of s.replicas || []) {
      const rr = body.insertRow();
      rr.className = "replica";
      cell(rr, "↳ replica " + r.addr, "name muted");
      cell(rr, r.ok ? "up" : "down", r.ok ? "allowed" : "denied");
      cell(rr, r.ok ? ms(r.latency_ms) : "—", "n");
      const lag = cell(rr, r.lag_s === undefined ? "" : `lag ${r.lag_s} s`, "n muted");
      lag.colSpan = columns - 3;
    }
  }
  const r = stats.reservation;
  $("reservation").textContent = r
    ? `served locally ${r.local}, cached denials ${r.cached_denials}, fetches ${r.fetches}, waited ${r.waited}, direct ${r.direct}, refunds ${r.refunds}`
    : "off (local.enabled is false)";
  const c = $("config");
  c.replaceChildren();
  c.append(`generation ${stats.config.generation}`);
  if (stats.config.last_reload_error) {
    const e = document.createElement("div");
    e.className = "error";
    e.textContent = "last reload failed: " + stats.config.last_reload_error;
    c.append(e);
  }
}

// The regions store (store.regions): each other region's replica in this region, its
// replication lag and the age of this region's view of its usage; only with a regions store.
function drawRegions(stats) {
  const regions = Array.isArray(stats.regions) ? stats.regions : [];
  $("regions-card").hidden = regions.length === 0;
  if (!regions.length) return;
  $("regions-local").textContent = stats.store.region ? `seen from ${stats.store.region}` : "";
  const body = $("regions").tBodies[0];
  body.replaceChildren();
  for (const r of regions) {
    const row = body.insertRow();
    row.dataset.region = r.name;
    cell(row, r.name, "name");
    cell(row, r.reachable ? "reachable" : "unreachable", r.reachable ? "allowed" : "denied");
    cell(row, r.lag_s === undefined ? "—" : ms(r.lag_s * 1000), "n");
    cell(row, r.view_age_s === undefined ? "—" : ms(r.view_age_s * 1000), "n");
    cell(row, r.fallback ? "stale: fallback" : "summed", r.fallback ? "degraded" : "allowed");
  }
}

function drawReloads(stats) {
  $("reloads-card").hidden = !Array.isArray(stats.reloads);
  if (!Array.isArray(stats.reloads)) return;
  const body = $("reloads").tBodies[0];
  body.replaceChildren();
  for (const r of stats.reloads) {
    const row = body.insertRow();
    cell(row, clock(r.at_ms));
    cell(row, r.generation.toString(), "n");
    cell(row, r.source || "");
    cell(row, r.ok ? "ok" : r.error || "failed", r.ok ? "allowed" : "error");
  }
}

function drawRlqs(stats) {
  const q = stats.rlqs;
  $("rlqs-card").hidden = !q;
  if (!q) return;
  $("rlqs-total").textContent = plural(q.buckets_total, "bucket") + " in all";
  const body = $("rlqs").tBodies[0];
  body.replaceChildren();
  for (const s of q.streams) {
    const row = body.insertRow();
    cell(row, s.domain);
    cell(row, s.peer || "—");
    cell(row, clock(s.opened_ms));
    cell(row, s.buckets.toString(), "n");
  }
  if (!q.streams.length) {
    const row = body.insertRow();
    cell(row, "no stream open", "muted").colSpan = 4;
  }
}

// ----- top keys ----------------------------------------------------------------------------

// What /v1/top can be asked about: configured policies, and each Envoy rule once under its
// statistics key (`domain.rule`); from a server that does not group rules, its names.
function topChoices(stats) {
  const out = new Map(state.policies.map((p) => [p.name, p.name]));
  if (Array.isArray(stats.rules)) {
    for (const r of stats.rules) out.set(`${r.domain}.${r.rule}`, `${r.domain} / ${r.rule}`);
  } else {
    for (const name of Object.keys(stats.policies)) out.set(name, name);
  }
  return [...out].sort((a, b) => byName(a[1], b[1]));
}

async function refreshTop() {
  if (!state.polling) return;
  const policy = $("top-policy").value;
  const by = $("top-by").value;
  const body = $("top").tBodies[0];
  if (!policy) return;
  // Another policy or measure chosen: the rows shown belong to the old one, so they go now.
  const shown = `${by} ${policy}`;
  if (body.dataset.shown !== shown) {
    body.replaceChildren();
    body.dataset.shown = shown;
  }
  let top;
  try {
    top = await api(`/v1/top?policy=${encodeURIComponent(policy)}&by=${by}&limit=20`);
  } catch (e) {
    if (!(e instanceof Unauthorized)) $("top-note").textContent = e.message;
    return;
  }
  // A poll that left before the choice changed answers for the old choice: drop it.
  if ($("top-policy").value !== policy || $("top-by").value !== by) return;
  const configured = state.policies.some((p) => p.name === policy);
  body.replaceChildren();
  const keys = [...top.keys].sort((a, b) => b.count - a.count || byName(a.key, b.key));
  for (const k of keys) {
    const row = body.insertRow();
    row.dataset.key = k.key;
    cell(row, k.entries ? entriesText(k.entries) : k.key, "name");
    cell(row, k.count.toString(), "n");
    cell(row, k.error.toString(), "n muted");
    cell(row, k.remaining === undefined || k.remaining === null ? "—" : k.remaining.toString(), "n");
    const action = row.insertCell();
    if (configured) {
      const button = document.createElement("button");
      button.textContent = "reset";
      button.title = `forget ${k.key}'s state under ${policy}`;
      button.addEventListener("click", async () => {
        try {
          await api(`/v1/keys/${encodeURIComponent(policy)}/${encodeURIComponent(k.key)}`, { method: "DELETE" });
          $("top-note").textContent = `reset ${k.key}`;
        } catch (e) {
          $("top-note").textContent = e.message;
        }
        refreshTop();
      });
      action.append(button);
    }
  }
  const since = clock(top.since_ms);
  $("top-note").textContent = `${top.total} ${top.by === "used" ? "units used" : "denials"} since ${since} in this process; counts over-estimate by at most ± error`;
}

async function refreshSlow() {
  if (!state.polling) return;
  try {
    state.policies = (await api("/v1/policies")).policies;
  } catch (e) {
    return;
  }
  await refreshTop();
}

// ----- the playground: POST /v1/simulate, drawn as stacked bars per policy -------------

const PALETTE = { admitted: "#3a9a4a", denied: "#d0473d" };
const MAX_LOG = 7 * 1024 * 1024; // the route takes 8 MiB of body

$("sim-run").addEventListener("click", simulate);
$("sim-file").addEventListener("change", readFile);

// A file into the log box; a gzip file (told by its first bytes) is decompressed here, by
// the browser's own DecompressionStream, since the route takes the log as text.
async function readFile() {
  const file = $("sim-file").files[0];
  $("sim-file-note").textContent = "";
  if (!file) return;
  try {
    const head = new Uint8Array(await file.slice(0, 2).arrayBuffer());
    let text;
    if (head[0] === 0x1f && head[1] === 0x8b) {
      const stream = file.stream().pipeThrough(new DecompressionStream("gzip"));
      text = await new Response(stream).text();
    } else {
      text = await file.text();
    }
    if (text.length > MAX_LOG) {
      $("sim-file-note").textContent = `${file.name}: ${(text.length / 1048576).toFixed(1)} MiB of text, over the 7 MiB the route takes; use \`sluice simulate --log\``;
      return;
    }
    $("sim-log").value = text;
    $("sim-file-note").textContent = `${file.name}: ${plural(text.split("\n").filter((l) => l).length, "line")}`;
  } catch (e) {
    $("sim-file-note").textContent = `${file.name}: cannot be read: ${e.message}`;
  }
}

async function simulate() {
  $("sim-error").textContent = "";
  let policies, traffic;
  try {
    policies = JSON.parse($("sim-policies").value);
  } catch (e) {
    $("sim-error").textContent = "policies: not JSON: " + e.message;
    return;
  }
  const log = $("sim-log").value;
  if (log.trim()) {
    traffic = { format: $("sim-format").value, log };
    const key = $("sim-key").value.trim();
    if (key) traffic.key = key;
  } else {
    try {
      traffic = JSON.parse($("sim-traffic").value);
    } catch (e) {
      $("sim-error").textContent = "traffic: not JSON: " + e.message;
      return;
    }
  }
  let report;
  try {
    report = await api("/v1/simulate", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ policies, traffic }),
    });
  } catch (e) {
    $("sim-error").textContent = e.message;
    return;
  }
  drawSimulation(report);
}

// How the log was read: format, key, lines read and skipped (by reason, the first few).
function drawLogRead(log) {
  const box = $("sim-read");
  box.replaceChildren();
  if (!log) return;
  const line = (text) => {
    const d = document.createElement("div");
    d.textContent = text;
    box.append(d);
  };
  line(
    `log: ${log.format}${log.detected ? " (detected)" : ""}, key ${log.key.join(",")}, time ${log.time_field}; ` +
      `${log.read} of ${plural(log.lines, "line")} read, ${log.skipped} skipped`,
  );
  for (const r of log.skip_reasons || []) line(`  skipped ${r.lines} × ${r.reason}`);
  for (const s of log.first_skipped || []) line(`  line ${s.line}: ${s.reason}`);
}

// One panel per policy on one scale, a bar per time bucket: admitted below, denied stacked
// on it (the CLI's --svg chart, simulate/render.rs).
function drawSimulation(report) {
  state.report = report;
  drawLogRead(report.log);
  const svg = $("sim-chart");
  const W = Math.max(300, svg.clientWidth || 900);
  const left = 44, right = 8, plotH = 90, title = 18, axis = 18, gap = 10;
  const panelH = title + plotH + axis + gap;
  const H = panelH * report.policies.length;
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("height", H);
  const peak = Math.max(1, ...report.policies.flatMap((p) => p.buckets.map((b) => b.admitted + b.denied)));
  const step = niceStep(peak, 2);
  const max = Math.max(step, Math.ceil(peak / step) * step);
  const n = Math.max(1, ...report.policies.map((p) => p.buckets.length));
  const barW = (W - left - right) / n;
  const tstep = timeStep(report.duration_ms || 1, Math.max(2, Math.floor((W - left) / 90)));
  const children = [];
  report.policies.forEach((p, k) => {
    const y0 = k * panelH;
    const base = y0 + title + plotH;
    const y = (v) => (v * plotH) / max;
    const g = el("g", { class: "policy", "data-policy": p.name });
    g.append(el("text", { x: left, y: y0 + 13, "font-weight": "bold" },
      `${p.name}: ${p.admitted} admitted, ${p.denied} denied (${percent(p.denied, p.admitted)}) · ${p.limits.join(", ")}`));
    for (let v = 0; v <= max + step / 2; v += step) {
      g.append(el("line", { class: "grid", x1: left, x2: W - right, y1: base - y(v), y2: base - y(v) }));
      g.append(el("text", { x: left - 4, y: base - y(v) + 4, "text-anchor": "end" }, +v.toPrecision(12) + ""));
    }
    let admitted = 0, denied = 0;
    p.buckets.forEach((b, j) => {
      const x = left + j * barW;
      const w = Math.max(0.5, barW - (barW > 3 ? 1 : 0));
      admitted += b.admitted;
      denied += b.denied;
      if (b.admitted) {
        g.append(el("rect", { class: "admitted", x: x.toFixed(2), y: (base - y(b.admitted)).toFixed(2), width: w.toFixed(2),
          height: y(b.admitted).toFixed(2), fill: PALETTE.admitted, "data-count": b.admitted }));
      }
      if (b.denied) {
        g.append(el("rect", { class: "denied", x: x.toFixed(2), y: (base - y(b.admitted + b.denied)).toFixed(2), width: w.toFixed(2),
          height: y(b.denied).toFixed(2), fill: PALETTE.denied, "data-count": b.denied }));
      }
    });
    g.setAttribute("data-admitted", admitted);
    g.setAttribute("data-denied", denied);
    g.append(el("line", { class: "axis", x1: left, x2: W - right, y1: base, y2: base }));
    const bucketX = (t) => left + (t / (report.bucket_ms || 1)) * barW;
    for (let t = 0; t <= (report.duration_ms || 0); t += tstep) {
      const anchor = t === 0 ? "start" : bucketX(t) > W - right - 30 ? "end" : "middle";
      g.append(el("text", { x: bucketX(t), y: base + 13, "text-anchor": anchor }, offset(t, report.duration_ms)));
    }
    children.push(g);
  });
  svg.replaceChildren(...children);
  svg.dataset.policies = report.policies.length.toString();
  const legend = $("sim-legend");
  legend.replaceChildren();
  for (const [key, text] of [["admitted", "admitted"], ["denied", "denied"]]) {
    const mark = document.createElement("span");
    mark.style.color = PALETTE[key];
    mark.textContent = `■ ${text} `;
    legend.append(mark);
  }
  legend.append(
    `per ${duration(report.bucket_ms)}, stacked, at the time from the first request; ${plural(report.events, "request")} over ${plural(report.keys, "key")}`,
  );
  const body = $("sim-summary").tBodies[0];
  body.replaceChildren();
  for (const p of report.policies) {
    const row = body.insertRow();
    row.dataset.policy = p.name;
    cell(row, p.name, "name");
    cell(row, p.limits.join(", "), "muted");
    cell(row, p.admitted.toString(), "n allowed");
    cell(row, p.denied.toString(), "n denied");
    cell(row, percent(p.denied, p.admitted), "n");
    cell(row, duration(p.first_denial_ms), "n");
    cell(row, p.retry_after_ms ? `${duration(p.retry_after_ms.p50)} / ${duration(p.retry_after_ms.p99)}` : "—", "n");
  }
}

start();
