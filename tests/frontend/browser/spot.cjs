// The submit page's spot:p choice and a spot job's page, in Debian's Chromium with Playwright
// (npm playwright-core), for tests/frontend/test_spot_browser.py. The wallet is the injected
// EIP-1193 provider of run.cjs (anvil signs for one of its dev accounts).
//
// Input: the environment (GM_URL, GM_RPC_URL, GM_ACCOUNT, GM_CHAIN_ID, GM_SHOTS, GM_IMAGE: a
// Docker image named by digest). Output: one JSON line on stdout with what the pages showed.
// Any failure exits 1 with a screenshot "spot-failure.png".
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
    log("submit page: spot:0.1");
    await page.goto(`${URL}/submit`);
    await page.locator("#wallet-button.connected").waitFor();
    await page.fill("#name", "browser-spot");
    await page.fill("#image", IMAGE);
    await page.fill("#command", "true");
    result.options = await page.locator("#verification option").evaluateAll(
      (opts) => opts.map((o) => o.value));
    await page.selectOption("#verification", "spot:0.1");
    await page.locator("#verification-hint-spot:not(.hidden)").waitFor();
    result.spot_hint = await page.textContent("#verification-hint-spot");
    result.draw_note = await page.textContent("#spot-draw-note");
    result.on_verify_disabled = await page.isDisabled('input[name="payment"][value="on_verify"]');
    await page.fill("#bounty", "0.002");
    result.price = await page.textContent("#verification-price");
    result.price_state = await page.getAttribute("#verification-price", "data-state");
    result.collateral_placeholder = await page.getAttribute("#collateral", "placeholder");
    await page.click("#fund");  // pinned, but not declared deterministic: refused
    const detError = page.locator('.field[data-field="spec.deterministic"].invalid .error');
    await detError.waitFor();
    result.deterministic_error = await detError.textContent();
    await page.check("#deterministic");
    await page.click("#fund");
    await page.waitForURL(/\/jobs\/0x[0-9a-f]{64}$/, { timeout: 60000 });
    result.job_id = page.url().split("/").pop();
    await page.locator("#job-spot").waitFor();
    result.spot_p = await page.textContent("#spot-p");
    result.spot_commit = await page.textContent("#spot-commit");
    result.pending = (await page.textContent("#spot-reveal-pending")).replace(/\s+/g, " ").trim();
    result.payment = (await page.textContent("#job-payment")).replace(/\s+/g, " ").trim();
    result.screenshots.push(await shot(page, "spot-funded"));
  } catch (err) {
    log("FAILED:", err.stack || String(err));
    try { await shot(page, "spot-failure"); } catch (_) { /* the page may be gone */ }
    result.failure = String(err.stack || err);
  } finally {
    await browser.close();
  }
  process.stdout.write(JSON.stringify(result) + "\n");
  process.exit(result.failure ? 1 : 0);
}

main();
