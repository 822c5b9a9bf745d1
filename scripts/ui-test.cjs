// The dashboard (/ui) in headless Chromium, against a live `sluice serve` on the memory store
// with an admin token: the page loads with no console error and no failed request; it asks
// for the token and, once given it, shows the store; the live chart moves when load is
// applied; the top keys table lists a key driven over its limit, with 0 remaining; its reset
// button gives the key its quota back (checked through the API). Run by scripts/ui-test.
"use strict";

const { spawn } = require("node:child_process");
const fs = require("node:fs");
const os = require("node:os");
const path = require("node:path");
const crypto = require("node:crypto");
const { chromium } = require("playwright-core");

const TOKEN = crypto.randomBytes(16).toString("hex");
const deadline = (ms) => Date.now() + ms;

function fail(message) {
  console.error("ui-test: FAILED: " + message);
  process.exitCode = 1;
  throw new Error(message);
}

async function until(what, timeoutMs, probe) {
  const end = deadline(timeoutMs);
  for (;;) {
    const value = await probe();
    if (value) return value;
    if (Date.now() > end) fail(`${what} (waited ${timeoutMs} ms)`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

async function startServer() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "sluice-ui-"));
  fs.writeFileSync(path.join(dir, "tokens"), TOKEN + "\n");
  fs.writeFileSync(
    path.join(dir, "sluice.yaml"),
    [
      "listen:",
      "  http: 127.0.0.1:0",
      "  grpc: 127.0.0.1:0",
      "admin:",
      "  tokens_file: tokens",
      "policies:",
      "  api:",
      "    limits:",
      "      - { max: 5, per: 1h }",
      "  search:",
      "    limits:",
      "      - { max: 100, per: 1m, algorithm: sliding_window, precision: 1s }",
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
  const base = await until("sluice serve reports its HTTP address", 30000, async () => {
    if (server.exitCode !== null) fail("sluice serve exited:\n" + log.join(""));
    for (const line of log.join("").split("\n")) {
      try {
        const fields = JSON.parse(line).fields || {};
        if (fields.http && fields.message === "sluice serving") return "http://" + fields.http;
      } catch (_) {
        // not a whole JSON line yet
      }
    }
    return null;
  });
  return { server, base, log, dir };
}

async function api(base, method, route, body, token) {
  const headers = { "content-type": "application/json" };
  if (token) headers.authorization = "Bearer " + token;
  const r = await fetch(base + route, { method, headers, body: body && JSON.stringify(body) });
  const text = await r.text();
  return { status: r.status, body: text ? JSON.parse(text) : null };
}

async function main() {
  const { server, base, log } = await startServer();
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM,
    args: ["--no-sandbox", "--disable-gpu"],
  });
  const problems = [];
  try {
    const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
    let tokenGiven = false;
    page.on("console", (m) => {
      // Chromium logs every 401 as a console error; before the token is typed in, those are
      // the page finding out that it needs one.
      const asking = !tokenGiven && m.text().includes("status of 401");
      if (m.type() === "error" && !asking) problems.push("console error: " + m.text());
    });
    page.on("pageerror", (e) => problems.push("page error: " + e.message));
    page.on("requestfailed", (r) => problems.push("request failed: " + r.url()));
    page.on("response", (r) => {
      // Before the token is typed in, the admin routes answer 401: that is the page asking
      // for it, not a problem. Anything else that is not 2xx is.
      if (r.status() >= 400 && (tokenGiven || r.status() !== 401)) {
        problems.push(`${r.status()} ${r.url()}`);
      }
    });

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

    // Load: "hot" over its limit of 5, and others within theirs, for a few seconds.
    const load = (async () => {
      const end = deadline(4000);
      let i = 0;
      while (Date.now() < end) {
        await api(base, "POST", "/v1/check", { policy: "api", key: "hot" });
        await api(base, "POST", "/v1/check", { policy: "search", key: "user:" + (i++ % 7) });
        await new Promise((r) => setTimeout(r, 20));
      }
    })().catch((e) => problems.push("load: " + e.message));
    await until("the live chart shows denials", 15000, async () => {
      const denied = Number(await page.locator("#chart").getAttribute("data-last-denied"));
      const allowed = Number(await page.locator("#chart").getAttribute("data-last-allowed"));
      const points = Number(await page.locator("#chart").getAttribute("data-points"));
      return denied > 0 && allowed > 0 && points >= 2;
    });
    const paths = await page.locator("#chart path").count();
    if (paths < 3) fail(`the chart draws ${paths} series, expected 3`);
    await load;

    // The policies table has a row per policy with its limits.
    const apiRow = page.locator('#policies tr[data-policy="api"]');
    if (!(await apiRow.textContent()).includes("5/3600s")) fail("the api row does not show its limit");

    // Top keys: "hot" is listed first by denials, with nothing left.
    await page.selectOption("#top-policy", "api");
    await page.selectOption("#top-by", "denied");
    const hot = page.locator('#top tr[data-key="hot"]');
    await until("the top keys table lists hot", 10000, async () => (await hot.count()) === 1);
    const cells = await hot.locator("td").allTextContents();
    if (Number(cells[1]) < 1) fail(`hot's denial count is ${cells[1]}`);
    if (cells[3] !== "0") fail(`hot's remaining is ${cells[3]}, expected 0`);

    // Reset gives hot its quota back.
    await hot.locator("button").click();
    let last = null;
    try {
      await until("reset gives hot its quota back", 10000, async () => {
        last = await api(base, "POST", "/v1/peek", { policy: "api", key: "hot", cost: 0 }, null);
        return last.status === 200 && last.body.remaining === 5;
      });
    } catch (e) {
      fail(`${e.message}: last peek ${JSON.stringify(last)}; note: ${await page.locator("#top-note").textContent()}; ${problems.join("; ")}`);
    }

    // The playground: the page's own example (two policies, generated traffic) is drawn, and
    // every request of the traffic is either admitted or denied under each policy.
    await page.click("#sim-run");
    await until("the playground draws both policies", 15000, async () =>
      (await page.locator("#sim-chart").getAttribute("data-policies")) === "2",
    );
    const rows = await page.locator("#sim-summary tbody tr").count();
    if (rows !== 2) fail(`the playground summary has ${rows} rows, expected 2`);
    const lines = await page.locator("#sim-chart path").count();
    if (lines !== 4) fail(`the playground draws ${lines} lines, expected 4`);
    const legend = await page.locator("#sim-legend").textContent();
    const events = Number((legend.match(/(\d+) requests/) || [])[1]);
    for (const name of ["current", "candidate"]) {
      const c = await page.locator(`#sim-summary tr[data-policy="${name}"] td`).allTextContents();
      if (Number(c[2]) + Number(c[3]) !== events) {
        fail(`${name}: ${c[2]} admitted + ${c[3]} denied is not the ${events} requests`);
      }
    }
    if (process.env.SLUICE_UI_SCREENSHOT) {
      await page.screenshot({ path: process.env.SLUICE_UI_SCREENSHOT, fullPage: true });
    }
    // A policy that is not JSON is named, not sent.
    await page.fill("#sim-policies", "[{name: current}");
    await page.click("#sim-run");
    await until("the playground names the bad input", 5000, async () =>
      (await page.locator("#sim-error").textContent()).includes("policies: not JSON"),
    );

    if (problems.length) fail("the page had problems:\n  " + problems.join("\n  "));
    console.log(
      "ui-test: the dashboard loads, moves, lists the limited key and resets it; the playground draws",
    );
  } finally {
    await browser.close();
    server.kill("SIGTERM");
    if (process.exitCode) console.error(log.join("").split("\n").slice(-20).join("\n"));
  }
}

main().catch((e) => {
  if (!process.exitCode) {
    console.error("ui-test: FAILED: " + (e && e.stack ? e.stack : e));
    process.exitCode = 1;
  }
});
