// page.mjs -- Debian's chromium, headless, over pilotlight's /status: what
// a person sees, read from the rendered page, for
// tests/interop/test_status_page.py to hold against /metrics and
// /debug/status.
//
//   node page.mjs URL CHROMIUM OUTDIR
//
// Prints one JSON line per step and reads one line from stdin between
// them: "seen" (the page as first loaded), then, after the test sends
// {"hits": N}, "updated" (the same page once it shows N hits, without a
// reload), then "nojs" (the page with JavaScript off) and "done" (the
// screenshots, the console's errors). Exits 0 unless it could not drive
// the browser at all.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { chromium } from "playwright-core";

const [url, executablePath, outDir] = process.argv.slice(2);
// The machine's network is closed: nothing but the page may be asked for.
const ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
  "--disable-background-networking", "--disable-component-update", "--disable-sync"];
const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();
const say = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");
const errors = [];

// Everything the page shows that the test compares.
function read() {
  const text = (el) => (el ? el.textContent : null);
  const facts = {};
  for (const el of document.querySelectorAll("[data-k],[data-r],[data-n]")) {
    const k = el.dataset.k ? "k:" + el.dataset.k : el.dataset.r ? "r:" + el.dataset.r : "n:" + el.dataset.n;
    facts[k] = el.textContent;
  }
  const rows = (id) => [...document.querySelectorAll(`#${id} tbody tr`)]
    .filter((tr) => !tr.querySelector("td.none"))
    .map((tr) => Object.fromEntries([...tr.querySelectorAll("td")].map((td) => [td.className, td.textContent])));
  const health = document.querySelector("#health p");
  return {
    facts, pool: rows("pool"), matches: rows("matches"), misses: rows("misses"), ring: text(document.querySelector("#ring")),
    health: health ? { state: health.className.replace("health ", ""), text: health.textContent } : null,
    refreshed: Number(document.body.getAttribute("data-refreshed") || 0),
    marker: window.__pilotlight_marker || null,
    live: text(document.getElementById("live")),
    overflow: document.documentElement.scrollWidth - window.innerWidth,
  };
}

async function open(javaScriptEnabled, viewport) {
  const dir = mkdtempSync(join(tmpdir(), "pl-chromium-"));
  const context = await chromium.launchPersistentContext(dir, {
    executablePath, headless: true, args: ARGS, javaScriptEnabled, viewport,
  });
  const page = context.pages()[0] || await context.newPage();
  page.on("console", (m) => { if (m.type() === "error") errors.push(`console: ${m.text()}`); });
  page.on("pageerror", (e) => errors.push(`page: ${e.message}`));
  page.on("requestfailed", (r) => errors.push(`request: ${r.url()} ${r.failure()?.errorText}`));
  page.on("response", (r) => { if (r.status() >= 400) errors.push(`response: ${r.status()} ${r.url()}`); });
  const close = async () => { await context.close(); rmSync(dir, { recursive: true, force: true }); };
  return { page, close };
}

async function main() {
  const live = await open(true, { width: 1280, height: 900 });
  const { page } = live;
  await page.goto(url, { waitUntil: "load" });
  // the script ran: it says so at once, before its first refresh
  await page.waitForFunction(() => document.getElementById("live").textContent.startsWith("live"));
  await page.evaluate(() => { window.__pilotlight_marker = "first load"; });
  say({ step: "seen", page: await page.evaluate(read) });

  const want = JSON.parse((await lines.next()).value);
  await page.waitForFunction((n) => document.querySelector("[data-k=hits]").textContent === String(n),
    want.hits, { timeout: 20000 });
  say({ step: "updated", page: await page.evaluate(read) });
  await page.screenshot({ path: join(outDir, "status.png"), fullPage: true });
  await page.setViewportSize({ width: 390, height: 844 });
  await page.waitForTimeout(100);
  const phone = await page.evaluate(read);
  await page.screenshot({ path: join(outDir, "status-phone.png"), fullPage: true });
  await live.close();
  await lines.next();

  const off = await open(false, { width: 1280, height: 900 });
  await off.page.goto(url, { waitUntil: "load" });
  say({ step: "nojs", page: await off.page.evaluate(read), phone_overflow: phone.overflow });
  await off.close();
  say({ step: "done", errors, screenshots: [join(outDir, "status.png"), join(outDir, "status-phone.png")] });
}

main().catch((e) => {
  say({ step: "failed", error: String(e && e.stack || e), errors });
  process.exit(1);
});
