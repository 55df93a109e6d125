// The submit page: build a job spec from the form, show a quote, and fund the job from the
// wallet. Order matters, so that a mistake creates nothing: (1) the server checks the whole
// request and dry-runs createJob from the wallet's address (dry_run), with the operator the page
// shows as the one the job expects (expectedOperator: if the owner replaces it before the
// transaction is mined, it reverts, the page says why and shows the new one), (2) for a job paid in a
// token the wallet signs the EIP-2612 permit (or, if it cannot sign typed data, approves the
// escrow), (3) the dataset and module are uploaded to IPFS, (4) the server adds the spec and
// returns the transaction (for a token: multicall(permitToken, createJobWith)), (5) the
// wallet signs and sends it, (6) the page goes to the job's live page.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const form = $("submit-form");
  const status = $("submit-status");
  const radio = (name) => form.querySelector(`input[name="${name}"]:checked`).value;
  // The CID of zero bytes: stands in for a file still to upload while the request is checked.
  const PLACEHOLDER_CID = "bafkreihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku";

  class FieldError extends Error {
    constructor(field, message) { super(message); this.field = field; }
  }

  function toggle() {
    const wasm = radio("executor") === "wasm";
    $("docker-fields").classList.toggle("hidden", wasm);
    $("wasm-fields").classList.toggle("hidden", !wasm);
    const mode = radio("dataset_mode");
    $("dataset-upload").classList.toggle("hidden", mode !== "upload");
    $("dataset-cid-field").classList.toggle("hidden", mode !== "cid");
  }

  /** The currency chosen: ETH or a listed token (symbol, address, decimals). */
  function cur() {
    const option = $("currency").selectedOptions[0];
    const decimals = Number(option.dataset.decimals);
    return { symbol: option.value, address: option.dataset.address, decimals, eth: option.value === "ETH" };
  }
  const toUnits = (text) => GM.toUnits(text, cur().decimals);
  const fmt = (units) => GM.units(units, cur().decimals, cur().symbol, cur().decimals);
  const bare = (units) => fmt(units).replace(` ${cur().symbol}`, "");

  /** The currency's name on the form, and the fields' names the server's errors use. */
  function showCurrency() {
    const c = cur();
    form.querySelectorAll(".currency-symbol").forEach((el) => { el.textContent = c.symbol; });
    $("bounty-field").dataset.field = c.eth ? "bounty_eth" : "bounty";
    $("collateral-field").dataset.field = c.eth ? "collateral_eth" : "collateral";
    $("currency-hint-token").classList.toggle("hidden", c.eth);
    const least = $("currency").selectedOptions[0].dataset.minBounty;
    $("bounty-minimum").textContent = least ? `Minimum ${fmt(least)}.` : "";
    const deposit = $("dispute-deposit-hint");
    deposit.textContent = c.eth
      ? deposit.dataset.eth
      : `A dispute deposits the job's bounty, in ${c.symbol} (it pays the mediator's re-run if the result is upheld).`;
  }

  const lines = (text) => text.split("\n").map((s) => s.replace(/\r$/, "")).filter((s) => s.length);
  const num = (id) => Number($(id).value);

  function envOf(text) {
    const env = {};
    for (const line of lines(text)) {
      const at = line.indexOf("=");
      if (at < 1) throw new FieldError("spec.env", `"${line}" is not KEY=value`);
      env[line.slice(0, at).trim()] = line.slice(at + 1);
    }
    return env;
  }

  function buildSpec(cids = {}) {
    const wasm = radio("executor") === "wasm";
    const gpus = num("gpus");
    const models = [...$("models").selectedOptions].map((o) => o.value);
    const resources = {
      cpu_cores: num("cpu"),
      ram_mib: num("ram"),
      disk_mib: num("disk"),
      gpu_count: gpus,
      min_vram_mib: Math.round(num("vram") * 1024),
    };
    if (models.length) resources.gpu_models = models;
    if ($("min-cuda").value.trim()) resources.min_cuda = $("min-cuda").value.trim();
    if ($("min-cc").value.trim()) resources.min_compute_capability = $("min-cc").value.trim();
    if ($("region").value) resources.region = $("region").value;
    const spec = {
      name: $("name").value.trim() || "job",
      executor: wasm ? "wasm" : "docker",
      command: lines($("command").value),
      env: envOf($("env").value),
      resources,
      limits: { timeout_s: Math.round(num("timeout") * 60) },
      max_attempts: num("attempts"),
    };
    if (wasm) spec.module_cid = cids.module || $("module-cid").value.trim() || null;
    else {
      spec.image = $("image").value.trim() || null;
      if ($("deterministic").checked) spec.deterministic = true;
    }
    const mode = radio("dataset_mode");
    if (mode === "cid") spec.dataset_cid = $("dataset-cid").value.trim() || null;
    if (mode === "upload") spec.dataset_cid = cids.dataset || null;
    return spec;
  }

  function request(spec) {
    const c = cur();
    const body = {
      spec,
      [c.eth ? "bounty_eth" : "bounty"]: $("bounty").value.trim(),
      ttl_s: Math.round(Number($("deadline").value) * 3600),
      payment: radio("payment"),
      verification: $("verification").value,
    };
    const mediator = $("mediator").value.trim();
    if (mediator) body.mediator = mediator;
    // the operator shown on this page: the wallet's transaction expects exactly this one
    const operator = $("operator").value.trim();
    if (operator) body.operator = operator;
    const collateral = $("collateral").value.trim();
    if (collateral) body[c.eth ? "collateral_eth" : "collateral"] = collateral;
    if (!c.eth) body.currency = c.symbol;
    return body;
  }

  /** Seats the verification choice asks for: 1 for integrity, k for replicate:k. */
  function seats() {
    const m = /^replicate:(\d)$/.exec($("verification").value);
    return m ? Number(m[1]) : 1;
  }

  /** A spot choice's p in basis points (spot:0.1 -> 1000); 0 for another choice. */
  function spotBps() {
    const option = $("verification").selectedOptions[0];
    return Number((option && option.dataset.spotBps) || 0);
  }

  /** The least collateral for the bounty typed (minCollateral of one seat's share; for a spot
   * job at least bounty x (1 - p) / p, the smallest amount above it), as wei; null if
   * unreadable. */
  function minCollateral() {
    const bounty = toUnits($("bounty").value);
    if (bounty === null) return null;
    const bps = BigInt(form.getAttribute("data-min-collateral-bps") || "10000");
    const least = ((BigInt(bounty) / BigInt(seats())) * bps) / 10000n;
    const p = BigInt(spotBps());
    if (!p) return least;
    const spot = (BigInt(bounty) * (10000n - p)) / p + 1n;  // gridmarket.spot.min_collateral
    return spot > least ? spot : least;
  }

  /** What the verification choice costs: the bounty locked for k runs, each seat's share and
   * the collateral each provider locks. */
  function showVerification() {
    const k = seats();
    const replicated = k > 1;
    const p = spotBps();
    $("verification-hint-integrity").classList.toggle("hidden", replicated || p > 0);
    $("verification-hint-replicate").classList.toggle("hidden", !replicated);
    $("verification-hint-spot").classList.toggle("hidden", !p);
    $("spot-draw-note").classList.toggle("hidden", !p);
    const onVerify = form.querySelector('input[name="payment"][value="on_verify"]');
    onVerify.disabled = replicated || p > 0;  // paid only on agreeing results / after a check
    if ((replicated || p) && onVerify.checked) {
      form.querySelector('input[name="payment"][value="after_window"]').checked = true;
    }
    const line = $("verification-price");
    line.dataset.state = replicated ? `replicate:${k}` : p ? $("verification").value : "integrity";
    const bounty = toUnits($("bounty").value);
    if (bounty === null) { line.textContent = ""; return; }
    const total = BigInt(bounty);
    const typed = toUnits($("collateral").value);
    const collateral = typed === null || !$("collateral").value.trim() ? minCollateral() : BigInt(typed);
    if (p) {  // the price of spot:p, as the server's price view says it
      const pText = $("verification").value.replace(/^spot:/, "");
      const expected = total + (total * BigInt(p)) / 10000n;
      const ratio = ((10000 - p) / p).toPrecision(4).replace(/\.?0+$/, "");
      line.textContent = `You send ${fmt(2n * total)}: the bounty ${fmt(total)} and a check deposit of ${fmt(total)}, `
        + "returned to you unless a check upholds the result (it then pays the mediator's re-run). "
        + `Each attempt is re-run by a second provider with probability ${pText}: expected compute 1 + ${pText} runs `
        + `(expected cost ${fmt(expected)} with an honest provider). The provider locks ${fmt(collateral)} of collateral: `
        + `cheating is unprofitable when it exceeds bounty x (1 - p) / p = ${fmt(total)} x ${ratio}.`;
      return;
    }
    if (!replicated) {
      line.textContent = `You pay ${fmt(total)} for one run; the provider locks ${fmt(collateral)} of collateral.`;
      return;
    }
    const share = total / BigInt(k);
    const rest = total % BigInt(k);
    line.textContent = `You pay ${fmt(total)} for ${k} runs (${fmt(share)} per seat); each of the ${k} providers locks ${fmt(collateral)} of collateral.`
      + (rest ? ` The bounty must divide by ${k}: ${rest} ${cur().eth ? "wei" : "units"} too many.` : "");
  }

  function showTerms() {
    const pay = radio("payment");
    $("payment-hint-after_window").classList.toggle("hidden", pay !== "after_window");
    $("payment-hint-on_verify").classList.toggle("hidden", pay !== "on_verify");
    const least = minCollateral();
    const shown = least === null ? "" : fmt(least);
    $("collateral").placeholder = least === null ? "the minimum" : `${bare(least)} (the minimum)`;
    const line = $("quote-collateral");
    if (line) {
      line.textContent = least === null
        ? ""
        : seats() > 1
          ? `Each of the ${seats()} providers locks at least ${shown} of collateral (its seat's share of the bounty).`
          : spotBps()
            ? `The provider locks at least ${shown} of collateral for a bounty of ${fmt(toUnits($("bounty").value))} (spot checks: above bounty x (1 - p) / p).`
            : `The provider locks at least ${shown} of collateral for a bounty of ${fmt(toUnits($("bounty").value))}.`;
    }
    showVerification();
  }

  /** Take the error off the field that holds `input` (the user is fixing it). */
  function clearError(input) {
    const box = input.closest(".field");
    if (!box) return;
    box.classList.remove("invalid");
    box.querySelectorAll(".error").forEach((e) => e.remove());
    if (!form.querySelector(".field.invalid") && status.classList.contains("error")) {
      status.className = "hidden";
    }
  }

  function clearErrors() {
    form.querySelectorAll(".field.invalid").forEach((f) => f.classList.remove("invalid"));
    form.querySelectorAll(".field .error").forEach((e) => e.remove());
  }

  /** Put `message` under the form field named `field` (or its closest parent name). */
  function showError(field, message) {
    let name = field || "";
    let box = null;
    while (name && !(box = form.querySelector(`.field[data-field="${name}"]`))) {
      name = name.includes(".") ? name.slice(0, name.lastIndexOf(".")) : "";
    }
    if (!box || box.classList.contains("hidden") || !box.offsetParent) {
      GM.notice(status, "error", message);
      return;
    }
    box.classList.add("invalid");
    const div = document.createElement("div");
    div.className = "error";
    div.textContent = message.replace(/^[\w.]+: /, "");
    box.append(div);
    box.scrollIntoView({ behavior: "smooth", block: "center" });
    GM.notice(status, "error", "Please fix the highlighted field.");
  }

  /** The owner replaced the escrow's operator since this page showed it: show the one in
   * office now (the next funding expects it, once the user has seen it and funds again). */
  async function showNewOperator() {
    try {
      const terms = await GM.api("/api/terms");
      if (terms.operator && terms.operator !== $("operator").value) {
        $("operator").value = terms.operator;
        $("operator").dataset.changed = "true";
      }
    } catch (_) { /* the error shown already says what happened */ }
  }

  /** An error about the operator (JobEscrowOperatorChanged): nothing was funded; say so in
   * words, keep the form as it is, and show the new operator. */
  async function operatorChanged(message) {
    await showNewOperator();
    showError("operator", message);
    GM.notice(status, "error", "The escrow's operator changed: nothing was funded. Check the operator shown now and fund again.");
  }

  // ---------------------------------------------------------------- quote
  let quoteTimer = null;
  function scheduleQuote() {
    clearTimeout(quoteTimer);
    quoteTimer = setTimeout(quote, 350);
  }

  let quoteSeq = 0;
  async function quote() {
    const box = $("quote");
    const seq = ++quoteSeq;
    let spec;
    try { spec = buildSpec(); } catch (_) { return; }
    const body = {
      executor: spec.executor,
      region: spec.resources.region || null,
      gpu_count: spec.resources.gpu_count,
      min_vram_mib: spec.resources.min_vram_mib,
      gpu_models: spec.resources.gpu_models || null,
      min_cuda: spec.resources.min_cuda || null,
      min_compute_capability: spec.resources.min_compute_capability || null,
      cpu_cores: spec.resources.cpu_cores,
      ram_mib: spec.resources.ram_mib,
      disk_mib: spec.resources.disk_mib,
      duration_s: spec.limits.timeout_s || 60,
    };
    if (!cur().eth) body.token = cur().address;  // the price in the token's smallest units
    try {
      const q = await GM.api("/api/quote", body);
      if (seq !== quoteSeq) return;  // a newer quote is on its way
      box.innerHTML = "";
      box.dataset.executor = body.executor;
      box.dataset.providers = String(q.provider_count);
      box.dataset.currency = cur().symbol;
      if (q.quote_unavailable) {  // the scheduler does not quote in this token: say so
        const div = document.createElement("div");
        div.className = "notice warn";
        div.id = "quote-unavailable";
        div.textContent = `No quote in ${cur().symbol}: ${q.quote_unavailable}. Choose the bounty yourself.`;
        const fits = document.createElement("p");
        fits.className = "small";
        fits.id = "quote-providers";
        fits.textContent = `${q.provider_count} online node(s) offer these resources now.`;
        const collateral = document.createElement("p");
        collateral.className = "small";
        collateral.id = "quote-collateral";
        box.append(div, collateral, fits);
        showTerms();
        return;
      }
      if (!q.quotes.length) {
        box.innerHTML = '<div class="empty">No tier offers these resources.</div>';
        return;
      }
      const best = q.quotes[0];
      const head = document.createElement("div");
      const where = body.region ? q.region : `${q.region} (no region chosen)`;
      head.innerHTML = `<div class="muted small">Market price for ${Math.round(body.duration_s / 60)} min in ${where}, cheapest tier:</div>`;
      const total = document.createElement("div");
      total.className = "quote-total";
      total.id = "quote-total";
      total.textContent = fmt(best.total_wei);
      const fee = document.createElement("div");
      fee.className = "small muted";
      fee.id = "quote-fee";
      fee.textContent = `incl. platform fee ${fmt(best.fee_wei)} (${q.fee_bps / 100}%); provider gets ${fmt(best.provider_payout_wei)}`;
      const use = document.createElement("button");
      use.type = "button";
      use.className = "secondary";
      use.textContent = "Use as bounty";
      use.style.margin = "0.5rem 0";
      const minimum = BigInt($("currency").selectedOptions[0].dataset.minBounty || "0");
      const k = BigInt(seats());
      const one = BigInt(best.total_wei) > minimum ? BigInt(best.total_wei) : minimum;
      const suggested = one * k;  // replicate:k pays k runs
      use.textContent = k > 1n ? `Use ${fmt(suggested)} as bounty (${k} runs)` : `Use ${fmt(suggested)} as bounty`;
      use.onclick = () => {
        $("bounty").value = bare(suggested);
        clearError($("bounty"));
        showTerms();
      };
      const table = document.createElement("table");
      table.innerHTML = "<thead><tr><th>Tier</th><th class='num'>Per hour</th><th class='num'>Total</th></tr></thead>";
      const tbody = document.createElement("tbody");
      for (const row of q.quotes.slice(0, 6)) {
        const tr = document.createElement("tr");
        for (const [text, cls] of [[row.tier, ""], [fmt(row.rate_wei_per_hour), "num"], [fmt(row.total_wei), "num"]]) {
          const td = document.createElement("td");
          td.textContent = text;
          if (cls) td.className = cls;
          tr.append(td);
        }
        tbody.append(tr);
      }
      table.append(tbody);
      const collateral = document.createElement("p");
      collateral.className = "small";
      collateral.id = "quote-collateral";
      const fits = document.createElement("p");
      fits.className = "small";
      fits.id = "quote-providers";
      fits.textContent = q.provider_count
        ? `${q.provider_count} online node(s) offer these resources now.`
        : "No online node offers these resources right now; the job waits in the queue until one does.";
      box.append(head, total, fee, use, table, collateral, fits);
      showTerms();
    } catch (err) {
      box.innerHTML = "";
      const div = document.createElement("div");
      div.className = "notice error";
      div.textContent = err.message;
      box.append(div);
    }
  }

  // ---------------------------------------------------------------- uploads
  async function upload(path, field, files) {
    const data = new FormData();
    for (const file of files) data.append(field, file, file.webkitRelativePath || file.name);
    const response = await fetch(path, { method: "POST", body: data });
    const body = await response.json().catch(() => ({}));
    if (!response.ok) {
      throw new FieldError(field === "file" ? "spec.module_cid" : "files", body.detail || response.statusText);
    }
    return body.cid;
  }

  // ---------------------------------------------------------------- fund
  async function fund(event) {
    event.preventDefault();
    clearErrors();
    const button = $("fund");
    button.disabled = true;
    status.classList.remove("hidden");
    try {
      const wasm = radio("executor") === "wasm";
      const moduleFile = wasm && $("module-file").files[0];
      const datasetFiles = radio("dataset_mode") === "upload" ? [...$("dataset-files").files] : [];
      if (radio("dataset_mode") === "upload" && !datasetFiles.length) {
        throw new FieldError("files", "Choose the dataset's files, or pick another dataset option.");
      }
      GM.notice(status, "info", "Connecting the wallet…");
      const from = await GM.connect();

      GM.notice(status, "info", "Checking the job…");
      const placeholders = {
        module: moduleFile ? PLACEHOLDER_CID : null,
        dataset: datasetFiles.length ? PLACEHOLDER_CID : null,
      };
      const checked = await GM.api("/api/jobs/prepare", { ...request(buildSpec(placeholders)), from, dry_run: true });
      let permit = null;
      if (!cur().eth && !checked.tx && checked.funding) {  // the token amount to allow first
        permit = await GM.allow(checked.funding, (text) => GM.notice(status, "info", text));
      }

      const cids = {};
      if (moduleFile) {
        GM.notice(status, "info", `Uploading ${moduleFile.name} to IPFS…`);
        cids.module = await upload("/api/uploads/module", "file", [moduleFile]);
      }
      if (datasetFiles.length) {
        GM.notice(status, "info", `Uploading ${datasetFiles.length} dataset file(s) to IPFS…`);
        cids.dataset = await upload("/api/uploads/dataset", "files", datasetFiles);
      }
      const spec = buildSpec(cids);
      $("spec-preview").textContent = JSON.stringify(spec, null, 2);
      GM.notice(status, "info", "Preparing the transaction…");
      const prepared = await GM.api("/api/jobs/prepare", { ...request(spec), from, ...(permit ? { permit } : {}) });
      // the spec as stored (a spot job's with the commitment and sealed seed drawn by the server)
      if (prepared.spec) $("spec-preview").textContent = JSON.stringify(prepared.spec, null, 2);
      GM.notice(status, "info", "Confirm the transaction in your wallet…");
      const hash = await GM.send(prepared.tx);
      GM.notice(status, "info", `Sent ${GM.short(hash)}; waiting for a block…`);
      const mined = await GM.waitTx(hash);
      // a spot job's transaction sends twice the bounty (prepared.funding_wei): its check deposit
      const fn = !cur().eth ? "createJobWith" : "createJob";
      if (mined.status !== "success") {
        const why = mined.error ? `: ${mined.error}` : "";
        const err = new Error(`${fn} reverted (transaction ${hash})${why}. Nothing was funded; the form is kept as it was.`);
        if (/JobEscrowOperatorChanged/.test(mined.error || "")) err.field = "operator";
        throw err;
      }
      GM.notice(status, "ok", "Funded. Opening the job…");
      window.location = prepared.job_url;
    } catch (err) {
      if (err.field === "operator") await operatorChanged(err.message);
      else if (err.field) showError(err.field, err.message);
      else GM.notice(status, "error", err.message || String(err));
      button.disabled = false;
    }
  }

  form.addEventListener("change", (e) => {
    toggle();
    if (e.target.id === "currency") showCurrency();
    showTerms();
    if (!["bounty", "mediator", "collateral"].includes(e.target.id) && e.target.name !== "payment") scheduleQuote();
  });
  form.addEventListener("input", (e) => {
    clearError(e.target);
    if (["bounty", "collateral"].includes(e.target.id)) showTerms();
    if (["cpu", "ram", "disk", "gpus", "vram", "min-cuda", "min-cc", "timeout"].includes(e.target.id)) scheduleQuote();
  });
  form.addEventListener("submit", fund);
  showCurrency();
  toggle();
  showTerms();
  quote();
})();
