// The dashboard (/ui) in headless Chromium, against a live `sluice serve` on the memory store
// with an admin token, three policies and an Envoy rule with `detailed_metric: true`:
//
// - without a token the page asks for one and then sends nothing (no request, no console
//   error) for five polling periods of a fake page clock, and polls again once given one;
// - with it: no console error and no failed request; the live chart moves when load is
//   applied, its ticks are 1, 2 or 5 × 10^n; a reloaded page has a full chart from the
//   server's history before its second poll;
// - names sort numerically (`tier2` before `tier10`);
// - the Envoy rule, driven with 300 keys over gRPC by `sluice bench`, is one folded entry
//   (one option in the selects), its keys shown as descriptor entries, never counter keys;
// - the layout: at 1024, 1280×800, 1920×1080 and 2560 px wide no element leaves its card, no
//   card overlaps another, the page does not scroll sideways, and tables wider than their
//   card scroll inside it (screenshots of the two main sizes with SLUICE_UI_SCREENSHOT_DIR);
// - the top keys table lists a key driven over its limit with 0 remaining; reset gives it
//   back its quota (checked through the API);
// - the playground draws stacked bars per policy whose counts add up to its totals and to the
//   traffic; its format select offers the simulator's nine formats and auto; an uploaded
//   gzip log is read with the key fields given; a policy that is not JSON is named.
//
// Every failed check is reported (the run goes on where it can) and fails the run.
// SLUICE_UI_PAGE_DIR=dir serves /ui and /ui/app.js from dir instead of the binary (to run
// these checks against another version of the page). Run by scripts/ui-test.
"use strict";

const { spawn, execFile } = require("node:child_process");
const fs = require("node:fs");
const os = require("node:os");
const path = require("node:path");
const zlib = require("node:zlib");
const crypto = require("node:crypto");
const { chromium } = require("playwright-core");

const TOKEN = crypto.randomBytes(16).toString("hex");
const POLL_MS = 1000;
const RULE_KEYS = 300;
const deadline = (ms) => Date.now() + ms;
const failures = [];

class Failed extends Error {}

function fail(message) {
  throw new Failed(message);
}

// A named check: its failure is recorded and the run goes on.
async function check(name, body) {
  try {
    await body();
    console.log(`ui-test: ok: ${name}`);
  } catch (e) {
    const text = e instanceof Failed ? e.message : e && e.stack ? e.stack : String(e);
    console.error(`ui-test: FAILED: ${name}: ${text}`);
    failures.push(name);
  }
}

async function until(what, timeoutMs, probe) {
  const end = deadline(timeoutMs);
  let last;
  for (;;) {
    last = await probe();
    if (last) return last;
    if (Date.now() > end) fail(`${what} (waited ${timeoutMs} ms)`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

async function startServer() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "sluice-ui-"));
  fs.writeFileSync(path.join(dir, "tokens"), TOKEN + "\n");
  fs.mkdirSync(path.join(dir, "rules"));
  fs.writeFileSync(
    path.join(dir, "rules", "bench.yaml"),
    [
      "domain: bench",
      "descriptors:",
      "  - key: remote_address",
      "    detailed_metric: true",
      "    rate_limit: { unit: hour, requests_per_unit: 4 }",
      "",
    ].join("\n"),
  );
  fs.writeFileSync(
    path.join(dir, "sluice.yaml"),
    [
      "listen:",
      "  http: 127.0.0.1:0",
      "  grpc: 127.0.0.1:0",
      "admin:",
      "  tokens_file: tokens",
      "rls:",
      "  config_dir: rules",
      "policies:",
      "  api:",
      "    limits:",
      "      - { max: 5, per: 1h }",
      "  search:",
      "    limits:",
      "      - { max: 100, per: 1m, algorithm: sliding_window, precision: 1s }",
      "  tier10:",
      "    limits:",
      "      - { max: 10, per: 1m }",
      "  tier2:",
      "    limits:",
      "      - { max: 2, per: 1m }",
      "",
    ].join("\n"),
  );
  const log = [];
  const server = spawn(
    process.env.SLUICE_BIN,
    ["--log-format", "json", "serve", "--config", path.join(dir, "sluice.yaml")],
    { stdio: ["ignore", "ignore", "pipe"] },
  );
  server.stderr.on("data", (d) => log.push(d.toString()));
  const addresses = await until("sluice serve reports its HTTP and gRPC addresses", 30000, async () => {
    if (server.exitCode !== null) fail("sluice serve exited:\n" + log.join(""));
    const found = {};
    for (const line of log.join("").split("\n")) {
      try {
        const fields = JSON.parse(line).fields || {};
        if (fields.http && fields.message === "sluice serving") found.http = "http://" + fields.http;
        if (fields.grpc) found.grpc = "http://" + fields.grpc;
      } catch (_) {
        // not a whole JSON line yet
      }
    }
    return found.http && found.grpc ? found : null;
  });
  return { server, base: addresses.http, grpc: addresses.grpc, log, dir };
}

async function api(base, method, route, body, token) {
  const headers = { "content-type": "application/json" };
  if (token) headers.authorization = "Bearer " + token;
  const r = await fetch(base + route, { method, headers, body: body && JSON.stringify(body) });
  const text = await r.text();
  return { status: r.status, body: text ? JSON.parse(text) : null };
}

// `sluice bench` over gRPC: `requests` ShouldRateLimit calls on domain bench, spread over
// RULE_KEYS keys (bench:0 …).
function benchGrpc(grpc, requests) {
  return new Promise((resolve, reject) => {
    execFile(
      process.env.SLUICE_BIN,
      ["bench", "--target", "grpc", "--grpc", grpc, "--domain", "bench", "--descriptor-key", "remote_address",
        "--keys", `uniform:${RULE_KEYS}`, "--requests", String(requests), "--concurrency", "4", "--json"],
      { timeout: 60000 },
      (error, stdout, stderr) => (error ? reject(new Error(`sluice bench: ${error.message}\n${stderr}`)) : resolve(stdout)),
    );
  });
}

// Serves the page from SLUICE_UI_PAGE_DIR when set.
async function pageSource(context) {
  const dir = process.env.SLUICE_UI_PAGE_DIR;
  if (!dir) return;
  await context.route(/\/ui(\/app\.js)?$/, (route) => {
    const js = route.request().url().endsWith("app.js");
    route.fulfill({
      status: 200,
      contentType: js ? "text/javascript" : "text/html",
      body: fs.readFileSync(path.join(dir, js ? "app.js" : "index.html")),
    });
  });
}

// Whatever the page shows that is wrong: console errors, page errors, failed requests,
// statuses >= 400 (401 before the token is given is the page asking for it).
function watch(page, tokenGiven, reloading) {
  const problems = [];
  page.on("console", (m) => {
    const asking = !tokenGiven() && m.text().includes("status of 401");
    if (m.type() === "error" && !asking) problems.push("console error: " + m.text());
  });
  page.on("pageerror", (e) => problems.push("page error: " + e.message));
  page.on("requestfailed", (r) => {
    // A reload aborts what the page had in flight.
    if (!(reloading() && r.failure().errorText === "net::ERR_ABORTED")) problems.push("request failed: " + r.url());
  });
  page.on("response", (r) => {
    if (r.status() >= 400 && (tokenGiven() || r.status() !== 401)) problems.push(`${r.status()} ${r.url()}`);
  });
  return problems;
}

// Measured in the page: every visible element of every card inside its card (or inside the
// scroll container it is in, which is itself inside the card), no block whose content spills
// out of it, tables scrolling inside a container when wider than the card, no two cards
// overlapping, and no sideways scroll of the page.
function overflowProblems() {
  const bad = [];
  const root = document.documentElement;
  if (root.scrollWidth > root.clientWidth + 1) bad.push(`the page scrolls sideways: ${root.scrollWidth} > ${root.clientWidth} px`);
  const scrolls = (e) => ["auto", "scroll"].includes(getComputedStyle(e).overflowX);
  const shown = (e) => {
    if (!e.checkVisibility()) return false; // in a closed <details>, say
    const r = e.getBoundingClientRect();
    return r.width > 0 && r.height > 0;
  };
  const cards = [...document.querySelectorAll("main > section")].filter(shown);
  const label = (card) => card.id || (card.querySelector("h2") || card).textContent.trim().split(/\s+/).slice(0, 3).join(" ");
  const describe = (e) => e.tagName.toLowerCase() + (e.id ? "#" + e.id : "") + (e.className && typeof e.className === "string" ? "." + e.className.split(" ")[0] : "");
  for (const card of cards) {
    const c = card.getBoundingClientRect();
    if (c.right > root.clientWidth + 1) bad.push(`${label(card)}: the card ends at ${Math.round(c.right)} px, past the page's ${root.clientWidth}`);
    for (const e of card.querySelectorAll("*")) {
      if (!shown(e)) continue;
      let inScroll = false;
      for (let p = e.parentElement; p && p !== card; p = p.parentElement) if (scrolls(p)) inScroll = true;
      if (inScroll) continue;
      const r = e.getBoundingClientRect();
      if (r.left < c.left - 1 || r.right > c.right + 1 || r.top < c.top - 1 || r.bottom > c.bottom + 1) {
        bad.push(`${label(card)}: ${describe(e)} [${Math.round(r.left)}–${Math.round(r.right)}] leaves the card [${Math.round(c.left)}–${Math.round(c.right)}]`);
        continue;
      }
      const style = getComputedStyle(e);
      if (e instanceof HTMLElement && !scrolls(e) && style.display !== "inline" && !(e instanceof HTMLTableElement) &&
          e.scrollWidth > e.clientWidth + 1 && e.clientWidth > 0) {
        bad.push(`${label(card)}: ${describe(e)}'s content is ${e.scrollWidth} px wide in ${e.clientWidth}`);
      }
    }
    for (const t of card.querySelectorAll("table")) {
      if (!shown(t)) continue;
      let p = t.parentElement;
      while (p !== card && !scrolls(p)) p = p.parentElement;
      if (p === card && t.getBoundingClientRect().width > card.clientWidth + 1) bad.push(`${label(card)}: table#${t.id} is wider than its card and does not scroll`);
    }
  }
  for (let i = 0; i < cards.length; i++) {
    for (let j = i + 1; j < cards.length; j++) {
      const a = cards[i].getBoundingClientRect(), b = cards[j].getBoundingClientRect();
      const w = Math.min(a.right, b.right) - Math.max(a.left, b.left);
      const h = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top);
      if (w > 1 && h > 1) bad.push(`${label(cards[i])} and ${label(cards[j])} overlap`);
    }
  }
  return bad.slice(0, 12);
}

// Without a token: the page asks, then sends nothing for five polling periods of its (fake)
// clock; given the token, it polls again.
async function noTokenNoPolling(context, base) {
  const page = await context.newPage();
  await page.clock.install();
  const requests = [];
  const errors = [];
  page.on("request", (r) => requests.push(r.url()));
  page.on("console", (m) => m.type() === "error" && errors.push(m.text()));
  await page.goto(base + "/ui");
  await until("the page asks for the admin token", 10000, async () =>
    (await page.locator("#notice").textContent()).includes("admin token"),
  );
  const [r0, e0] = [requests.length, errors.length];
  await page.clock.runFor(5 * POLL_MS);
  await page.evaluate(() => new Promise((r) => setTimeout(r, 0)));
  const sent = requests.slice(r0);
  if (sent.length) fail(`without a token the page sent ${sent.length} requests in five polling periods: ${sent.slice(0, 3).join(", ")}`);
  if (errors.length > e0) fail(`without a token the page logged: ${errors.slice(e0).join("; ")}`);
  await page.fill("#token", TOKEN);
  await page.dispatchEvent("#token", "change");
  await page.clock.runFor(3 * POLL_MS);
  await until("given the token, the page polls /v1/stats again", 10000, async () =>
    requests.slice(r0).filter((u) => u.includes("/v1/stats")).length >= 2,
  );
  await page.close();
}

async function layoutAt(page, width, height, screenshot) {
  await page.setViewportSize({ width, height });
  // The resize event has redrawn the charts at the new width once two frames are drawn.
  await page.evaluate(() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r))));
  const bad = await page.evaluate(overflowProblems);
  if (screenshot && process.env.SLUICE_UI_SCREENSHOT_DIR) {
    await page.screenshot({ path: path.join(process.env.SLUICE_UI_SCREENSHOT_DIR, screenshot), fullPage: true });
  }
  if (bad.length) fail(`at ${width}×${height}:\n    ` + bad.join("\n    "));
}

function isNiceStep(step) {
  const power = 10 ** Math.floor(Math.log10(step));
  return [1, 2, 5].some((m) => Math.abs(step / power - m) < 1e-9);
}

async function chartChecks(page) {
  const ticks = (await page.locator("#chart").getAttribute("data-ticks")).split(",").map(Number);
  const step = ticks[1] - ticks[0];
  if (ticks[0] !== 0 || !isNiceStep(step) || ticks.some((t, i) => Math.abs(t - i * step) > 1e-9)) {
    fail(`the chart's ticks ${ticks.join(", ")} are not 0 and steps of 1, 2 or 5 × 10^n`);
  }
  const labels = await page.locator("#chart text.xtick").allTextContents();
  if (labels.length < 2 || !labels.every((l) => /^\d\d:\d\d(:\d\d)?( [AP]M)?$/.test(l))) {
    fail(`the time axis labels are ${JSON.stringify(labels)}`);
  }
}

async function main() {
  const { server, base, grpc, log, dir } = await startServer();
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM,
    args: ["--no-sandbox", "--disable-gpu"],
  });
  try {
    const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
    await pageSource(context);
    await check("without a token: no polling, no console error; polling once given one", () =>
      noTokenNoPolling(context, base),
    );

    const page = await context.newPage();
    let tokenGiven = false;
    let reloading = false;
    const problems = watch(page, () => tokenGiven, () => reloading);
    await page.goto(base + "/ui");
    await until("the page asks for the admin token", 10000, async () =>
      (await page.locator("#notice").textContent()).includes("admin token"),
    );
    tokenGiven = true;
    await page.fill("#token", TOKEN);
    await page.dispatchEvent("#token", "change");
    await until("the status shows the memory store", 10000, async () =>
      (await page.locator("#status").textContent()).includes("memory store"),
    );

    // Load: "hot" over its limit of 5, others within theirs; the Envoy rule with 300 keys.
    const rule = benchGrpc(grpc, 1500).catch((e) => problems.push(e.message));
    const load = (async () => {
      const end = deadline(4000);
      let i = 0;
      while (Date.now() < end) {
        await api(base, "POST", "/v1/check", { policy: "api", key: "hot" });
        await api(base, "POST", "/v1/check", { policy: "search", key: "user:" + (i++ % 7) });
        await api(base, "POST", "/v1/check", { policy: "tier2", key: "user:" + (i % 3) });
        await new Promise((r) => setTimeout(r, 20));
      }
    })().catch((e) => problems.push("load: " + e.message));
    await check("the live chart moves with denials, nice ticks, a time axis", async () => {
      await until("the live chart shows denials", 15000, async () => {
        const denied = Number(await page.locator("#chart").getAttribute("data-last-denied"));
        const allowed = Number(await page.locator("#chart").getAttribute("data-last-allowed"));
        const points = Number(await page.locator("#chart").getAttribute("data-points"));
        return denied > 0 && allowed > 0 && points >= 2;
      });
      const paths = await page.locator("#chart path").count();
      if (paths < 3) fail(`the chart draws ${paths} series, expected 3`);
      await chartChecks(page);
      const now = await page.locator("#chart-now").textContent();
      if (!/% denied/.test(now)) fail(`the chart's caption gives no denial %: ${now}`);
    });
    await load;
    await rule;

    await check("the policies table: limits, denial %, numeric order", async () => {
      const apiRow = page.locator('#policies tr[data-policy="api"]');
      if (!(await apiRow.textContent()).includes("5/3600s")) fail("the api row does not show its limit");
      const order = await page.locator("#policies tbody tr").evaluateAll((rows) => rows.map((r) => r.dataset.policy));
      const at = (n) => order.indexOf(n);
      if (!(at("tier2") >= 0 && at("tier2") < at("tier10"))) fail(`policies in the order ${order.slice(0, 8).join(", ")}…: tier2 should come before tier10`);
      const header = await page.locator("#policies thead").textContent();
      if (!header.includes("denied %")) fail("no denied % column");
      const options = await page.locator("#chart-policy option").evaluateAll((o) => o.map((x) => x.value));
      if (!(options.indexOf("tier2") < options.indexOf("tier10"))) fail(`chart select order: ${options.join(", ")}`);
    });

    await check("the Envoy rule is one folded entry with its keys as descriptor entries", async () => {
      await until("the Envoy rule is listed", 10000, async () => (await page.locator("#rules [data-rule]").count()) >= 1);
      const rules = await page.locator("#rules [data-rule]").count();
      if (rules !== 1) fail(`${rules} rule entries for one rule`);
      const d = page.locator("#rules details.rule").first();
      if (await d.evaluate((e) => e.open)) fail("the rule's keys are not folded");
      // The bench drew its keys at random among 300: the server says how many it saw.
      const stats = await api(base, "GET", "/v1/stats", null, TOKEN);
      const served = (stats.body.rules || []).find((r) => r.domain === "bench") || {};
      if (!(served.keys_total > 200)) fail(`the server counts ${served.keys_total} detailed keys`);
      let summary;
      await until("the rule's line says how many detailed keys it has", 5000, async () => {
        summary = await d.locator("summary span").allTextContents();
        return summary[0] === "remote_address" && summary[summary.length - 1] === String(served.keys_total);
      }).catch((e) => fail(`${e.message}: the rule's line is ${JSON.stringify(summary)}, expected remote_address … ${served.keys_total}`));
      const domain = await page.locator("#rules .domain").allTextContents();
      if (domain.join() !== "domain bench") fail(`domains: ${domain.join(", ")}`);
      await d.locator("summary").click();
      const keys = await d.locator("tbody tr").evaluateAll((rows) => rows.map((r) => r.dataset.entries));
      if (keys.length < 1 || keys.length > 20) fail(`${keys.length} detailed keys shown unfolded`);
      const wrong = keys.filter((k) => !/^remote_address = bench:\d+$/.test(k));
      if (wrong.length) fail(`keys not shown as descriptor entries: ${wrong.slice(0, 3).join("; ")}`);
      for (const id of ["#chart-policy", "#top-policy"]) {
        const options = await page.locator(`${id} option`).allTextContents();
        const ruleOptions = options.filter((o) => o.includes("bench"));
        if (ruleOptions.length !== 1) fail(`${id} has ${ruleOptions.length} options for the rule: ${ruleOptions.slice(0, 3).join(", ")}`);
      }
      const height = await page.evaluate(() => document.documentElement.scrollHeight);
      if (height > 4000) fail(`the page is ${height} px tall`);
      await page.selectOption("#top-policy", { label: (await page.locator("#top-policy option", { hasText: "bench" }).textContent()) });
      await page.selectOption("#top-by", "used");
      await until("the rule's top keys are listed", 10000, async () => (await page.locator("#top tbody tr").count()) > 0);
      const shown = await page.locator("#top tbody td.name").allTextContents();
      const internal = shown.filter((k) => !/^remote_address = bench:\d+$/.test(k));
      if (internal.length) fail(`top keys show internal keys: ${internal.slice(0, 3).join("; ")}`);
    });

    await check("the top keys table lists the limited key; reset gives its quota back", async () => {
      await page.selectOption("#top-policy", "api");
      await page.selectOption("#top-by", "denied");
      const hot = page.locator('#top tr[data-key="hot"]');
      await until("the top keys table lists hot", 10000, async () => (await hot.count()) === 1);
      const cells = await hot.locator("td").allTextContents();
      if (Number(cells[1]) < 1) fail(`hot's denial count is ${cells[1]}`);
      if (cells[3] !== "0") fail(`hot's remaining is ${cells[3]}, expected 0`);
      await hot.locator("button").click();
      let last = null;
      await until("reset gives hot its quota back", 10000, async () => {
        last = await api(base, "POST", "/v1/peek", { policy: "api", key: "hot", cost: 0 }, null);
        return last.status === 200 && last.body.remaining === 5;
      }).catch((e) => fail(`${e.message}: last peek ${JSON.stringify(last)}`));
    });

    await check("a reloaded page has the chart full from the server's history", async () => {
      reloading = true;
      await page.reload();
      reloading = false;
      // The first poll gives no rate (it needs two readings); points before the second are
      // the history's.
      await until("the chart has loaded its history", 10000, async () => (await page.locator("#chart").getAttribute("data-history")) !== null);
      const history = await page.locator("#chart").getAttribute("data-history");
      if (history === "none") fail("the server has no /v1/stats/history");
      // The chart shows the last 5 minutes: the history holds each second of them (zeros
      // before the server started), the denials driven above among them.
      const points = Number(await page.locator("#chart").getAttribute("data-points"));
      if (Number(history) < 300 || points < 300) fail(`the chart has ${points} points on load, ${history} from the history`);
      const denied = Number(await page.locator("#chart").getAttribute("data-history-denied"));
      if (!(denied > 0)) fail("the history on load has none of the denials driven before");
      const denials = await page.locator('#chart path[data-series="denied"]').count();
      if (!denials) fail("no denied line on load");
      await chartChecks(page);
    });

    await check("the playground draws stacked bars whose counts add up", async () => {
      await page.click("#sim-run");
      await until("the playground draws both policies", 15000, async () =>
        (await page.locator("#sim-chart").getAttribute("data-policies")) === "2",
      );
      const legend = await page.locator("#sim-legend").textContent();
      const events = Number((legend.match(/(\d+) requests/) || [])[1]);
      for (const name of ["current", "candidate"]) {
        const c = await page.locator(`#sim-summary tr[data-policy="${name}"] td`).allTextContents();
        const g = page.locator(`#sim-chart g[data-policy="${name}"]`);
        const bars = await g.locator("rect").evaluateAll((rs) =>
          rs.reduce((s, r) => ((s[r.getAttribute("class")] += Number(r.dataset.count)), s), { admitted: 0, denied: 0 }),
        );
        if (Number(c[2]) + Number(c[3]) !== events) fail(`${name}: ${c[2]} admitted + ${c[3]} denied is not the ${events} requests`);
        if (bars.admitted !== Number(c[2]) || bars.denied !== Number(c[3])) {
          fail(`${name}: the bars hold ${bars.admitted} admitted and ${bars.denied} denied, the table ${c[2]} and ${c[3]}`);
        }
        if (!bars.denied) fail(`${name}: no denied bar (the example is over its limits)`);
      }
      if (await page.locator("#sim-chart path").count()) fail("the playground still draws lines");
    });

    await check("the layout holds at 1024, 1280×800, 1920×1080 and 2560 px", async () => {
      // The rule's keys unfolded, the playground's chart drawn: everything at its widest.
      const rule = page.locator("#rules details.rule").first();
      if (!(await rule.evaluate((e) => e.open))) await rule.locator("summary").click();
      const bad = [];
      for (const [w, h, shot] of [[1280, 800, "dashboard-1280.png"], [1920, 1080, "dashboard-1920.png"], [1024, 768], [2560, 1440]]) {
        try {
          await layoutAt(page, w, h, shot);
        } catch (e) {
          bad.push(e.message);
        }
      }
      await page.setViewportSize({ width: 1280, height: 800 });
      if (bad.length) fail(bad.join("\n  "));
    });

    await check("the latency, reloads and RLQS panels show what /v1/stats gives, and hide without it", async () => {
      const stats = (await api(base, "GET", "/v1/stats", null, TOKEN)).body;
      for (const [field, card] of [["latency", "#latency-card"], ["reloads", "#reloads-card"], ["rlqs", "#rlqs-card"]]) {
        const hidden = await page.locator(card).evaluate((e) => e.hidden);
        if (hidden !== !(field in stats)) fail(`${card} is ${hidden ? "hidden" : "shown"} and /v1/stats ${field in stats ? "has" : "has no"} ${field}`);
      }
      if (stats.latency) {
        const rows = await page.locator("#latency tbody tr").evaluateAll((rs) => rs.map((r) => r.dataset.protocol));
        for (const protocol of Object.keys(stats.latency.decision)) {
          if (!rows.includes(protocol)) fail(`no latency row for ${protocol}: ${rows.join(", ")}`);
        }
      }
    });

    await check("the regions panel is hidden without a regions store and lists each region's lag and view age with one", async () => {
      const card = page.locator("#regions-card");
      if (!(await card.evaluate((e) => e.hidden))) fail("#regions-card is shown on the memory store");
      // What a regions store's /v1/stats adds (docs/api.md), over the live answer.
      const regions = [
        { name: "ap", reachable: true, lag_s: 0.012, view_age_s: 0.18, fallback: false },
        { name: "us", reachable: false, lag_s: 4.1, view_age_s: 4.2, fallback: true },
      ];
      const stats = /\/v1\/stats(\?.*)?$/;
      const add = async (route) => {
        const response = await route.fetch();
        const json = await response.json();
        json.regions = regions;
        json.store.region = "eu";
        await route.fulfill({ response, json });
      };
      await page.route(stats, add);
      let rows = [];
      try {
        await until("the regions panel lists ap and us", 10000, async () => {
          rows = await page.locator("#regions tbody tr").evaluateAll((rs) => rs.map((r) => [...r.cells].map((c) => c.textContent)));
          return rows.length === 2;
        });
      } finally {
        await page.unroute(stats, add);
      }
      const want = [
        ["ap", "reachable", "12.0", "180.0", "summed"],
        ["us", "unreachable", "4100.0", "4200.0", "stale: fallback"],
      ];
      if (JSON.stringify(rows) !== JSON.stringify(want)) fail(`regions rows ${JSON.stringify(rows)}, expected ${JSON.stringify(want)}`);
      const local = await page.locator("#regions-local").textContent();
      if (local !== "seen from eu") fail(`regions heading says "${local}"`);
      await until("the regions panel hides again", 10000, async () => card.evaluate((e) => e.hidden));
    });

    await check("the reloads panel lists a failed reload first, with its error", async () => {
      fs.writeFileSync(
        path.join(dir, "rules", "broken.yaml"),
        "domain: broken\ndescriptors:\n  - key: k\n    rate_limit: { unit: fortnight, requests_per_unit: 1 }\n",
      );
      server.kill("SIGHUP");
      let rows = [];
      await until("the reloads panel shows the failed reload", 15000, async () => {
        rows = await page.locator("#reloads tbody tr").evaluateAll((rs) => rs.map((r) => [...r.cells].map((c) => c.textContent)));
        return rows.length >= 2 && rows[0][3].includes("fortnight");
      }).catch((e) => fail(`${e.message}: ${JSON.stringify(rows)}`));
      const last = rows[rows.length - 1];
      if (last[2] !== "start" || last[3] !== "ok") fail(`the oldest reload is ${JSON.stringify(last)}, expected the start, ok`);
      if (!(await page.locator("#status").textContent()).includes("last reload FAILED")) fail("the status does not say the reload failed");
    });

    await check("the playground reads an uploaded gzip log with the key fields given", async () => {
      const formats = await page.locator("#sim-format option").evaluateAll((o) => o.map((x) => x.value));
      const want = ["auto", "nginx", "nginx_main", "apache_common", "apache_combined", "envoy", "istio", "envoy_json", "jsonl", "csv"];
      if (want.some((f) => !formats.includes(f)) || formats.length !== want.length) fail(`formats offered: ${formats.join(", ")}`);
      const lines = [];
      for (let i = 0; i < 40; i++) {
        const client = `203.0.113.${i % 2}`;
        const method = i % 4 === 0 ? "POST" : "GET";
        lines.push(`10.0.0.1 - - [01/Jan/2026:00:00:${String(i).padStart(2, "0")} +0000] "${method} /a HTTP/1.1" 200 5 "-" "curl/8" "${client}"`);
      }
      lines.push('10.0.0.1 - - [01/Jan/2026:00:01:00 +0000] "GET /a HT');
      await page.locator("#sim-log-box summary").click();
      await page.setInputFiles("#sim-file", { name: "access.log.gz", mimeType: "application/gzip", buffer: zlib.gzipSync(lines.join("\n") + "\n") });
      await until("the file is read into the log box", 5000, async () => (await page.locator("#sim-log").inputValue()).includes("203.0.113.1"));
      await page.selectOption("#sim-format", "nginx_main");
      await page.fill("#sim-key", "method,client");
      await page.fill("#sim-policies", '[{"name": "p", "limits": [{"max": 5, "per": "1h"}]}]');
      await page.click("#sim-run");
      await until("the playground reads the log", 15000, async () => (await page.locator("#sim-read").textContent()).includes("nginx_main"));
      const read = await page.locator("#sim-read").textContent();
      if (!read.includes("key method,client") || !read.includes("40 of 41 lines read, 1 skipped")) fail(`how the log was read: ${read}`);
      const c = await page.locator('#sim-summary tr[data-policy="p"] td').allTextContents();
      // Three keys: POST from .0 (10 lines), GET from .0 (10) and from .1 (20); 5 admitted each.
      if (Number(c[2]) !== 15 || Number(c[3]) !== 25) fail(`p admitted ${c[2]} and denied ${c[3]}, expected 15 and 25`);
      const legend = await page.locator("#sim-legend").textContent();
      if (!legend.includes("3 keys")) fail(`the legend: ${legend}`);
    });

    await check("the playground names a policy that is not JSON", async () => {
      await page.fill("#sim-policies", "[{name: current}");
      await page.click("#sim-run");
      await until("the playground names the bad input", 5000, async () =>
        (await page.locator("#sim-error").textContent()).includes("policies: not JSON"),
      );
    });

    await check("no console error, page error or failed request", async () => {
      if (problems.length) fail("the page had problems:\n  " + problems.join("\n  "));
    });
  } finally {
    await browser.close();
    server.kill("SIGTERM");
  }
  if (failures.length) {
    console.error(`ui-test: ${failures.length} check(s) failed: ${failures.join("; ")}`);
    console.error(log.join("").split("\n").slice(-10).join("\n"));
    process.exitCode = 1;
  } else {
    console.log("ui-test: the dashboard holds its layout, groups rules, charts history, and the playground draws");
  }
}

main().catch((e) => {
  console.error("ui-test: FAILED: " + (e && e.stack ? e.stack : e));
  process.exitCode = 1;
});
