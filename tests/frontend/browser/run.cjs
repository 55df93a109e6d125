// Drives the front end in Debian's Chromium with Playwright (npm playwright-core), for
// tests/frontend/test_browser.py. The page's wallet is an injected EIP-1193 provider that
// forwards every request to anvil's JSON-RPC for one of anvil's dev accounts, so the page
// really builds, and anvil really signs and sends, each transaction.
//
// Input: the environment (GM_URL, GM_RPC_URL, GM_ACCOUNT, GM_CHAIN_ID, GM_SHOTS, and
// GM_SCENARIO: "fund" (default; needs GM_PROVIDER, GM_MODULE, GM_DATASET), "dispute" (needs
// GM_OTHER_ACCOUNT, GM_MEDIATOR, GM_SIGNAL; the test drives the provider and the mediator
// meanwhile, and rules once the script wrote "disputed" to the GM_SIGNAL file) or "token"
// (funds a job in tUSD: the wallet signs the EIP-2612 permit, eth_signTypedData_v4) or
// "token-dispute" (needs GM_JOB: disputes that submitted tUSD job with the page's button; the
// deposit, its bounty in tUSD, allowed by a permit the wallet signs)).
// Output: one JSON line on stdout with what happened. Every step logs to stderr; any failure
// exits 1 with a screenshot "failure.png".
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
const SCENARIO = process.env.GM_SCENARIO || "fund";
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

// The injected wallet: EIP-1193 request() plus on/removeListener; RPC goes through Node.
function wallet({ account, chainId }) {
  const listeners = {};
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
    on(event, fn) { (listeners[event] = listeners[event] || []).push(fn); },
    removeListener(event, fn) { listeners[event] = (listeners[event] || []).filter((f) => f !== fn); },
  };
}

async function shot(page, name) {
  const file = path.join(SHOTS, `${name}.png`);
  await page.evaluate(() => window.scrollTo(0, 0));
  await page.screenshot({ path: file, fullPage: true });
  log("screenshot", file);
  return file;
}

async function main() {
  const browser = await chromium.launch({
    executablePath: "/usr/bin/chromium",
    headless: true,
    args: [
      "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync",
    ],
  });
  const errors = [];
  const result = { screenshots: [], errors, scenario: SCENARIO };
  // A browser context whose injected wallet is `account` (anvil signs for it).
  async function walletPage(account) {
    const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
    await context.exposeBinding("__gmRpc", async (_source, method, params) => {
      try {
        return { result: await rpc(method, params) };
      } catch (err) {
        return { error: err.message, code: err.code };
      }
    });
    await context.addInitScript(wallet, { account, chainId: CHAIN_ID });
    const page = await context.newPage();
    page.setDefaultTimeout(30000);
    page.on("pageerror", (err) => errors.push(String(err)));
    // JavaScript errors fail the test; failed requests are expected (the bad bounty's 400).
    page.on("console", (msg) => {
      if (msg.type() === "error" && !msg.text().startsWith("Failed to load resource")) {
        errors.push(msg.text());
      }
    });
    page.on("response", (r) => { if (r.status() === 404) log("404", r.url()); });
    return page;
  }
  const page = await walletPage(ACCOUNT);

  try {
    if (SCENARIO === "dispute") await disputeScenario(page, walletPage, result);
    else if (SCENARIO === "token") await tokenScenario(page, result);
    else if (SCENARIO === "token-dispute") await tokenDisputeScenario(page, result);
    else await fundScenario(page, result);
  } catch (err) {
    log("FAILED:", err.stack || String(err));
    try { await shot(page, "failure"); } catch (_) { /* the page may be gone */ }
    result.failure = String(err.stack || err);
  } finally {
    await browser.close();
  }
  process.stdout.write(JSON.stringify(result) + "\n");
  process.exit(result.failure ? 1 : 0);
}

// Submit a job with chosen terms from the page (a bad collateral refused first), wait while the
// test assigns it and submits a result by hand, dispute it with the page's button (shown to the
// submitter's wallet only), and watch the mediator's ruling and the slash arrive live.
async function disputeScenario(page, walletPage, result) {
  const OTHER = env("GM_OTHER_ACCOUNT");
  const MEDIATOR = env("GM_MEDIATOR");
  log("submit page, terms");
  await page.goto(`${URL}/submit`);
  await page.locator("#wallet-button.connected").waitFor();
  result.mediator_default = await page.inputValue("#mediator");
  result.after_window_hint = await page.textContent("#payment-hint-after_window");
  await page.check('input[name="payment"][value="on_verify"]');
  await page.locator("#payment-hint-on_verify:not(.hidden)").waitFor();
  result.on_verify_hint = await page.textContent("#payment-hint-on_verify");
  await page.check('input[name="payment"][value="after_window"]');
  await page.fill("#name", "browser-dispute");
  await page.fill("#image", "busybox:1.36");  // Docker: the test agent serves WASM only
  await page.fill("#command", "true");
  await page.fill("#bounty", "0.004");
  await page.locator("#quote-collateral").waitFor();
  result.quote_collateral = await page.textContent("#quote-collateral");
  await page.fill("#collateral", "0.001");  // under minCollateral(0.004 ETH)
  await page.click("#fund");
  const collateralError = page.locator('.field[data-field="collateral_eth"].invalid .error');
  await collateralError.waitFor();
  result.collateral_error = await collateralError.textContent();
  result.screenshots.push(await shot(page, "submit-terms-refused"));
  await page.fill("#collateral", "0.006");
  await page.click("#fund");
  await page.waitForURL(/\/jobs\/0x[0-9a-f]{64}$/, { timeout: 60000 });
  result.job_id = page.url().split("/").pop();
  log("funded", result.job_id, "; the test assigns it and submits a result");
  result.mediator_shown = await page.textContent("#job-mediator");
  result.collateral_shown = await page.textContent("#job-collateral");
  result.payment_shown = await page.getAttribute("#job-payment", "data-payment");

  // live: Submitted, the window's end shown, the Dispute button for this wallet only
  await page.locator('#job-summary[data-chain-status="submitted"]').waitFor({ timeout: 90000 });
  await page.locator("#dispute-job:not(.hidden)").waitFor();
  result.window_text = await page.textContent("#job-window");
  result.dispute_button = await page.textContent("#dispute-job");
  result.dispute_hint = await page.textContent("#dispute-hint");
  result.screenshots.push(await shot(page, "job-submitted"));
  const other = await walletPage(OTHER);
  await other.goto(`${URL}/jobs/${result.job_id}`);
  await other.locator("#wallet-button.connected").waitFor();
  await other.locator("#dispute-job").waitFor({ state: "attached" });
  result.other_sees_dispute = await other.locator("#dispute-job").isVisible();
  result.other_sees_finalize = await other.locator("#finalize-job").count();
  await other.close();

  const reloaded = page.waitForEvent("load", { timeout: 90000 });  // data-tx-reload
  await page.click("#dispute-job");
  await reloaded;
  await page.locator('#job-summary[data-chain-status="disputed"]').waitFor({ timeout: 30000 });
  result.disputed_text = await page.textContent("#job-disputed");
  result.screenshots.push(await shot(page, "job-disputed"));
  fs.writeFileSync(env("GM_SIGNAL"), "disputed\n");

  log("disputed; the test has the mediator rule");
  const ruling = page.locator('.ruling[data-upheld="false"]');
  await ruling.waitFor({ timeout: 90000 });
  result.ruling_text = await ruling.textContent();
  result.chain_status_after = await page.getAttribute("#job-summary", "data-chain-status");
  result.screenshots.push(await shot(page, "job-ruled"));
  const txs = await page.locator("#job-txs a[href^='/tx/']").evaluateAll(
    (links) => links.map((a) => a.getAttribute("href")),
  );
  await page.goto(`${URL}${txs[txs.length - 1]}`);
  result.ruling_tx_function = await page.textContent("#tx-function");
  result.ruling_tx_text = await page.textContent("main");
  result.screenshots.push(await shot(page, "tx-ruling"));
  await page.goto(`${URL}/address/${MEDIATOR}`);
  result.mediator_rulings = await page.textContent("#rulings");
  result.screenshots.push(await shot(page, "mediator"));
}

// Fund a job in tUSD from the submit page: the currency picker, the quote in tUSD (or the reason
// there is none), too many decimals refused on the field, then the wallet signs the permit and
// sends one transaction (multicall: permitToken, createJobWith); the job page shows tUSD.
async function tokenScenario(page, result) {
  log("submit page, tUSD");
  const signed = [];
  page.on("request", (r) => {
    if (r.url().endsWith("/api/jobs/prepare") && r.method() === "POST") {
      const body = JSON.parse(r.postData() || "{}");
      if (body.permit) signed.push(body.permit);
    }
  });
  await page.goto(`${URL}/submit`);
  await page.locator("#wallet-button.connected").waitFor();
  await page.fill("#name", "browser-tusd");
  await page.fill("#image", "busybox:1.36");  // Docker: the test agent serves WASM only
  await page.fill("#command", "true");
  await page.selectOption("#currency", "tUSD");
  await page.locator("#currency-hint-token:not(.hidden)").waitFor();
  result.bounty_label = await page.textContent('label[for="bounty"]');
  await page.locator('#quote[data-currency="tUSD"]').waitFor();
  result.quote_unavailable = await page.locator("#quote-unavailable").count()
    ? await page.textContent("#quote-unavailable") : null;
  result.quote_total = await page.locator("#quote-total").count()
    ? await page.textContent("#quote-total") : null;
  await page.fill("#bounty", "1.1234567");
  await page.click("#fund");
  const bountyError = page.locator('.field[data-field="bounty"].invalid .error');
  await bountyError.waitFor();
  result.bounty_error = await bountyError.textContent();
  await page.fill("#bounty", "4");
  await page.fill("#collateral", "4.5");
  await page.locator("#verification-price").waitFor();
  result.price_line = await page.textContent("#verification-price");
  result.screenshots.push(await shot(page, "submit-tusd"));
  await page.click("#fund");
  await page.waitForURL(/\/jobs\/0x[0-9a-f]{64}$/, { timeout: 60000 });
  result.job_id = page.url().split("/").pop();
  result.permits_sent = signed.length;
  await page.locator('#job-summary[data-chain-status="funded"]').waitFor({ timeout: 30000 });
  result.job_bounty = await page.textContent("#job-bounty");
  result.job_collateral = await page.textContent("#job-collateral");
  result.job_currency = await page.textContent("#job-currency");
  result.screenshots.push(await shot(page, "job-tusd"));
}

// Dispute a submitted tUSD job from its page: the button names the deposit in tUSD; the wallet
// signs the deposit's permit, then sends multicall(permitToken, dispute); the page goes Disputed.
async function tokenDisputeScenario(page, result) {
  const JOB = env("GM_JOB");
  const methods = [];
  await page.exposeBinding("__gmSeen", (_source, method) => { methods.push(method); });
  await page.addInitScript(() => {
    const wrap = () => {
      const inner = window.ethereum.request.bind(window.ethereum);
      window.ethereum.request = (args) => { window.__gmSeen(args.method); return inner(args); };
    };
    if (window.ethereum) wrap();
  });
  await page.goto(`${URL}/jobs/${JOB}`);
  await page.locator("#wallet-button.connected").waitFor();
  await page.locator("#dispute-job:not(.hidden)").waitFor();
  result.dispute_button = await page.textContent("#dispute-job");
  result.dispute_hint = await page.textContent("#dispute-hint");
  const reloaded = page.waitForEvent("load", { timeout: 90000 });  // data-tx-reload
  await page.click("#dispute-job");
  await reloaded;
  await page.locator('#job-summary[data-chain-status="disputed"]').waitFor({ timeout: 30000 });
  result.wallet_methods = methods;
  result.screenshots.push(await shot(page, "job-tusd-disputed"));
}

async function fundScenario(page, result) {
  const PROVIDER = env("GM_PROVIDER");
  {
    // ------------------------------------------------------------ submit: bad input first
    log("submit page");
    await page.goto(`${URL}/submit`);
    await page.locator("#wallet-button.connected").waitFor();  // eth_accounts answered
    await page.locator("#quote-total").waitFor();
    await page.fill("#name", "browser-uppercase");
    await page.check('input[name="executor"][value="wasm"]');
    await page.setInputFiles("#module-file", env("GM_MODULE"));
    await page.check('input[name="dataset_mode"][value="upload"]');
    await page.setInputFiles("#dataset-files", env("GM_DATASET"));
    await page.fill("#ram", "128");
    await page.fill("#disk", "16");
    await page.fill("#timeout", "1");
    await page.selectOption("#region", "eu-west");
    await page.fill("#deadline", "1");
    await page.fill("#bounty", "lots");
    await page.click("#fund");
    const bountyError = page.locator('.field[data-field="bounty_eth"].invalid .error');
    await bountyError.waitFor();
    result.bounty_error = await bountyError.textContent();
    log("bad bounty refused:", result.bounty_error);
    result.screenshots.push(await shot(page, "submit-bad-input"));

    // ------------------------------------------------------------ submit: fund through the wallet
    await page.fill("#bounty", "0.004");
    await page.check('input[name="payment"][value="on_verify"]');  // the scheduler pays at once
    await page.locator('#quote[data-executor="wasm"] #quote-providers').waitFor();
    result.quote_providers = await page.textContent("#quote-providers");
    result.screenshots.push(await shot(page, "submit"));
    await page.click("#fund");
    await page.waitForURL(/\/jobs\/0x[0-9a-f]{64}$/, { timeout: 60000 });
    result.job_id = page.url().split("/").pop();
    log("funded", result.job_id);

    // ------------------------------------------------------------ job page: live until Released
    await page.locator('#job-summary[data-chain-status="funded"], #job-summary[data-chain-status="assigned"], #job-summary[data-chain-status="submitted"], #job-summary[data-chain-status="released"]').waitFor({ timeout: 30000 });
    result.screenshots.push(await shot(page, "job-running"));
    await page.locator('#job-summary[data-chain-status="released"]').waitFor({ timeout: 120000 });
    await page.locator("#output-link").waitFor();
    await page.locator("#live.off").waitFor({ timeout: 10000 });  // the stream said "end"
    // live logs: the module's stdout ("ok") arrived over the page's log stream, as text
    await page.locator("#job-logs div.log-stdout").first().waitFor({ timeout: 20000 });
    result.log_lines = await page.locator("#job-logs div").allTextContents();
    result.released_payout = await page.textContent("#job-payout");
    result.screenshots.push(await shot(page, "job-released"));
    const txLinks = await page.locator("#job-txs a[href^='/tx/']").evaluateAll(
      (links) => links.map((a) => a.getAttribute("href")),
    );
    result.job_txs = txLinks;

    // the output through the verified proxy
    await page.click("#output-link");
    await page.locator("text=upper.txt").waitFor();
    result.screenshots.push(await shot(page, "output"));
    const output = await page.request.get(`${page.url().replace(/\/$/, "")}/upper.txt`);
    result.output_text = await output.text();

    // ------------------------------------------------------------ explorer
    await page.goto(`${URL}/payouts?job=${result.job_id}`);
    const row = page.locator(`#payouts tr[data-job="${result.job_id}"]`);
    await row.waitFor();
    result.payout_row = await row.locator("td").allTextContents();
    await page.goto(`${URL}/payouts`);
    result.screenshots.push(await shot(page, "payouts"));
    await page.goto(`${URL}${txLinks[txLinks.length - 1]}`);
    result.settle_function = await page.textContent("#tx-function");
    result.screenshots.push(await shot(page, "tx"));
    await page.goto(`${URL}/address/${PROVIDER}`);
    result.provider_earned = await page.textContent("#earned");
    result.screenshots.push(await shot(page, "provider"));
    await page.goto(`${URL}/providers`);
    await page.locator("#leaderboard").waitFor();
    result.screenshots.push(await shot(page, "providers"));

    // ------------------------------------------------------------ cancel, then withdraw
    log("second job, to cancel");
    await page.goto(`${URL}/submit`);
    await page.fill("#name", "browser-cancel");
    await page.fill("#image", "busybox:1.36");  // Docker: the test agent serves WASM only
    await page.fill("#command", "true");
    await page.fill("#bounty", "0.003");
    await page.click("#fund");
    await page.waitForURL(/\/jobs\/0x[0-9a-f]{64}$/, { timeout: 60000 });
    result.cancel_job_id = page.url().split("/").pop();
    await page.locator("#cancel-job").waitFor({ timeout: 30000 });
    let reloaded = page.waitForEvent("load", { timeout: 90000 });  // data-tx-reload
    await page.click("#cancel-job");
    await reloaded;
    await page.locator('#job-summary[data-chain-status="refunded"]').waitFor({ timeout: 60000 });
    result.screenshots.push(await shot(page, "job-cancelled"));
    await page.goto(`${URL}/address/${ACCOUNT}`);
    await page.locator("#withdraw:not([disabled])").waitFor();
    result.balance_before = await page.textContent("#balance");
    result.screenshots.push(await shot(page, "submitter"));
    reloaded = page.waitForEvent("load", { timeout: 90000 });
    await page.click("#withdraw");
    await reloaded;
    await page.locator("#withdraw[disabled]").waitFor({ timeout: 20000 });
    result.balance_after = await page.textContent("#balance");

    await page.goto(`${URL}/jobs`);
    result.screenshots.push(await shot(page, "jobs"));
    await page.goto(`${URL}/`);
    result.screenshots.push(await shot(page, "home"));
  }
}

main().catch((err) => {
  log("FAILED:", err.stack || String(err));
  process.exit(1);
});
