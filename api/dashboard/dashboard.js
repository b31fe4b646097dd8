// The tierpoint dashboard: plain JavaScript over the API's operator views, no build step.
// Every string from the API goes into the page through textContent, never as HTML.
"use strict";

const REFRESH_MS = 3000;
const TOKEN_KEY = "tierpoint.token";
const STATES = ["restorable", "pending", "failed", "expiring", "expired", "quarantined"];

let selectedJob = null;
let timer = null;

// -- formatting ----------------------------------------------------------------------------

function bytes(n) {
  if (n === null || n === undefined) return "-";
  const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let v = n;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
  return `${v >= 100 || i === 0 ? v.toFixed(0) : v.toFixed(1)} ${units[i]}`;
}

function duration(s) {
  if (s === null || s === undefined) return "-";
  if (s < 1) return "<1s";
  if (s < 90) return `${Math.round(s)}s`;
  if (s < 5400) return `${Math.round(s / 60)}m`;
  if (s < 172800) return `${(s / 3600).toFixed(1)}h`;
  return `${(s / 86400).toFixed(1)}d`;
}

// "4 minutes", "2.5 hours": an age said in words, where a bare "4m" read as a distance.
function durationWords(s) {
  if (s === null || s === undefined) return "-";
  const plural = (n, unit) => `${n} ${unit}${n === 1 ? "" : "s"}`;
  if (s < 90) return plural(Math.max(0, Math.round(s)), "second");
  if (s < 5400) return plural(Math.round(s / 60), "minute");
  if (s < 172800) return `${(s / 3600).toFixed(1)} hours`;
  return `${(s / 86400).toFixed(1)} days`;
}

function ago(iso) {
  if (!iso) return "never";
  return `${duration((Date.now() - Date.parse(iso)) / 1000)} ago`;
}

function dollars(x) {
  return x >= 1 ? `$${x.toLocaleString(undefined, { maximumFractionDigits: 0 })}` : `$${x.toFixed(2)}`;
}

// -- DOM helpers ---------------------------------------------------------------------------

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    // Through the CSSOM: the page's CSP allows no inline style attributes.
    else if (k === "style") node.style.cssText = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c);
  return node;
}

function fill(tbody, rows, columns, empty) {
  tbody.replaceChildren();
  if (rows.length === 0) {
    tbody.append(el("tr", {}, el("td", { class: "empty", colspan: String(columns), text: empty })));
    return;
  }
  for (const r of rows) tbody.append(r);
}

// A list's count: "50 of 62" where the list is cut.
function counted(page) {
  const total = page.total === undefined ? page.items.length : page.total;
  return total > page.items.length ? `${page.items.length} of ${total}` : String(total);
}

function pill(n, kind) {
  return el("span", { class: `pill ${n ? kind : "zero"}`, text: String(n) });
}

// -- API -----------------------------------------------------------------------------------

class Unauthorized extends Error {}

async function api(path, options = {}) {
  const headers = { Accept: "application/json" };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = `Bearer ${token}`;
  const r = await fetch(path, { ...options, headers: { ...headers, ...(options.headers || {}) } });
  if (r.status === 401) throw new Unauthorized("the API wants a token");
  const body = r.status === 204 ? null : await r.json();
  if (!r.ok) {
    const err = new Error(body && body.detail ? body.detail : `${r.status} ${r.statusText}`);
    err.problem = body;
    throw err;
  }
  return body;
}

function showError(message) {
  const banner = document.getElementById("error");
  banner.hidden = !message;
  banner.textContent = message || "";
}

// -- sections ------------------------------------------------------------------------------

function pointCell(p) {
  if (p.latest_step === null) {
    return el("td", {}, el("span", { class: "point none" }, el("span", { class: "step", text: "none" })));
  }
  const age = p.age_seconds;
  const freshness = age < 3600 ? "fresh" : age < 6 * 3600 ? "stale" : "old";
  const behind = p.steps_behind ? `${p.steps_behind} steps behind · ` : "";
  const predicted = p.predicted_restore_seconds;
  const restore = predicted === null || predicted === undefined
    ? "" : `restore ${predicted < 1 ? "<1s" : `~${duration(predicted)}`}`;
  return el(
    "td",
    { title: `restorable ${ago(p.restorable_at)}; ${bytes(p.bytes)} in ${p.checkpoints} checkpoints` },
    el(
      "span",
      { class: `point ${freshness}` },
      el("span", { class: "step", text: `step ${p.latest_step}` }),
      el("span", { class: "age", text: `${behind}${durationWords(age)} old` }),
      restore ? el("span", { class: "age restore", text: restore }) : "",
    ),
  );
}

// Steps trained since the newest checkpoint durable on the last tier / restorable anywhere.
function riskCell(j) {
  if (j.latest_step === null) return el("td", { text: "-" });
  const part = (n) => el("span", { class: n === null ? "risk all" : n ? "risk some" : "risk none", text: n === null ? "all" : String(n) });
  return el("td", { class: "num", title: "steps at risk: since the newest checkpoint on the last tier / on any tier" },
    part(j.steps_at_risk_durable), " / ", part(j.steps_at_risk));
}

function renderJobs(page, tiers) {
  const thead = document.querySelector("#jobs thead");
  thead.replaceChildren(
    el(
      "tr",
      {},
      el("th", { text: "job" }),
      el("th", { text: "latest" }),
      el("th", { text: "steps at risk", title: "durable on the last tier / anywhere" }),
      ...tiers.map((t) => el("th", { text: t })),
      el("th", { text: "in flight" }),
      el("th", { text: "failed" }),
      el("th", { text: "$/month" }),
    ),
  );
  const rows = page.items.map((j) =>
    el(
      "tr",
      { class: "clickable", "data-job": j.job, onclick: () => openJob(j.job) },
      el("td", {}, el("b", { text: j.job }), el("div", { class: "muted", text: j.policy || "default policy" })),
      el("td", { class: "step", text: j.latest_step === null ? "-" : `step ${j.latest_step}` }),
      riskCell(j),
      ...j.tiers.map(pointCell),
      el("td", {}, pill(j.in_flight, "busy")),
      el("td", {}, pill(j.failed, "bad")),
      el("td", { class: "num", text: dollars(j.monthly_cost) }),
    ),
  );
  fill(document.querySelector("#jobs tbody"), rows, tiers.length + 6, "no job has registered a checkpoint yet");
  document.getElementById("jobs-count").textContent = counted(page);
}

function renderInFlight(list) {
  const rows = list.items.map((c) => {
    const pct = c.bytes_total ? Math.min(100, (100 * c.bytes_done) / c.bytes_total) : 0;
    return el(
      "tr",
      { "data-copy": `${c.job}/${c.step}/${c.tier}` },
      el("td", { text: `${c.job} @ ${c.step}` }),
      el("td", { text: c.tier }),
      el(
        "td",
        { class: "grow" },
        el(
          "div",
          { class: "bar", role: "progressbar", "aria-valuenow": pct.toFixed(0), "aria-valuemin": "0", "aria-valuemax": "100" },
          el("div", { style: `width:${pct.toFixed(1)}%` }),
          el("span", { text: `${bytes(c.bytes_done)} / ${bytes(c.bytes_total)} · ${c.shards_verified}/${c.shards_total} shards` }),
        ),
        c.last_error ? el("div", { class: "reason", text: c.last_error }) : "",
      ),
      el("td", { class: "num", text: c.bytes_per_second ? `${bytes(c.bytes_per_second)}/s` : c.last_error ? "stuck" : "waiting" }),
      el("td", { class: "num", text: c.eta_seconds === null ? "-" : duration(c.eta_seconds) }),
    );
  });
  fill(document.querySelector("#inflight tbody"), rows, 5, "nothing in flight");
  document.getElementById("inflight-count").textContent = counted(list);
}

async function retry(job, step, button) {
  button.disabled = true;
  button.textContent = "retrying…";
  try {
    const out = await api(`/v1/jobs/${encodeURIComponent(job)}/checkpoints/${step}/retry`, { method: "POST" });
    button.textContent = `started ${out.tiers.join(", ")}`;
    refresh();
  } catch (e) {
    button.disabled = false;
    button.textContent = "retry";
    showError(`retry of ${job} @ ${step}: ${e.message}`);
  }
}

async function acknowledge(job, step, tier, button) {
  button.disabled = true;
  try {
    await api(`/v1/jobs/${encodeURIComponent(job)}/checkpoints/${step}/acknowledge`, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ tier }),
    });
    refresh();
  } catch (e) {
    button.disabled = false;
    showError(`acknowledging ${job} @ ${step} on ${tier}: ${e.message}`);
  }
}

// Why no retry can help, in a few words (the full problem detail is the title).
const NO_RETRY = {
  no_verified_source: "no copy left to copy from",
  copy_on_lost_node: "its node was declared lost",
  repair_in_progress: "a repair is copying it back",
};

function renderFailures(page) {
  // One retry per checkpoint: the tiers after a failed one fail with it.
  const seen = new Set();
  const rows = page.items.map((f) => {
    const key = `${f.job}/${f.step}`;
    const first = !seen.has(key);
    seen.add(key);
    let retryCell = "";
    if (first && f.retryable) {
      retryCell = el("button", { type: "button", class: "small", text: "retry" });
      retryCell.addEventListener("click", () => retry(f.job, f.step, retryCell));
    } else if (!f.retryable) {
      const refused = f.retry_refused;
      retryCell = el("span", { class: "no-retry", title: refused.why,
        text: `no retry: ${NO_RETRY[refused.code] || refused.code}` });
    }
    const ack = el("button", { type: "button", class: "small secondary", text: "acknowledge",
      title: "clear it from this list (it stays in the checkpoint's history)" });
    ack.addEventListener("click", () => acknowledge(f.job, f.step, f.tier, ack));
    return el(
      "tr",
      { "data-failure": `${key}/${f.tier}` },
      el("td", { text: `${f.job} @ ${f.step}` }),
      el("td", { text: f.tier }),
      el("td", { class: "grow" }, el("div", { class: "reason", text: f.reason || "" }),
        f.last_error ? el("div", { class: "muted", text: f.last_error }) : ""),
      el("td", { text: ago(f.failed_at) }),
      el("td", { class: "actions" }, retryCell, ack),
    );
  });
  fill(document.querySelector("#failures tbody"), rows, 5, failureFilter() ? "no failure matches" : "no failures");
  document.getElementById("failures-count").textContent = counted(page);
  const bulk = document.getElementById("failures-ack");
  bulk.disabled = !failureFilter() || page.total === 0;
  bulk.textContent = failureFilter() ? `acknowledge ${page.total} matching` : "acknowledge matching";
  bulk.dataset.until = page.now;
}

// The failures filter: { job, reason } as typed, or null when both are empty.
function failureFilter() {
  const job = document.getElementById("failures-job").value.trim();
  const reason = document.getElementById("failures-reason").value.trim();
  if (!job && !reason) return null;
  const f = {};
  if (job) f.job = job;
  if (reason) f.reason = reason;
  return f;
}

function failuresPath() {
  const params = new URLSearchParams({ limit: "50", ...(failureFilter() || {}) });
  return `/v1/failures?${params}`;
}

// Every failure the filter matches, as of the list shown (one that came later stays listed).
async function acknowledgeMatching(button) {
  const filter = failureFilter();
  if (!filter) return;
  button.disabled = true;
  try {
    const out = await api("/v1/failures/acknowledge", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ ...filter, until: button.dataset.until }),
    });
    button.textContent = `acknowledged ${out.acknowledged}`;
    refresh();
  } catch (e) {
    button.disabled = false;
    showError(`acknowledging failures matching ${JSON.stringify(filter)}: ${e.message}`);
  }
}

function renderUsage(list) {
  const box = document.getElementById("usage");
  box.replaceChildren();
  const max = Math.max(1, ...list.items.map((t) => t.capacity_bytes || t.bytes));
  for (const t of list.items) {
    const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
    svg.setAttribute("viewBox", "0 0 100 10");
    svg.setAttribute("preserveAspectRatio", "none");
    const scale = t.capacity_bytes || max;
    const rect = (x, w, color) => {
      const r = document.createElementNS("http://www.w3.org/2000/svg", "rect");
      r.setAttribute("x", String(x));
      r.setAttribute("y", "1");
      r.setAttribute("width", String(Math.max(w, 0)));
      r.setAttribute("height", "8");
      r.setAttribute("rx", "1.5");
      r.setAttribute("fill", color);
      svg.append(r);
    };
    rect(0, 100, "#eef1f6");
    if (t.capacity_bytes) {
      const used = t.capacity_bytes - (t.free_bytes || 0);
      rect(0, (100 * used) / scale, "#c9d6ee");
    }
    rect(0, Math.max((100 * t.bytes) / scale, t.bytes ? 0.8 : 0), "#2f6fed");
    const space = t.capacity_bytes ? `${bytes(t.free_bytes)} free of ${bytes(t.capacity_bytes)}` : `${t.checkpoints} copies`;
    // A coded tier holds its stripes, (k+m)/k of the files' bytes: that is what it costs.
    const held = t.code ? `${bytes(t.held_bytes)} held in stripes · ` : "";
    box.append(
      el(
        "div",
        { class: "usage-row", "data-tier": t.tier },
        el("div", { class: "name", text: t.tier }, el("small", { text: t.code ? `${t.kind} ${t.code}` : t.kind })),
        svg,
        el("div", { class: "figures" }, el("b", { text: bytes(t.bytes) }), el("div", { class: "muted", text: `${held}${space} · ${dollars(t.monthly_cost)}/mo` })),
      ),
    );
    if (t.jobs.length) {
      box.append(el("div", { class: "usage-jobs", text: t.jobs.slice(0, 3).map((j) => `${j.job} ${bytes(j.bytes)}`).join(" · ") }));
    }
  }
}

function renderLag(list) {
  const rows = list.items.map((l) =>
    el(
      "tr",
      {},
      el("td", { text: l.job }),
      el("td", { text: l.tier }),
      el("td", { class: "num", text: String(l.count) }),
      el("td", { class: "num", text: duration(l.p50_seconds) }),
      el("td", { class: "num", text: duration(l.p95_seconds) }),
      el("td", { class: "num", text: duration(l.max_seconds) }),
    ),
  );
  fill(document.querySelector("#lag tbody"), rows, 6, "nothing promoted in the last day");
}

function renderNodes(list) {
  const rows = list.items.map((n) =>
    el(
      "tr",
      { "data-node": n.id },
      el("td", { text: n.id }),
      el("td", n.failure_domain ? { text: n.failure_domain } : { class: "muted", title: "none reported: a domain of its own", text: "none" }),
      el("td", { text: ago(n.last_seen_at) }),
      el("td", { class: "num", text: bytes(n.local_bytes) }),
      el("td", {}, n.lost_at ? el("span", { class: "pill bad", text: "lost" }) : el("span", { class: "pill ok", text: "ok" })),
    ),
  );
  fill(document.querySelector("#nodes tbody"), rows, 5, "no node has reported in");
}

function renderSummary(jobs, inflight, failures, usage) {
  const stat = (value, label, bad) =>
    el("div", { class: `stat${bad ? " bad" : ""}` }, el("b", { text: value }), el("span", { text: label }));
  const box = document.getElementById("summary");
  box.replaceChildren(
    stat(String(jobs.total), "jobs"),
    stat(String(inflight.total), "copies in flight"),
    stat(String(failures.total), "failures", failures.total > 0),
    ...usage.items.map((t) => stat(bytes(t.bytes), t.tier)),
  );
}

// -- one job's checkpoints -----------------------------------------------------------------

function stateOf(tier) {
  return tier.quarantine_reason ? "quarantined" : tier.state;
}

// A coded copy's sets in words: "rs(8,2): 41 of 42 sets whole, 1 degraded (1 stripe short), margin 1".
function coverageText(c) {
  const parts = [`${c.whole} of ${c.sets} sets whole`];
  if (c.degraded) parts.push(`${c.degraded} degraded (${c.stripes_short} stripe${c.stripes_short === 1 ? "" : "s"} short)`);
  if (c.below_k) parts.push(`${c.below_k} below k`);
  parts.push(`margin ${c.least_margin === null ? "-" : c.least_margin}`);
  return `${c.code}: ${parts.join(", ")}`;
}

// How many more lost stripes the weakest set of a coded copy survives, as a small badge.
function marginBadge(c) {
  const kind = c.below_k ? "bad" : c.degraded ? "busy" : "ok";
  const m = c.least_margin === null ? "-" : String(c.least_margin);
  return el("span", { class: `pill margin ${kind}`, title: coverageText(c), text: `margin ${m}` });
}

async function renderJob(tiers) {
  if (!selectedJob) return;
  const page = await api(`/v1/jobs/${encodeURIComponent(selectedJob)}/checkpoints?limit=25`);
  document.getElementById("job-title").textContent = `${selectedJob}: checkpoints`;
  document.querySelector("#matrix thead").replaceChildren(
    el("tr", {}, el("th", { text: "step" }), el("th", { text: "registered" }), el("th", { text: "size" }), ...tiers.map((t) => el("th", { text: t }))),
  );
  const rows = page.items.map((c) => {
    const byTier = Object.fromEntries(c.tiers.map((t) => [t.tier, t]));
    return el(
      "tr",
      { "data-step": String(c.step), "data-branch": String(c.branch || 1), class: c.superseded_by ? "superseded" : "" },
      el("td", { class: "step" }, el("b", { text: String(c.step) }),
        c.branch > 1 ? el("span", { class: "branch", text: ` b${c.branch}` }) : "",
        c.superseded_by ? el("span", { class: "muted", text: " superseded" }) : "",
        c.health ? el("span", { class: `pill ${c.health.verdict === "bad" ? "bad" : c.health.verdict}`, text: c.health.verdict }) : "",
        c.pinned ? el("span", { class: "muted", text: " pinned" }) : "",
        c.deleted_at ? el("span", { class: "pill bad deleted", text: "deleted", title: `deleted ${ago(c.deleted_at)}` }) : ""),
      el("td", { text: ago(c.created_at) }),
      el("td", { class: "num", text: bytes(c.total_bytes) }),
      ...tiers.map((name) => {
        const t = byTier[name];
        if (!t) return el("td", {}, el("span", { class: "cell absent", text: "not sent" }));
        const s = stateOf(t);
        const pct = t.progress && t.progress.bytes_total ? Math.floor((100 * t.progress.bytes_done) / t.progress.bytes_total) : 0;
        const label = s === "pending" ? `pending ${pct}%` : s;
        const coded = t.coverage && s !== "expiring" && s !== "expired" ? t.coverage : null;
        return el("td", { class: coded ? "coded" : "" }, el("span", {
          class: `cell ${s}`,
          title: [t.reason || t.quarantine_reason || s, coded ? coverageText(coded) : ""].filter(Boolean).join("\n"),
          text: label,
          onclick: () => showDetail(selectedJob, c.step),
        }), coded ? marginBadge(coded) : "");
      }),
    );
  });
  fill(document.querySelector("#matrix tbody"), rows, tiers.length + 3, "no checkpoints");
  renderTimeline(selectedJob, await timelineData(selectedJob), document.getElementById("timeline"));
}

// A job's page is the URL #job=<name>: shared, bookmarked, and kept across a reload.
function jobFromHash() {
  const m = /(?:^|&)job=([^&]+)/.exec(location.hash.slice(1));
  return m ? decodeURIComponent(m[1]) : null;
}

function openJob(job) {
  const hash = `#job=${encodeURIComponent(job)}`;
  if (location.hash === hash) selectJob(job);
  else location.hash = hash; // hashchange selects it
}

async function selectJob(job) {
  selectedJob = job;
  const panel = document.getElementById("job-panel");
  panel.hidden = !job;
  if (!job) return;
  await refresh();
  // Once its rows are in: scrolled to before, the panel grew below the fold.
  panel.scrollIntoView({ block: "start" });
}

// An event's detail as "key: value" lines: lists joined, nested objects one level deep.
function detailText(d) {
  const value = (v) => {
    if (v === null || v === undefined) return "-";
    if (Array.isArray(v)) return v.length ? v.map(value).join(", ") : "none";
    if (typeof v === "object") return Object.entries(v).map(([k, x]) => `${k} ${value(x)}`).join("; ");
    return String(v);
  };
  return el("div", { class: "detail" },
    ...Object.entries(d || {}).map(([k, v]) => el("div", {}, el("span", { class: "k", text: `${k.replaceAll("_", " ")}: ` }), el("span", { text: value(v) }))));
}

async function showDetail(job, step) {
  const [cp, events] = await Promise.all([
    api(`/v1/jobs/${encodeURIComponent(job)}/checkpoints/${step}`),
    api(`/v1/jobs/${encodeURIComponent(job)}/checkpoints/${step}/events`),
  ]);
  document.getElementById("detail-title").textContent = `${job} @ step ${step}`;
  const body = document.getElementById("detail-body");
  const kv = el("dl", { class: "kv" });
  for (const [k, v] of [["registered", cp.created_at], ["size", `${bytes(cp.total_bytes)} in ${cp.shard_count} shards`], ["pinned", cp.pinned ? "yes" : "no"], ["quarantine", cp.quarantine_reason || "-"], ["deleted", cp.deleted_at || "no"]]) {
    kv.append(el("dt", { text: k }), el("dd", { text: v }));
  }
  const tierRows = cp.tiers.map((t) => el("tr", {},
    el("td", { text: t.tier }),
    el("td", {}, el("span", { class: `cell ${stateOf(t)}`, text: stateOf(t) })),
    el("td", { class: "grow reason" },
      t.coverage ? el("div", { class: "coverage", text: coverageText(t.coverage) }) : "",
      t.reason || t.quarantine_reason || ""),
    el("td", { text: t.restorable_at ? ago(t.restorable_at) : "-" })));
  const stripes = await stripesSections(job, step, cp);
  const eventRows = events.items.map((e) => el("tr", {},
    el("td", { text: new Date(e.created_at).toLocaleTimeString() }),
    el("td", { text: e.kind }),
    el("td", { text: e.tier || "" }),
    el("td", { text: e.actor || "" }),
    el("td", { class: "grow muted" }, detailText(e.detail))));
  body.replaceChildren(
    kv,
    el("h4", { text: "tiers" }),
    el("table", {}, el("tbody", {}, ...tierRows)),
    ...stripes,
    el("h4", { text: `events (${events.items.length})` }),
    el("table", { id: "events" }, el("tbody", {}, ...eventRows)),
  );
  document.getElementById("detail").showModal();
}

// -- refresh loop --------------------------------------------------------------------------

async function refresh() {
  clearTimeout(timer);
  try {
    const tiers = (await api("/v1/tiers")).map((t) => t.name);
    const [jobs, inflight, failures, usage, lag, nodes, filtered] = await Promise.all([
      api("/v1/overview/jobs?limit=100"),
      api("/v1/copies/in-flight?limit=100"),
      api("/v1/failures?limit=50"),
      api("/v1/tiers/usage"),
      api("/v1/lag?window_seconds=86400"),
      api("/v1/nodes"),
      failureFilter() ? api(failuresPath()) : null,
    ]);
    renderSummary(jobs, inflight, failures, usage);
    renderJobs(jobs, tiers);
    renderInFlight(inflight);
    renderFailures(filtered || failures);
    renderUsage(usage);
    renderLag(lag);
    renderNodes(nodes);
    await renderJob(tiers);
    showError(null);
    document.getElementById("refreshed").textContent = `updated ${new Date().toLocaleTimeString()}`;
  } catch (e) {
    if (e instanceof Unauthorized) {
      showError("The API wants a token: open the 'dashboard:' link that tierpoint dev prints, or press 'token' and paste one (TIERPOINT_TOKEN in its stack.env).");
    } else {
      showError(`Cannot read the API: ${e.message}`);
    }
  }
  if (document.getElementById("auto").checked) timer = setTimeout(refresh, REFRESH_MS);
}

function setUp() {
  const legend = document.getElementById("legend");
  for (const s of STATES) legend.append(el("span", { style: `--c: var(--${s === "restorable" ? "ok" : s})`, text: s }));
  document.getElementById("auto").addEventListener("change", refresh);
  for (const id of ["failures-job", "failures-reason"]) {
    document.getElementById(id).addEventListener("change", refresh);
  }
  const bulk = document.getElementById("failures-ack");
  bulk.addEventListener("click", () => acknowledgeMatching(bulk));
  // Scrolling to a panel (a job's page) stops below the sticky header, however tall it wraps.
  const header = document.querySelector("header");
  new ResizeObserver(() => {
    document.documentElement.style.setProperty("--header-height", `${header.offsetHeight}px`);
  }).observe(header);
  document.getElementById("job-close").addEventListener("click", () => {
    history.pushState(null, "", location.pathname + location.search);
    selectJob(null);
  });
  window.addEventListener("hashchange", () => selectJob(jobFromHash()));
  document.getElementById("detail-close").addEventListener("click", () => document.getElementById("detail").close());
  const dialog = document.getElementById("token-dialog");
  document.getElementById("token-button").addEventListener("click", () => dialog.showModal());
  document.getElementById("token-form").addEventListener("submit", (ev) => {
    if (ev.submitter && ev.submitter.value === "save") {
      const value = document.getElementById("token-input").value.trim();
      if (value) sessionStorage.setItem(TOKEN_KEY, value);
      else sessionStorage.removeItem(TOKEN_KEY);
      refresh();
    }
  });
  // A token in the URL fragment (#token=...) never reaches a server log.
  const m = /(?:^|&)token=([^&]+)/.exec(location.hash.slice(1));
  if (m) {
    sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(m[1]));
    const rest = location.hash.slice(1).split("&").filter((p) => !p.startsWith("token=")).join("&");
    history.replaceState(null, "", location.pathname + location.search + (rest ? `#${rest}` : ""));
  }
  const job = jobFromHash();
  if (job) selectJob(job);
  else refresh();
}

document.addEventListener("DOMContentLoaded", setUp);
