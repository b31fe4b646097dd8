// A job's timeline on its page: steps along x, one lane per branch (a rollback starts one at its
// branch point, drawn from the lane it left), superseded checkpoints greyed, health verdicts
// coloured, and a fork linked to its parent job. SVG built through the DOM, every string from
// the API set as text, never as markup (the page's CSP allows no inline code either).
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const LANE = 34; // px between lanes
const PAD = { left: 120, right: 24, top: 18, bottom: 28 };

function svg(tag, attrs = {}, text) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = text;
  return node;
}

// What a checkpoint's mark says: its verdict, or superseded, or neither.
function markClass(c) {
  const verdict = c.health ? c.health.verdict : "none";
  return `mark verdict-${verdict}${c.superseded_by ? " superseded" : ""}`;
}

function markTitle(c) {
  const parts = [`step ${c.step} on branch ${c.branch}`];
  if (c.health) {
    const h = c.health;
    const evidence = h.metric ? ` (${h.metric} ${h.value}${h.at_step !== null ? ` at step ${h.at_step}` : ""})` : "";
    parts.push(`${h.verdict}${evidence}${h.by ? ` by ${h.by}` : ""}`);
  } else {
    parts.push("no verdict");
  }
  if (c.superseded_by) parts.push(`superseded by branch ${c.superseded_by}`);
  if (c.quarantine_reason) parts.push(`quarantined: ${c.quarantine_reason}`);
  if (c.parent) parts.push(`parent ${c.parent.job} @ ${c.parent.step} (branch ${c.parent.branch})`);
  return parts.join("; ");
}

// The job's checkpoints (every page, newest first, at most `limit`) and its branches.
async function timelineData(job, limit = 500) {
  const base = `/v1/jobs/${encodeURIComponent(job)}`;
  const items = [];
  let cursor = null;
  do {
    const params = new URLSearchParams({ limit: "200" });
    if (cursor) params.set("cursor", cursor);
    const page = await api(`${base}/checkpoints?${params}`);
    items.push(...page.items);
    cursor = page.next_cursor;
  } while (cursor && items.length < limit);
  let branches;
  try {
    branches = await api(`${base}/branches`);
  } catch (e) {
    branches = { current: 1, items: [{ number: 1, parent: null, from_step: null }] };
  }
  return { items, branches };
}

function renderTimeline(job, data, box) {
  const { items, branches } = data;
  box.replaceChildren();
  if (items.length === 0) {
    box.append(el("p", { class: "muted", text: "no checkpoints yet" }));
    return;
  }
  const lanes = branches.items.map((b) => b.number).sort((a, b) => a - b);
  for (const c of items) if (!lanes.includes(c.branch)) lanes.push(c.branch);
  const laneOf = (n) => lanes.indexOf(n);
  const steps = items.map((c) => c.step).concat(branches.items.filter((b) => b.from_step !== null).map((b) => b.from_step));
  const lo = Math.min(...steps);
  const hi = Math.max(...steps);
  const first = [...items].sort((a, b) => a.step - b.step)[0];
  const forked = first.parent && first.parent.job !== job ? first.parent : null;
  const top = PAD.top + (forked ? 22 : 0); // room above the lanes for the fork's link
  const width = Math.max(480, box.clientWidth || 800);
  const height = top + PAD.bottom + LANE * (lanes.length - 1);
  const x = (s) => PAD.left + (hi === lo ? 0.5 : (s - lo) / (hi - lo)) * (width - PAD.left - PAD.right);
  const y = (n) => top + LANE * laneOf(n);
  const root = svg("svg", { viewBox: `0 0 ${width} ${height}`, width, height, role: "img", "aria-label": `${job}: timeline` });

  // Step axis: a few ticks along the bottom.
  const axis = svg("g", { class: "axis" });
  const ticks = hi === lo ? [lo] : [0, 0.25, 0.5, 0.75, 1].map((f) => Math.round(lo + f * (hi - lo)));
  for (const t of [...new Set(ticks)]) {
    axis.append(svg("line", { x1: x(t), x2: x(t), y1: top - 8, y2: height - PAD.bottom + 4 }));
    axis.append(svg("text", { x: x(t), y: height - 8, "text-anchor": "middle" }, `step ${t}`));
  }
  root.append(axis);

  // Lanes: from the branch point (or the first step) to the branch's newest step, and the
  // link from the lane it was rolled back from.
  for (const b of branches.items) {
    const own = items.filter((c) => c.branch === b.number).map((c) => c.step);
    const start = b.from_step !== null ? b.from_step : Math.min(...own, hi);
    const end = Math.max(start, ...own);
    const lane = svg("g", { class: `lane${b.number === branches.current ? " current" : ""}`, "data-branch": b.number });
    lane.append(svg("line", { class: "track", x1: x(start), x2: x(end), y1: y(b.number), y2: y(b.number) }));
    if (b.parent !== null && b.from_step !== null) {
      lane.append(svg("path", {
        class: "branch-link",
        d: `M ${x(b.from_step)} ${y(b.parent)} C ${x(b.from_step) + 18} ${y(b.parent)}, ${x(b.from_step)} ${y(b.number)}, ${x(b.from_step) + 18} ${y(b.number)}`,
      }));
    }
    const label = b.number === 1 ? "branch 1" : `branch ${b.number} (from ${b.from_step})`;
    lane.append(svg("text", { class: "lane-label", x: 8, y: y(b.number) + 4 }, label));
    root.append(lane);
  }

  // A fork: the first checkpoint's parent is another job's; the link opens that job's page.
  if (forked) {
    const label = `forked from ${forked.job} @ ${forked.step}`;
    // From the label's end (about 6.2 px a character at this size) to the job's first mark.
    const from = Math.min(12 + 6.2 * label.length, x(first.step) - 12);
    const link = svg("a", { class: "fork", href: `#job=${encodeURIComponent(forked.job)}`, "data-fork": forked.job });
    link.append(svg("path", { class: "fork-link", d: `M ${from} ${top - 18} L ${x(first.step)} ${y(first.branch)}` }));
    link.append(svg("text", { x: 8, y: top - 14 }, label));
    root.append(link);
  }

  for (const c of items) {
    const mark = svg("circle", {
      class: markClass(c),
      cx: x(c.step),
      cy: y(c.branch),
      r: c.quarantine_reason ? 7 : 6,
      "data-step": c.step,
      "data-branch": c.branch,
    });
    mark.append(svg("title", {}, markTitle(c)));
    mark.addEventListener("click", () => showDetail(job, c.step));
    root.append(mark);
  }
  box.append(root);
  const legend = el("div", { class: "legend timeline-legend" });
  for (const [cls, text] of [["verdict-good", "good"], ["verdict-suspect", "suspect"], ["verdict-bad", "bad (quarantined)"], ["verdict-none", "no verdict"], ["superseded", "superseded"]]) {
    legend.append(el("span", { class: `key ${cls}`, text }));
  }
  box.append(legend);
}
