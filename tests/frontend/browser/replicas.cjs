// The submit page's verification choice and a replicated job's page, in Debian's Chromium with
// Playwright (npm playwright-core), for tests/frontend/test_replicas_browser.py. The wallet is
// the injected EIP-1193 provider of run.cjs (anvil signs for one of its dev accounts).
//
// Input: the environment (GM_URL, GM_RPC_URL, GM_ACCOUNT, GM_CHAIN_ID, GM_SHOTS, GM_IMAGE: a
// Docker image named by digest, GM_SIGNAL: a file the script writes the seat's job id to once
// the job page shows the group; the test then has the seats delivered and resolved by hand).
// Output: one JSON line on stdout with what the pages showed. Any failure exits 1 with a
// screenshot "replicas-failure.png".
"use strict";

const fs = require("node:fs");
const path = require("node:path");
const { chromium } = require("playwright-core");

const env = (name) => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set`);
  return value;
};
const URL = env("GM_URL");
const RPC = env("GM_RPC_URL");
const ACCOUNT = env("GM_ACCOUNT");
const CHAIN_ID = Number(env("GM_CHAIN_ID"));
const SHOTS = env("GM_SHOTS");
const IMAGE = env("GM_IMAGE");
const SIGNAL = env("GM_SIGNAL");
const log = (...args) => console.error(new Date().toISOString().slice(11, 23), ...args);

async function rpc(method, params) {
  const response = await fetch(RPC, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ jsonrpc: "2.0", id: 1, method, params: params || [] }),
  });
  const body = await response.json();
  if (body.error) {
    const err = new Error(body.error.message);
    err.code = body.error.code;
    throw err;
  }
  return body.result;
}

function wallet({ account, chainId }) {
  window.ethereum = {
    isGridMarketTestWallet: true,
    async request({ method, params }) {
      if (method === "eth_requestAccounts" || method === "eth_accounts") return [account];
      if (method === "eth_chainId") return "0x" + chainId.toString(16);
      if (method === "wallet_switchEthereumChain") return null;
      const answer = await window.__gmRpc(method, params || []);
      if (answer.error) {
        const err = new Error(answer.error);
        err.code = answer.code;
        throw err;
      }
      return answer.result;
    },
    on() {},
    removeListener() {},
  };
}

async function shot(page, name) {
  const file = path.join(SHOTS, `${name}.png`);
  await page.evaluate(() => window.scrollTo(0, 0));
  await page.screenshot({ path: file, fullPage: true });
  return file;
}

async function main() {
  const browser = await chromium.launch({
    executablePath: "/usr/bin/chromium",
    headless: true,
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  const errors = [];
  const result = { screenshots: [], errors };
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  await context.exposeBinding("__gmRpc", async (_source, method, params) => {
    try {
      return { result: await rpc(method, params) };
    } catch (err) {
      return { error: err.message, code: err.code };
    }
  });
  await context.addInitScript(wallet, { account: ACCOUNT, chainId: CHAIN_ID });
  const page = await context.newPage();
  page.setDefaultTimeout(30000);
  page.on("pageerror", (err) => errors.push(String(err)));
  page.on("console", (msg) => {
    if (msg.type() === "error" && !msg.text().startsWith("Failed to load resource")) {
      errors.push(msg.text());
    }
  });
  try {
    log("submit page: replicate:2");
    await page.goto(`${URL}/submit`);
    await page.locator("#wallet-button.connected").waitFor();
    await page.fill("#name", "browser-replicas");
    await page.fill("#image", "busybox:1.36");  // a tag: refused for a replicated job
    await page.fill("#command", "true");
    await page.selectOption("#verification", "replicate:2");
    await page.locator("#verification-hint-replicate:not(.hidden)").waitFor();
    result.replicate_hint = await page.textContent("#verification-hint-replicate");
    result.on_verify_disabled = await page.isDisabled('input[name="payment"][value="on_verify"]');
    const use = page.locator("#quote button", { hasText: "runs)" });
    await use.waitFor({ timeout: 15000 });  // the quote, again for k runs
    result.use_quote = await use.textContent();
    await page.fill("#bounty", "0.004000000000000001");  // 1 wei too many for 2 seats
    result.price_odd = await page.textContent("#verification-price");
    await page.fill("#bounty", "0.004");
    result.price = await page.textContent("#verification-price");
    result.price_state = await page.getAttribute("#verification-price", "data-state");
    await page.click("#fund");
    const imageError = page.locator('.field[data-field="spec.image"].invalid .error');
    await imageError.waitFor();
    result.image_error = await imageError.textContent();
    result.screenshots.push(await shot(page, "replicas-submit-refused"));
    await page.fill("#image", IMAGE);
    await page.click("#fund");  // pinned, but not declared deterministic: refused
    const detError = page.locator('.field[data-field="spec.deterministic"].invalid .error');
    await detError.waitFor();
    result.deterministic_error = await detError.textContent();
    await page.check("#deterministic");
    await page.click("#fund");
    await page.waitForURL(/\/jobs\/0x[0-9a-f]{64}$/, { timeout: 60000 });
    result.job_id = page.url().split("/").pop();
    await page.locator("#job-group").waitFor();
    result.seat_rows = await page.locator("#job-seats tr.seat").count();
    result.pending = await page.locator("#job-verdict-pending").count();
    result.screenshots.push(await shot(page, "replicas-funded"));
    fs.writeFileSync(SIGNAL, result.job_id + "\n");

    log("funded", result.job_id, "; the test delivers and resolves the seats by hand");
    const verdict = page.locator("#job-verdict");
    await verdict.waitFor({ timeout: 90000 });  // pushed live (server-sent events)
    result.verdict_text = (await verdict.textContent()).replace(/\s+/g, " ").trim();
    result.agreeing = await verdict.getAttribute("data-agreeing");
    result.seat_states = await page.locator("#job-seats tr.seat").evaluateAll(
      (rows) => rows.map((r) => r.dataset.status));
    result.badges = await page.locator("#job-seats td .badge").evaluateAll(
      (spans) => spans.map((s) => s.dataset.state));
    result.screenshots.push(await shot(page, "replicas-resolved"));
  } catch (err) {
    log("FAILED:", err.stack || String(err));
    try { await shot(page, "replicas-failure"); } catch (_) { /* the page may be gone */ }
    result.failure = String(err.stack || err);
  } finally {
    await browser.close();
  }
  process.stdout.write(JSON.stringify(result) + "\n");
  process.exit(result.failure ? 1 : 0);
}

main();
