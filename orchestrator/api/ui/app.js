// dayzero task page: sign in with an API key (kept in the tab's sessionStorage, sent only as an
// Authorization header), a task list (goal, answer, status, usage) with filters, and per task its
// goal, its answer or error and a waterfall of its steps and tool attempts, kept live by the task's
// SSE stream. A task has an address, /ui/#/tasks/<id>: the fragment never reaches the server.
// Vanilla JS.
"use strict";

const $ = (sel) => document.querySelector(sel);
const KEY = "dayzero.key";
const state = { key: sessionStorage.getItem(KEY) || "", selected: null, detail: null,
                stream: null, events: 0, lastEvent: "", refreshTimer: null };

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v; else if (k === "text") e.textContent = v; else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c);
  return e;
}

class Unauthorized extends Error {}

async function api(path, key = state.key) {
  const r = await fetch(path, { headers: { Authorization: "Bearer " + key } });
  if (r.status === 401) throw new Unauthorized("the API key was refused");
  if (r.status === 404) throw new Error("not found (or it belongs to another tenant)");
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
function fmtCount(n) {
  if (n < 1000) return String(n);
  if (n < 1e6) return `${(n / 1e3).toFixed(n < 1e4 ? 1 : 0)}k`;
  return `${(n / 1e6).toFixed(1)}M`;
}
function fmtCreated(t) {
  const d = new Date(t);
  const today = new Date().toDateString() === d.toDateString();
  return today ? d.toLocaleTimeString() : d.toLocaleDateString();
}
const errorText = (e) => (e ? [e.kind, e.message || e.error].filter(Boolean).join(": ") || JSON.stringify(e) : "");
// The line a person reads first: the answer, the error, or what the task is doing.
function outcomeOf(t) {
  if (t.status === "SUCCEEDED") return { cls: "answer", text: t.result || "(empty answer)" };
  if (t.error) return { cls: "error", text: `${t.status}: ${errorText(t.error)}` };
  return { cls: "pending", text: t.cancel_requested ? "cancelling…" : "no answer yet" };
}

// -- signing in and out -----------------------------------------------------------------------
function showSignedIn(on) {
  $("#login").hidden = on;
  $("#who").hidden = !on;
  $("#signin-hint").hidden = on;
  $("main").hidden = !on;
  const target = taskFromHash();
  $("#signin-target").hidden = on || !target;
  if (target) $("#signin-target").textContent = `Sign in to open task ${target}.`;
}

async function signIn(key) {
  try {
    await api("/v1/tasks?limit=1", key); // checks the key before keeping it
  } catch (err) {
    $("#login-msg").textContent = String(err.message || err);
    return;
  }
  state.key = key;
  sessionStorage.setItem(KEY, key);
  $("#login-msg").textContent = "";
  $("#api-key").value = "";
  showSignedIn(true);
  await loadList();
  route();
}

function signOut(message = "") {
  state.key = "";
  sessionStorage.removeItem(KEY);
  if (state.stream) state.stream.abort();
  state.selected = null;
  state.detail = null;
  $("#tasks tbody").replaceChildren();
  $("#detail-head").replaceChildren();
  $("#waterfall").replaceChildren();
  $("#login-msg").textContent = message;
  showSignedIn(false);
}

function failed(err, where) {
  if (err instanceof Unauthorized) signOut("the API key was refused (revoked?): sign in again");
  else where.textContent = String(err.message || err);
}

// -- the task list --------------------------------------------------------------------------
async function loadList() {
  if (!state.key) return;
  const q = new URLSearchParams({ limit: "50" });
  if ($("#f-status").value) q.append("status", $("#f-status").value);
  if ($("#f-meta").value.trim()) q.append("metadata", $("#f-meta").value.trim());
  if ($("#f-after").value) q.append("created_after", new Date($("#f-after").value).toISOString());
  try {
    const page = await api("/v1/tasks?" + q);
    $("#tasks tbody").replaceChildren(...page.items.map(taskRow));
    const filtered = q.has("status") || q.has("metadata") || q.has("created_after");
    $("#list-msg").replaceChildren(page.items.length ? "" : filtered ? "No task matches these filters." : emptyHint());
  } catch (err) {
    failed(err, $("#list-msg"));
  }
}

function emptyHint() {
  return el("span", {}, "No tasks yet for this key's tenant. Submit one with ",
    el("code", { text: 'dayzero submit --follow "What is 17 * 23?"' }), " or ",
    el("code", { text: "POST /v1/tasks" }), "; it appears here as it runs.");
}

function taskRow(t) {
  const u = t.usage;
  const out = outcomeOf(t);
  const tokens = u.prompt_tokens + u.completion_tokens;
  const tr = el("tr", { "data-id": t.id, "data-status": t.status },
    el("td", { class: "task" },
      el("a", { class: "goal clip", href: "#/tasks/" + t.id, title: t.goal || "", text: t.goal || "(no goal text)" }),
      el("div", { class: "outcome clip " + out.cls, title: out.text, text: out.text }),
      el("div", { class: "id", text: t.id })),
    el("td", { class: "status s-" + t.status, text: t.status }),
    el("td", { class: "num", text: String(u.steps) }),
    el("td", { class: "num", text: fmtCount(tokens),
               title: `in ${u.prompt_tokens} (cached ${u.cached_tokens}) · out ${u.completion_tokens}` }),
    el("td", { class: "num", text: fmtCreated(t.created_at), title: new Date(t.created_at).toLocaleString() }));
  if (t.id === state.selected) tr.classList.add("selected");
  tr.addEventListener("click", (ev) => { if (ev.target.tagName !== "A") location.hash = "#/tasks/" + t.id; });
  return tr;
}

// -- one task ------------------------------------------------------------------------------
function taskFromHash() {
  const m = /^#\/tasks\/([A-Za-z0-9._:-]{1,64})$/.exec(location.hash);
  return m ? m[1] : null;
}

function route() {
  if (!state.key) { showSignedIn(false); return; }
  const id = taskFromHash();
  if (id && id !== state.selected) select(id);
}

async function select(id) {
  state.selected = id;
  state.detail = null;
  document.querySelectorAll("#tasks tr").forEach((r) => r.classList.toggle("selected", r.dataset.id === id));
  $("#detail-empty").hidden = true;
  $("#detail-head").replaceChildren(el("p", { class: "msg", text: "loading " + id + " …" }));
  $("#waterfall").replaceChildren();
  $("#live").textContent = "";
  if (await refreshDetail()) follow(id);
}

async function refreshDetail() {
  const id = state.selected;
  if (!id) return false;
  try {
    const d = await api("/ui/api/tasks/" + encodeURIComponent(id));
    if (id !== state.selected) return false;
    state.detail = d;
    render();
    return true;
  } catch (err) {
    if (id === state.selected) failed(err, $("#detail-head"));
    return false;
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
  const out = outcomeOf(t);
  const answer = t.status === "SUCCEEDED"
    ? el("div", { class: "box answer", id: "task-answer" }, el("h3", { text: "answer" }), el("div", { class: "text", text: out.text }))
    : t.error
      ? el("div", { class: "box error", id: "task-error" }, el("h3", { text: t.status.toLowerCase().replace("_", " ") }),
           el("div", { class: "text", text: errorText(t.error) }))
      : el("div", { class: "box pending", id: "task-pending", text: out.text });
  $("#detail-head").replaceChildren(
    el("div", { class: "box goal", id: "task-goal" }, el("h3", { text: "goal" }), el("div", { class: "text", text: t.goal || "(no goal text)" })),
    answer,
    el("div", { class: "facts" },
      fact("status", el("b", { class: "status s-" + t.status, text: t.status, id: "task-status" })),
      fact("steps", String(u.steps)),
      fact("tokens in", String(u.prompt_tokens)), fact("cached", String(u.cached_tokens)),
      fact("out", String(u.completion_tokens)),
      fact("context", t.limits && t.limits.max_context_tokens
        ? el("b", { id: "task-context", text: `${t.limits.max_context_tokens} tokens, ${t.limits.context_policy}` })
        : el("b", { id: "task-context", text: "no cap" })),
      fact("duration", fmtDuration(((t.finished_at ? ms(t.finished_at) : Date.now()) - ms(t.created_at)) / 1000)),
      fact("trace", trace),
      fact("id", el("a", { id: "task-link", class: "id", href: "#/tasks/" + t.id, title: "this task's address: copy it to share", text: t.id }))));

  const t0 = ms(t.created_at);
  const end = t.finished_at ? ms(t.finished_at) : Date.now();
  const span = Math.max(1, end - t0);
  const pos = (a, b) => ({ left: ((a - t0) / span) * 100, width: Math.max(0.2, ((b - a) / span) * 100) });
  const rows = d.steps.map((s) => stepRow(s, pos, end));
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
  const key = $("#api-key").value.trim();
  if (key) signIn(key);
});
$("#logout").addEventListener("click", () => signOut());
$("#filters").addEventListener("submit", (ev) => { ev.preventDefault(); loadList(); });
window.addEventListener("hashchange", route);
setInterval(loadList, 3000);
setInterval(() => { if (state.detail && !state.detail.task.finished_at) render(); }, 1000);
if (state.key) { showSignedIn(true); loadList(); route(); } else showSignedIn(false);
