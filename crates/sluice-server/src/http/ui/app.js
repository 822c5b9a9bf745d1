// The Sluice dashboard: polls GET /v1/stats every second, GET /v1/policies and GET /v1/top
// every few seconds, and draws what it gets. No framework, no network access beyond this
// server. The admin token (if the server has one) stays in this tab's sessionStorage.
"use strict";

const POLL_MS = 1000;
const HISTORY = 120; // samples kept for the chart: two minutes at one per second
const $ = (id) => document.getElementById(id);

const state = {
  previous: null, // the last /v1/stats reading
  history: [], // [{t, allowed, denied, degraded}] per second, for the chart's policy
  policies: [], // from /v1/policies
  names: [], // every name /v1/stats counts (policies and Envoy rules)
};

$("token").value = sessionStorage.getItem("sluice-token") || "";
$("token").addEventListener("change", () => {
  sessionStorage.setItem("sluice-token", $("token").value.trim());
  refreshSlow();
});
$("chart-policy").addEventListener("change", () => {
  state.history = [];
  state.previous = null;
});
$("top-policy").addEventListener("change", refreshTop);
$("top-by").addEventListener("change", refreshTop);

async function api(path, options = {}) {
  const headers = { ...(options.headers || {}) };
  const token = $("token").value.trim();
  if (token) headers.authorization = "Bearer " + token;
  const response = await fetch(path, { ...options, headers });
  if (response.status === 401) {
    notice("This server needs an admin token: paste one of its admin tokens above.");
    throw new Error("unauthorized");
  }
  if (response.status === 204) return null;
  const body = await response.json();
  if (!response.ok) {
    throw new Error((body.error && body.error.message) || response.statusText);
  }
  return body;
}

function notice(text) {
  const n = $("notice");
  n.textContent = text || "";
  n.style.display = text ? "block" : "none";
}

function cell(row, text, className) {
  const td = row.insertCell();
  td.textContent = text;
  if (className) td.className = className;
  return td;
}

// "1 key", "2 keys".
function plural(n, word) {
  return `${n} ${word}${n === 1 ? "" : "s"}`;
}

function rate(x) {
  return x < 10 ? x.toFixed(1) : Math.round(x).toString();
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

function fillSelect(select, names, keepFirst) {
  const current = select.value;
  const fixed = keepFirst ? [select.options[0]] : [];
  const wanted = names.join("\n");
  if (select.dataset.names === wanted) return;
  select.dataset.names = wanted;
  select.replaceChildren(...fixed);
  for (const name of names) select.add(new Option(name, name));
  if ([...select.options].some((o) => o.value === current)) select.value = current;
}

async function refreshStats() {
  let stats;
  try {
    stats = await api("/v1/stats");
  } catch (e) {
    $("status").textContent = "not connected: " + e.message;
    return;
  }
  notice("");
  const names = Object.keys(stats.policies).sort();
  state.names = names;
  const configured = state.policies.map((p) => p.name);
  fillSelect($("chart-policy"), [...new Set([...configured, ...names])].sort(), true);
  fillSelect($("top-policy"), [...new Set([...configured, ...names])].sort(), false);
  const chartPolicy = $("chart-policy").value;
  const sum = (reading) => {
    const out = { allowed: 0, denied: 0, degraded: 0 };
    for (const [name, c] of Object.entries(reading.policies)) {
      if (chartPolicy && name !== chartPolicy) continue;
      out.allowed += c.allowed;
      out.denied += c.denied;
      out.degraded += c.degraded + c.errors;
    }
    return out;
  };
  const prev = state.previous;
  if (prev) {
    const dt = Math.max(1, stats.now_ms - prev.now_ms) / 1000;
    const a = sum(stats), b = sum(prev);
    state.history.push({
      t: stats.now_ms,
      allowed: (a.allowed - b.allowed) / dt,
      denied: (a.denied - b.denied) / dt,
      degraded: (a.degraded - b.degraded) / dt,
    });
    if (state.history.length > HISTORY) state.history.shift();
    drawPolicies(stats, prev, dt);
  }
  state.previous = stats;
  drawChart();
  drawStore(stats);
  $("status").textContent =
    `${stats.store.kind} store · configuration generation ${stats.config.generation}` +
    (stats.config.last_reload_error ? " · last reload FAILED" : "");
}

function drawPolicies(stats, prev, dt) {
  const body = $("policies").tBodies[0];
  body.replaceChildren();
  const byName = Object.fromEntries(state.policies.map((p) => [p.name, p]));
  const names = [...new Set([...Object.keys(byName), ...Object.keys(stats.policies)])].sort();
  for (const name of names) {
    const now = stats.policies[name] || { allowed: 0, denied: 0, degraded: 0, errors: 0 };
    const was = prev.policies[name] || { allowed: 0, denied: 0, degraded: 0, errors: 0 };
    const row = body.insertRow();
    row.dataset.policy = name;
    cell(row, name);
    cell(row, byName[name] ? limitsText(byName[name]) : "Envoy rule", "muted");
    cell(row, rate((now.allowed - was.allowed) / dt), "n allowed");
    cell(row, rate((now.denied - was.denied) / dt), "n denied");
    cell(row, rate((now.degraded + now.errors - was.degraded - was.errors) / dt), "n degraded");
    cell(row, (now.allowed + now.denied + now.degraded + now.errors).toString(), "n");
  }
}

function drawChart() {
  const svg = $("chart");
  const W = 600, H = 180, pad = 24;
  const points = state.history;
  const max = Math.max(1, ...points.map((p) => Math.max(p.allowed, p.denied, p.degraded)));
  // The newest sample at the right edge, older ones to its left.
  const x = (i) => W - 4 - ((points.length - 1 - i) * (W - pad - 4)) / (HISTORY - 1);
  const y = (v) => H - pad - (v * (H - 2 * pad)) / max;
  const path = (key) =>
    points.map((p, i) => `${i ? "L" : "M"}${x(i).toFixed(1)},${y(p[key]).toFixed(1)}`).join("");
  const ns = "http://www.w3.org/2000/svg";
  const el = (name, attrs, text) => {
    const e = document.createElementNS(ns, name);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  };
  const children = [];
  for (const f of [0, 0.5, 1]) {
    children.push(el("line", { class: "grid", x1: pad, x2: W - 4, y1: y(max * f), y2: y(max * f) }));
    children.push(el("text", { x: 2, y: y(max * f) + 3 }, rate(max * f)));
  }
  children.push(el("text", { x: pad, y: H - 6 }, "−2 min"));
  children.push(el("text", { x: W - 30, y: H - 6 }, "now"));
  for (const [key, color] of [["allowed", "--allowed"], ["denied", "--denied"], ["degraded", "--degraded"]]) {
    if (points.length > 1) {
      children.push(el("path", {
        d: path(key), fill: "none", "stroke-width": 2,
        stroke: getComputedStyle(document.documentElement).getPropertyValue(color),
        "data-series": key,
      }));
    }
  }
  svg.replaceChildren(...children);
  const last = points[points.length - 1];
  svg.dataset.points = points.length.toString();
  svg.dataset.lastAllowed = last ? last.allowed.toFixed(2) : "0";
  svg.dataset.lastDenied = last ? last.denied.toFixed(2) : "0";
  $("chart-now").textContent = last
    ? `now: ${rate(last.allowed)} allowed/s, ${rate(last.denied)} denied/s`
    : "";
}

function drawStore(stats) {
  $("store-kind").textContent =
    stats.store.kind === "memory" ? `in this process: ${plural(stats.store.keys, "key")}` : stats.store.kind;
  const body = $("shards").tBodies[0];
  body.replaceChildren();
  for (const s of stats.store.shards) {
    const row = body.insertRow();
    cell(row, s.name);
    cell(row, s.circuit || "—", s.circuit && s.circuit !== "closed" ? "denied" : "allowed");
    cell(row, s.ok ? s.latency_ms.toFixed(2) : "—", "n");
    cell(row, s.ok ? "" : s.error, "error");
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

async function refreshTop() {
  const policy = $("top-policy").value;
  const body = $("top").tBodies[0];
  if (!policy) return;
  let top;
  try {
    top = await api(`/v1/top?policy=${encodeURIComponent(policy)}&by=${$("top-by").value}&limit=20`);
  } catch (e) {
    $("top-note").textContent = e.message;
    return;
  }
  const configured = state.policies.some((p) => p.name === policy);
  body.replaceChildren();
  for (const k of top.keys) {
    const row = body.insertRow();
    row.dataset.key = k.key;
    cell(row, k.key);
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
  const since = new Date(top.since_ms).toLocaleTimeString();
  $("top-note").textContent = `${top.total} ${top.by === "used" ? "units used" : "denials"} since ${since} in this process; counts over-estimate by at most ± error`;
}

async function refreshSlow() {
  try {
    const p = await api("/v1/policies");
    state.policies = p.policies;
  } catch (e) {
    return;
  }
  await refreshTop();
}

// ----- the playground: POST /v1/simulate, drawn -------------------------------------------

const PALETTE = ["#1565c0", "#8e24aa", "#00838f", "#6d4c41", "#558b2f", "#ad1457"];

$("sim-run").addEventListener("click", simulate);

function seconds(ms) {
  return ms === null || ms === undefined ? "—" : (ms / 1000).toFixed(ms % 1000 ? 1 : 0) + " s";
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
  const log = $("sim-log").value.trim();
  if (log) {
    traffic = { format: $("sim-format").value, log };
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

function drawSimulation(report) {
  const svg = $("sim-chart");
  const W = 900, H = 200, pad = 28;
  const n = Math.max(1, ...report.policies.map((p) => p.buckets.length));
  const max = Math.max(1, ...report.policies.flatMap((p) => p.buckets.map((b) => Math.max(b.admitted, b.denied))));
  const x = (i) => pad + (i * (W - pad - 4)) / Math.max(1, n - 1);
  const y = (v) => H - pad - (v * (H - 2 * pad)) / max;
  const ns = "http://www.w3.org/2000/svg";
  const el = (name, attrs, text) => {
    const e = document.createElementNS(ns, name);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  };
  const children = [];
  for (const f of [0, 0.5, 1]) {
    children.push(el("line", { class: "grid", x1: pad, x2: W - 4, y1: y(max * f), y2: y(max * f) }));
    children.push(el("text", { x: 2, y: y(max * f) + 3 }, Math.round(max * f).toString()));
  }
  children.push(el("text", { x: pad, y: H - 6 }, "0 s"));
  children.push(el("text", { x: W - 60, y: H - 6 }, seconds(report.duration_ms)));
  const legend = [];
  report.policies.forEach((p, k) => {
    const color = PALETTE[k % PALETTE.length];
    const line = (key, dash) =>
      el("path", {
        d: p.buckets.map((b, i) => `${i ? "L" : "M"}${x(i).toFixed(1)},${y(b[key]).toFixed(1)}`).join(""),
        fill: "none", stroke: color, "stroke-width": 2, "stroke-dasharray": dash,
        "data-policy": p.name, "data-series": key,
      });
    children.push(line("admitted", "none"), line("denied", "4 3"));
    const mark = document.createElement("span");
    mark.style.color = color;
    mark.textContent = `■ ${p.name} `;
    legend.push(mark);
  });
  svg.replaceChildren(...children);
  svg.dataset.policies = report.policies.length.toString();
  $("sim-legend").replaceChildren(
    ...legend,
    `— solid: admitted, dashed: denied, per ${seconds(report.bucket_ms)}; ${plural(report.events, "request")} over ${plural(report.keys, "key")}`,
  );
  const body = $("sim-summary").tBodies[0];
  body.replaceChildren();
  for (const p of report.policies) {
    const row = body.insertRow();
    row.dataset.policy = p.name;
    cell(row, p.name);
    cell(row, p.limits.join(", "), "muted");
    cell(row, p.admitted.toString(), "n allowed");
    cell(row, p.denied.toString(), "n denied");
    cell(row, seconds(p.first_denial_ms), "n");
    cell(row, p.retry_after_ms ? `${seconds(p.retry_after_ms.p50)} / ${seconds(p.retry_after_ms.p99)}` : "—", "n");
  }
}

refreshSlow();
refreshStats();
setInterval(refreshStats, POLL_MS);
setInterval(refreshSlow, 3 * POLL_MS);
