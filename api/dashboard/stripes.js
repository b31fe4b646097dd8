// A coded copy's stripes in a checkpoint's detail: one row per shard, one cell per stripe index
// (data stripes, then parity) naming its holder. A stripe that counts (verified, on a holder not
// declared lost) is green; one found bad, lost or on a lost holder is red and says why; one not
// yet verified is amber. Every string from the API is set as text, never as markup.
"use strict";

const STRIPE_SHARDS = 100; // shards shown per coded copy; the detail says how many are left out

// [data stripes, parity stripes] of "rs(k,m)", or null.
function codeWidth(code) {
  const m = /^rs\((\d+),(\d+)\)$/.exec(code || "");
  return m ? [Number(m[1]), Number(m[2])] : null;
}

function stripeCell(s) {
  if (!s) return el("td", {}, el("span", { class: "stripe bad", text: "not held" }));
  const counts = s.state === "verified" && !s.holder_lost;
  const why = s.holder_lost ? "holder lost" : s.state;
  const kind = counts ? "ok" : s.state === "pending" || s.state === "copying" ? "busy" : "bad";
  const title = [`stripe ${s.index} on ${s.node}: ${why}`, `${bytes(s.size)}, crc32c ${s.crc32c}`, s.error || ""];
  return el("td", {}, el("span", {
    class: `stripe ${kind}`,
    "data-index": String(s.index),
    title: title.filter(Boolean).join("\n"),
    text: counts ? s.node : `${s.node} · ${why}`,
  }));
}

function stripesTable(tier, page, shardCount) {
  const code = page.items.map((sh) => codeWidth(sh.code)).find(Boolean);
  const listed = Math.max(0, ...page.items.flatMap((sh) => sh.stripes.map((s) => s.index + 1)));
  const width = code ? code[0] + code[1] : listed;
  const label = (i) => (code ? (i < code[0] ? `data ${i}` : `parity ${i - code[0]}`) : `stripe ${i}`);
  const head = el("tr", {}, el("th", { text: "shard" }), ...Array.from({ length: width }, (_, i) => el("th", { text: label(i) })));
  const rows = page.items.map((sh) => {
    const byIndex = Object.fromEntries(sh.stripes.map((s) => [s.index, s]));
    return el("tr", { "data-path": sh.path }, el("td", { class: "path", text: sh.path }),
      ...Array.from({ length: width }, (_, i) => stripeCell(byIndex[i])));
  });
  const part = page.next_cursor ? ` (the first ${page.items.length} of ${shardCount} shards)` : "";
  return [
    el("h4", { text: `stripes on ${tier}${part}` }),
    el("table", { class: "stripes", "data-tier": tier }, el("thead", {}, head), el("tbody", {}, ...rows)),
  ];
}

// The stripes of each coded copy of checkpoint `cp` (a tier copy with a coverage).
async function stripesSections(job, step, cp) {
  const coded = cp.tiers.filter((t) => t.coverage);
  const pages = await Promise.all(coded.map((t) => api(
    `/v1/jobs/${encodeURIComponent(job)}/checkpoints/${step}/tiers/${encodeURIComponent(t.tier)}/stripes?limit=${STRIPE_SHARDS}`,
  )));
  return coded.flatMap((t, i) => stripesTable(t.tier, pages[i], cp.shard_count));
}
