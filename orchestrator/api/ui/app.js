// dayzero task timeline: a task list with filters and, per task, a waterfall of its steps and
// tool attempts, kept live by the task's SSE stream. Vanilla JS; every call carries the API key.
"use strict";

const $ = (sel) => document.querySelector(sel);
const state = { key: sessionStorage.getItem("dayzero.key") || "", selected: null, detail: null,
                stream: null, events: 0, lastEvent: "", refreshTimer: null };

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v; else if (k === "text") e.textContent = v; else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c);
  return e;
}

async function api(path) {
  const r = await fetch(path, { headers: { Authorization: "Bearer " + state.key } });
  if (r.status === 401) throw new Error("the API key was refused");
  if (!r.ok) throw new Error(`${path}: HTTP ${r.status}`);
  return r.json();
}

const ms = (t) => (t ? Date.parse(t) : NaN);
function fmtDuration(s) {
  if (!isFinite(s)) return "";
  if (s < 1) return `${Math.round(s * 1000)} ms`;
  if (s < 120) return `${s.toFixed(s < 10 ? 2 : 1)} s`;
  return `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
}
const fmtTime = (t) => new Date(t).toLocaleString();

// -- the task list --------------------------------------------------------------------------
async function loadList() {
  if (!state.key) return;
  const q = new URLSearchParams({ limit: "50" });
  if ($("#f-status").value) q.append("status", $("#f-status").value);
  if ($("#f-meta").value.trim()) q.append("metadata", $("#f-meta").value.trim());
  if ($("#f-after").value) q.append("created_after", new Date($("#f-after").value).toISOString());
  try {
    const page = await api("/v1/tasks?" + q);
    const body = $("#tasks tbody");
    body.replaceChildren(...page.items.map(taskRow));
    $("#list-msg").textContent = page.items.length ? "" : "no tasks match";
  } catch (err) {
    $("#list-msg").textContent = String(err.message || err);
  }
}

function taskRow(t) {
  const u = t.usage;
  const tr = el("tr", { "data-id": t.id, "data-status": t.status },
    el("td", { text: fmtTime(t.created_at) }),
    el("td", { class: "status s-" + t.status, text: t.status }),
    el("td", { text: String(u.steps) }),
    el("td", { text: `${u.prompt_tokens + u.completion_tokens} (${u.cached_tokens} cached)` }),
    el("td", { class: "id", text: t.id.slice(0, 8) }));
  if (t.id === state.selected) tr.classList.add("selected");
  tr.addEventListener("click", () => select(t.id));
  return tr;
}

// -- one task: waterfall ---------------------------------------------------------------------
async function select(id) {
  state.selected = id;
  document.querySelectorAll("#tasks tr").forEach((r) => r.classList.toggle("selected", r.dataset.id === id));
  $("#detail-pane").hidden = false;
  await refreshDetail();
  follow(id);
}

async function refreshDetail() {
  const id = state.selected;
  if (!id) return;
  try {
    const d = await api("/ui/api/tasks/" + encodeURIComponent(id));
    if (id !== state.selected) return;
    state.detail = d;
    render();
  } catch (err) {
    $("#live").textContent = String(err.message || err);
  }
}

function scheduleRefresh() {
  clearTimeout(state.refreshTimer);
  state.refreshTimer = setTimeout(() => { refreshDetail(); loadList(); }, 100);
}

function render() {
  const d = state.detail;
  if (!d) return;
  const t = d.task;
  const u = t.usage;
  const trace = d.trace_url
    ? el("a", { href: d.trace_url, target: "_blank", rel: "noopener", id: "trace-link", text: d.trace_id })
    : el("span", { id: "trace-id", text: d.trace_id || "none" });
  const fact = (k, v) => el("span", {}, k + " ", typeof v === "string" ? el("b", { text: v }) : v);
  $("#detail-head").replaceChildren(
    el("h2", { text: t.id }),
    el("div", { class: "facts" },
      fact("status", el("b", { class: "status s-" + t.status, text: t.status, id: "task-status" })),
      fact("steps", String(u.steps)),
      fact("tokens in", String(u.prompt_tokens)), fact("cached", String(u.cached_tokens)),
      fact("out", String(u.completion_tokens)),
      fact("duration", fmtDuration(((t.finished_at ? ms(t.finished_at) : Date.now()) - ms(t.created_at)) / 1000)),
      fact("trace", trace)),
    t.error ? el("div", { class: "row" }, el("div", { class: "err", text: "task error: " + JSON.stringify(t.error) })) : "");

  const t0 = ms(t.created_at);
  const ends = [Date.now()];
  if (t.finished_at) ends[0] = ms(t.finished_at);
  const span = Math.max(1, ends[0] - t0);
  const pos = (a, b) => ({ left: ((a - t0) / span) * 100, width: Math.max(0.2, ((b - a) / span) * 100) });
  const rows = d.steps.map((s) => stepRow(s, pos, t.finished_at ? ms(t.finished_at) : Date.now()));
  // Before its first step a task waits for a runner (and its attachments for preprocessing).
  const first = d.steps.length ? ms(d.steps[0].started_at || d.steps[0].created_at) : NaN;
  if (isFinite(first) && first > t0) rows.unshift(queuedRow(pos(t0, first), (first - t0) / 1000));
  $("#waterfall").replaceChildren(...rows);
}

function queuedRow(p, seconds) {
  const track = el("div", { class: "track" });
  const b = el("div", { class: "bar QUEUED", title: "waiting for a runner" });
  b.style.left = p.left + "%";
  b.style.width = p.width + "%";
  track.append(b);
  return el("div", { class: "row queued", role: "listitem" },
    el("div", { class: "label", text: "queued" }), track, el("div", { class: "info", text: fmtDuration(seconds) }));
}

function stepRow(s, pos, now) {
  const track = el("div", { class: "track" });
  const bar = (a, b, cls, title) => {
    const p = pos(a, b);
    const e = el("div", { class: "bar " + cls, title });
    e.style.left = p.left + "%";
    e.style.width = p.width + "%";
    track.append(e);
  };
  const errors = [];
  let total = 0;
  let tokens = "";
  s.attempts.forEach((a, i) => {
    if (i > 0) bar(ms(s.attempts[i - 1].finished_at), ms(a.started_at), "RETRY_WAIT", "retry backoff");
    const b = ms(a.finished_at);
    total += (b - ms(a.started_at)) / 1000;
    bar(ms(a.started_at), b, a.status, `attempt ${a.attempt}: ${a.status}`);
    if (a.error) errors.push(`attempt ${a.attempt} ${a.status}: ${a.error.kind || ""} ${a.error.message || a.error.error || ""}`);
    if (a.usage) {
      const ttft = a.usage.ttft_ms != null ? ` · ttft ${fmtDuration(a.usage.ttft_ms / 1000)}` : "";
      tokens = `in ${a.usage.prompt_tokens} (cached ${a.usage.cached_tokens}) · out ${a.usage.completion_tokens}${ttft}`;
    }
  });
  if (s.status === "RUNNING" && s.started_at) {
    bar(ms(s.started_at), now, "RUNNING", `attempt ${s.attempt_count}: running`);
    total += (now - ms(s.started_at)) / 1000;
  }
  if (s.status === "RETRY_WAIT" && s.next_attempt_at && s.attempts.length) {
    const last = s.attempts[s.attempts.length - 1];
    bar(ms(last.finished_at), ms(s.next_attempt_at), "RETRY_WAIT", "waiting to retry");
  }
  const retries = s.attempt_count > 1 ? ` · ${s.attempt_count} attempts` : "";
  const label = `#${s.index} ${s.kind}${s.tool_name ? " " + s.tool_name : ""}`;
  const row = el("div", { class: "row", role: "listitem", "data-step": String(s.index),
                          "data-kind": s.kind, "data-status": s.status, "data-attempts": String(s.attempt_count) },
    el("div", { class: "label" }, el("span", { class: "status s-" + s.status, text: "● " }), label),
    track,
    el("div", { class: "info", text: `${fmtDuration(total)}${retries}${tokens ? " · " + tokens : ""}` }));
  for (const e of errors) row.append(el("div", { class: "err", text: e }));
  return row;
}

// -- live: the task's SSE stream (read with fetch, which can send the API key) -----------------
async function follow(id) {
  if (state.stream) state.stream.abort();
  const ctl = new AbortController();
  state.stream = ctl;
  state.events = 0;
  let lastId = "";
  const decoder = new TextDecoder();
  while (!ctl.signal.aborted && state.selected === id) {
    try {
      const headers = { Authorization: "Bearer " + state.key, Accept: "text/event-stream" };
      if (lastId) headers["Last-Event-ID"] = lastId;
      const r = await fetch(`/v1/tasks/${encodeURIComponent(id)}/events`, { headers, signal: ctl.signal });
      if (!r.ok) throw new Error("event stream: HTTP " + r.status);
      $("#live").textContent = "live";
      const reader = r.body.getReader();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += decoder.decode(value, { stream: true });
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          const frame = buf.slice(0, cut);
          buf = buf.slice(cut + 2);
          const fields = Object.fromEntries(frame.split("\n").filter((l) => l && !l.startsWith(":"))
            .map((l) => [l.slice(0, l.indexOf(":")), l.slice(l.indexOf(":") + 1).trim()]));
          if (!fields.event) continue;
          lastId = fields.id || lastId;
          state.events += 1;
          state.lastEvent = fields.event;
          $("#live").textContent = `live · ${state.events} events · last: ${fields.event}`;
          scheduleRefresh();
        }
      }
      // The stream ends after the task's final event.
      $("#live").textContent = `finished · ${state.events} events · last: ${state.lastEvent}`;
      scheduleRefresh();
      return;
    } catch (err) {
      if (ctl.signal.aborted) return;
      $("#live").textContent = "reconnecting: " + (err.message || err);
      await new Promise((res) => setTimeout(res, 1000));
    }
  }
}

// -- wiring ----------------------------------------------------------------------------------
$("#login").addEventListener("submit", (ev) => {
  ev.preventDefault();
  state.key = $("#api-key").value.trim();
  sessionStorage.setItem("dayzero.key", state.key);
  $("#who").textContent = "connected";
  loadList();
});
$("#filters").addEventListener("submit", (ev) => { ev.preventDefault(); loadList(); });
setInterval(loadList, 3000);
setInterval(() => { if (state.detail && !state.detail.task.finished_at) render(); }, 1000);
if (state.key) { $("#who").textContent = "connected"; loadList(); }
