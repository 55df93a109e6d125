// GridMarket pages: the visitor's wallet (EIP-1193 window.ethereum) and small shared helpers.
// The server builds every transaction (POST /api/.../prepare, dry-run from the wallet's
// address); the wallet only signs and sends it. No key ever reaches the server.
"use strict";

const GM = {
  account: null,
  chainId: Number(document.body.dataset.chainId),

  /** JSON request to the front end's API; throws {status, detail, field} on an error. */
  async api(path, body, options = {}) {
    const init = body === undefined ? { method: "GET" } : {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
    };
    const response = await fetch(path, { ...init, ...options });
    let data = null;
    try { data = await response.json(); } catch (_) { data = null; }
    if (!response.ok) {
      const err = new Error((data && data.detail) || `${response.status} ${response.statusText}`);
      err.status = response.status;
      err.field = data && data.field;
      throw err;
    }
    return data;
  },

  provider() {
    if (!window.ethereum) {
      throw new Error("No wallet found: install an Ethereum wallet (EIP-1193) to sign.");
    }
    return window.ethereum;
  },

  /** Ask the wallet for an account, on the escrow's chain; returns the address. */
  async connect() {
    const eth = GM.provider();
    const accounts = await eth.request({ method: "eth_requestAccounts" });
    if (!accounts || !accounts.length) throw new Error("The wallet gave no account.");
    const chain = parseInt(await eth.request({ method: "eth_chainId" }), 16);
    if (chain !== GM.chainId) {
      try {
        await eth.request({
          method: "wallet_switchEthereumChain",
          params: [{ chainId: "0x" + GM.chainId.toString(16) }],
        });
      } catch (_) {
        throw new Error(`The wallet is on chain ${chain}; switch it to chain ${GM.chainId}.`);
      }
    }
    GM.setAccount(accounts[0]);
    return GM.account;
  },

  setAccount(address) {
    GM.account = address ? address : null;
    const button = document.getElementById("wallet-button");
    if (!button) return;
    if (GM.account) {
      button.classList.add("connected");
      button.innerHTML = "";
      const dot = document.createElement("span");
      dot.className = "dot";
      button.append(dot, GM.short(GM.account));
      button.title = GM.account;
    } else {
      button.classList.remove("connected");
      button.textContent = window.ethereum ? "Connect wallet" : "No wallet";
    }
    document.dispatchEvent(new CustomEvent("gm:account", { detail: GM.account }));
  },

  short(value) {
    return value && value.length > 12 ? `${value.slice(0, 6)}…${value.slice(-4)}` : value;
  },

  /** Wei (string or bigint) as "0.0125 ETH". */
  eth(wei, places = 6) {
    const value = BigInt(wei || 0);
    const whole = value / 10n ** 18n;
    let frac = (value % 10n ** 18n).toString().padStart(18, "0").slice(0, places);
    frac = frac.replace(/0+$/, "");
    if (value > 0n && whole === 0n && !frac) return `<0.${"0".repeat(places - 1)}1 ETH`;
    return `${whole}${frac ? "." + frac : ""} ETH`;
  },

  /** Smallest units (string or bigint) of a token with `decimals` as "2.5 tUSD". */
  units(value, decimals, symbol, places = 6) {
    if (decimals === 18 && symbol === "ETH") return GM.eth(value, places);
    const v = BigInt(value || 0);
    const base = 10n ** BigInt(decimals);
    const frac = (v % base).toString().padStart(decimals, "0").replace(/0+$/, "");
    return `${v / base}${frac ? "." + frac : ""} ${symbol}`;
  },

  /** Decimal text to smallest units of a token with `decimals` (null if not such a number). */
  toUnits(text, decimals) {
    const clean = String(text).trim();
    const pattern = new RegExp(`^\\d*(\\.\\d{0,${decimals}})?$`);
    if (!pattern.test(clean) || clean === "" || clean === ".") return null;
    const [whole, frac = ""] = clean.split(".");
    const base = 10n ** BigInt(decimals);
    return (BigInt(whole || "0") * base + BigInt((frac + "0".repeat(decimals)).slice(0, decimals) || "0")).toString();
  },

  /**
   * Let the escrow pull a token amount (a prepare's `funding`): the wallet signs the EIP-2612
   * permit (eth_signTypedData_v4; no transaction) and the permit to send back is returned; a
   * wallet that cannot sign typed data (or a token without a usable permit) sends the
   * approval instead, and null is returned once it is mined.
   */
  async allow(funding, status = () => {}) {
    if (funding.permit) {
      status("Sign the permit in your wallet (no transaction)…");
      try {
        const signature = await GM.provider().request({
          method: "eth_signTypedData_v4",
          params: [GM.account, JSON.stringify(funding.permit)],
        });
        return { value: funding.permit.message.value, deadline: Number(funding.permit.message.deadline), signature };
      } catch (err) {
        if (err && err.code === 4001) throw err;  // the user refused: stop here
        status(`The wallet cannot sign a permit (${err.message || err}); approving instead…`);
      }
    }
    status("Confirm the approval in your wallet…");
    const hash = await GM.send(funding.approve_tx);
    const mined = await GM.waitTx(hash);
    if (mined.status !== "success") throw new Error(`the approval reverted (transaction ${hash})`);
    return null;
  },

  /** Decimal ETH text to a wei string (exact, no floating point). */
  toWei(text) {
    const clean = String(text).trim();
    if (!/^\d*(\.\d{0,18})?$/.test(clean) || clean === "" || clean === ".") return null;
    const [whole, frac = ""] = clean.split(".");
    return (BigInt(whole || "0") * 10n ** 18n + BigInt((frac + "0".repeat(18)).slice(0, 18))).toString();
  },

  /** Send a transaction the server prepared; returns its hash. */
  async send(tx) {
    const eth = GM.provider();
    const request = { from: GM.account, to: tx.to, data: tx.data, value: tx.value, gas: tx.gas };
    return eth.request({ method: "eth_sendTransaction", params: [request] });
  },

  /** Wait for a transaction to be mined (polls /api/tx/HASH); returns its decoded view. */
  async waitTx(hash, timeoutMs = 180000) {
    const until = Date.now() + timeoutMs;
    while (Date.now() < until) {
      try {
        const view = await GM.api(`/api/tx/${hash}`);
        if (view.status !== "pending") return view;
      } catch (err) {
        if (err.status !== 404) throw err;
      }
      await new Promise((resolve) => setTimeout(resolve, 700));
    }
    throw new Error(`transaction ${hash} was not mined after ${timeoutMs / 1000} s`);
  },

  /**
   * The whole wallet flow: connect, ask the server for the transaction from this account,
   * have the wallet send it, wait for it. `status` is told each step.
   */
  async runTx(prepareUrl, body, status = () => {}) {
    status("Connecting the wallet…");
    const account = await GM.connect();
    status("Preparing the transaction…");
    let prepared = await GM.api(prepareUrl, { ...body, from: account });
    if (!prepared.tx && prepared.funding) {  // a token amount to allow first (a token dispute)
      const permit = await GM.allow(prepared.funding, status);
      prepared = await GM.api(prepareUrl, { ...body, from: account, ...(permit ? { permit } : {}) });
    }
    status("Confirm the transaction in your wallet…");
    const hash = await GM.send(prepared.tx);
    status(`Sent ${GM.short(hash)}; waiting for a block…`);
    const mined = await GM.waitTx(hash);
    if (mined.status !== "success") throw new Error(`transaction ${hash} reverted`);
    return { prepared, hash, mined };
  },

  notice(el, kind, text, link) {
    if (!el) return;
    el.className = `notice ${kind}`;
    el.textContent = text;
    if (link) {
      const a = document.createElement("a");
      a.href = link.href;
      a.textContent = link.text;
      el.append(" ", a);
    }
  },
};

// Buttons that run one transaction: <button data-tx-prepare="/api/..." data-tx-status="#id">.
document.addEventListener("click", async (event) => {
  const button = event.target.closest("[data-tx-prepare]");
  if (!button) return;
  event.preventDefault();
  const out = document.querySelector(button.dataset.txStatus || "#tx-status");
  const body = button.dataset.txBody ? JSON.parse(button.dataset.txBody) : {};
  button.disabled = true;
  try {
    const { hash } = await GM.runTx(button.dataset.txPrepare, body, (s) => GM.notice(out, "info", s));
    GM.notice(out, "ok", `${button.dataset.txDone || "Done"}: transaction`, {
      href: `/tx/${hash}`, text: GM.short(hash),
    });
    if (button.dataset.txReload !== undefined) setTimeout(() => window.location.reload(), 1200);
  } catch (err) {
    GM.notice(out, "error", err.message || String(err));
    button.disabled = false;
  }
});

document.getElementById("wallet-button")?.addEventListener("click", async () => {
  try {
    await GM.connect();
  } catch (err) {
    alert(err.message || String(err));
  }
});

// Show an account the wallet already shares, without a prompt.
(async () => {
  if (!window.ethereum) { GM.setAccount(null); return; }
  try {
    const accounts = await window.ethereum.request({ method: "eth_accounts" });
    GM.setAccount(accounts && accounts[0]);
  } catch (_) {
    GM.setAccount(null);
  }
  window.ethereum.on?.("accountsChanged", (accounts) => GM.setAccount(accounts && accounts[0]));
})();
