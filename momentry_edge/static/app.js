// The web console: reads and acts through the service's own HTTP API (docs/api.md) and
// stays current from its event stream. No library, no build step, nothing from elsewhere.
"use strict";

const PAGE = 25;
const $ = (id) => document.getElementById(id);

// The link `momentry-edge open` prints carries the token in the fragment (#token=...),
// which a browser never sends, so no server log keeps it. It is taken into this tab's
// sessionStorage and out of the address bar (and so of the history) at once.
(function takeTokenFromLink() {
  const match = /^#token=([^&]*)/.exec(location.hash);
  if (!match) return;
  let token = "";
  try { token = decodeURIComponent(match[1]); } catch (_) { /* a broken link: signed out */ }
  if (token) sessionStorage.setItem("momentry-token", token);
  history.replaceState(null, "", location.pathname + location.search + "#/");
})();

const state = {
  token: sessionStorage.getItem("momentry-token") || "",
  waitingOffset: 0, failedOffset: 0, cancelledOffset: 0, filesOffset: 0, rejectedOffset: 0,
  search: "", status: null, skew: 0, fileUuid: null, blobs: [], places: {}, readFailed: false,
  selected: new Map(),  // task_id -> file name: the waiting jobs ticked for Cancel selected
  waitingStatus: "", waitingFolder: "",  // the waiting list's filter, as last shown (Show)
  openLogs: new Set(),  // task ids whose log is open on the file's page
};

// -- the API -----------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

function headers(extra) {
  // The service's log names the interface that cancelled or cleared what.
  const h = Object.assign({ "X-Momentry-Via": "console" }, extra || {});
  if (state.token) h.Authorization = "Bearer " + state.token;
  return h;
}

async function call(method, path, body) {
  const init = { method, headers: headers(body ? { "Content-Type": "application/json" } : {}) };
  if (body) init.body = JSON.stringify(body);
  const reply = await fetch(path, init);
  const date = Date.parse(reply.headers.get("Date") || "");
  if (!Number.isNaN(date)) state.skew = date - Date.now();  // the service's clock, to a second
  if (reply.status === 401) { signOut(); throw new ApiError(401, "the token is needed"); }
  if (!reply.ok) {
    let message = reply.status + " " + reply.statusText;
    try { message = (await reply.json()).error.message; } catch (_) { /* not JSON */ }
    throw new ApiError(reply.status, message);
  }
  return reply;
}

const get = async (path) => (await call("GET", path)).json();
const optional = (path) => get(path).catch((e) => { if (e.status === 404) return null; throw e; });

async function act(method, path, body) {
  try {
    await call(method, path, body);
    say("");
    refresh("all", true);
  } catch (e) {
    if (e.status !== 401) say(e.message);
  }
}

// What cannot be undone asks first, in a dialog that names what it ends; Escape or
// "Keep it" leaves everything as it was.
function confirmThen(question, yes, action) {
  const dialog = $("confirm");
  $("confirm-text").textContent = question;
  $("confirm-yes").textContent = yes;
  dialog.returnValue = "";
  dialog.onclose = () => { if (dialog.returnValue === "yes") action(); };
  dialog.showModal();
  $("confirm-no").focus();
}
$("confirm-yes").addEventListener("click", () => $("confirm").close("yes"));
$("confirm-no").addEventListener("click", () => $("confirm").close("no"));

function cancelJob(job) {
  const running = job.status === "processing";
  const question = running
    ? `Cancel the running job of ${job.file_name} (${job.task_id})? It stops at its next checkpoint; Retry runs what it did not finish.`
    : `Cancel the waiting job of ${job.file_name} (${job.task_id})? It leaves the line; Retry puts it back.`;
  confirmThen(question, "Cancel job", () => act("POST", `/api/v1/jobs/${job.task_id}/cancel`));
}

function dismissJob(job) {
  confirmThen(`Dismiss the ${job.status} job of ${job.file_name} (${job.task_id})? Its record is removed for good; its results stay.`,
    "Dismiss job", () => act("POST", `/api/v1/jobs/${job.task_id}/dismiss`));
}

// -- signing in --------------------------------------------------------------------------

function signOut() {
  state.token = "";
  sessionStorage.removeItem("momentry-token");
  leaveStream();
  $("app").hidden = true;  // nothing of the queue or the files stays on screen
  if ($("confirm").open) $("confirm").close();
  for (const id of ["running", "waiting", "failed", "cancelled", "files", "rejected", "scenes", "transcript"]) {
    $(id).replaceChildren();
  }
  $("login").hidden = false;
  $("sign-out").hidden = true;
  $("live").textContent = "the token is needed";
  $("token").focus();
}

$("sign-out").addEventListener("click", () => {
  signOut();
  $("login-error").textContent = "Signed out: the token is forgotten in this tab.";
});

async function start() {
  if (document.documentElement.dataset.token === "required" && !state.token) {
    signOut();  // asked for before any request: none is refused, nothing is shown
    return;
  }
  try {
    await call("GET", "/api/v1/queue/status?limit=1&offset=0");
  } catch (e) {
    if (e.status !== 401) { $("live").textContent = "cannot reach the service: " + e.message; }
    return;
  }
  $("login").hidden = true;
  $("app").hidden = false;
  $("sign-out").hidden = !state.token;
  route();
  joinStream();
}

$("login").addEventListener("submit", async (event) => {
  event.preventDefault();
  state.token = $("token").value;
  $("token").value = "";
  try {
    await call("GET", "/api/v1/queue/status?limit=1&offset=0");
  } catch (e) {
    $("login-error").textContent = e.status === 401 ? "That token is not the service's." : e.message;
    return;
  }
  sessionStorage.setItem("momentry-token", state.token);
  $("login-error").textContent = "";
  start();
});

// -- the event stream ----------------------------------------------------------------------
// Read with fetch(), not EventSource: EventSource cannot send the Authorization header,
// and the token must not go in the URL (it would sit in logs and the browser's history).
//
// One stream for all the tabs of a browser, not one per tab: each stream holds one of the
// 6 connections a browser opens to a site, for good, so a 7th tab could not even load, and
// the service held a thread per tab. One tab, the leader, reads the stream and passes on
// each event, and what it says of the stream, to the other tabs over a BroadcastChannel.
// The leader is the tab holding the Web Lock SHARED; when it closes (or signs out) the
// lock, and the stream, pass to another. A page over plain http from another machine is
// no "secure context" and has no Web Locks: there the tabs elect the leader over the
// channel (elect()). Without a BroadcastChannel each tab reads a stream of its own.

const SHARED = "momentry-events";
const CAN_SHARE = !!window.BroadcastChannel;
const LOCKS = !!navigator.locks;
const SILENCE = 3000;  // a question to the leader unanswered this long: no leader, claim
let stream = null;
let backoff = 1000;
// Still no stream after SLOW_AFTER: the lists are read every POLL instead (and the page
// says so), until the stream is back. Events are not missed for long when a proxy holds
// streams back or the service refuses one more (16 open).
const SLOW_AFTER = 10000;
const POLL = 5000;
let down = null;  // the timer that starts polling, while the stream is down
let polling = null;  // the poll's interval, while polling
let why = "";
let share = null;  // while signed in with CAN_SHARE: the tab's place among the tabs
// Messages on the channel: { ask: id } who leads? (each tab's first word, then every
// second without Web Locks); { lead: id, live } I read the stream (a claim, or an answer);
// { event }, { live } from the leader; { bye: id, next: id } a tab closes (a leader names
// the tab to read the stream after it).

function joinStream() {
  leaveStream();
  if (!CAN_SHARE) { openStream(); return; }
  const me = {
    channel: new BroadcastChannel(SHARED), quit: new AbortController(), leading: false,
    id: Math.random(),  // the lower id keeps the stream when two tabs claim it at once
    asked: Date.now() - SILENCE + 1000,  // the first question waits 1 s: a leader answers at once
    heard: 0, others: new Map(), tick: null,
  };
  share = me;
  me.channel.onmessage = ({ data }) => hear(me, data);
  if (LOCKS) {
    // Granted at once to the first tab, else when the tab holding it closes or signs out;
    // held until this tab signs out (quit) or closes (the browser releases it then).
    navigator.locks.request(SHARED, { signal: me.quit.signal }, () => {
      if (share !== me) return null;
      lead(me);
      return new Promise((resolve) => me.quit.signal.addEventListener("abort", resolve));
    }).catch(() => { /* signed out while waiting for the lock (AbortError) */ });
  } else {
    me.tick = setInterval(() => elect(me), 1000);
  }
  me.channel.postMessage({ ask: me.id });  // the leader answers, and says how the stream is
}

function leaveStream() {
  stopStream();
  endSlow();
  if (!share) return;
  share.quit.abort();
  clearInterval(share.tick);
  share.channel.close();
  share = null;
}

function lead(me) {
  me.leading = true;
  openStream();
  claim(me);
}

const claim = (me) => me.channel.postMessage({ lead: me.id, live: $("live").textContent });

// Without Web Locks, every second: ask who leads; the last question unanswered for
// SILENCE, claim the stream. The leader answers from its message handler, which runs on
// time even in a hidden tab (whose timers the browser may slow to once a minute).
function elect(me) {
  if (me.leading) return;
  if (me.heard >= me.asked) {
    me.asked = Date.now();
    me.channel.postMessage({ ask: me.id });
  } else if (Date.now() - me.asked >= SILENCE) {
    lead(me);
  }
}

function hear(me, data) {
  if (data.bye !== undefined) {
    me.others.delete(data.bye);
    if (data.next === me.id && !me.leading) lead(me);  // named by the leader leaving
  } else if (me.leading) {
    if (data.ask !== undefined) {
      me.others.set(data.ask, Date.now());
      claim(me);
    } else if (data.lead < me.id) {
      stopStream();  // two claimed at once: the lower id reads the stream
      endSlow();
      me.leading = false;
      me.heard = Date.now();
    } else if (data.lead > me.id) {
      claim(me);  // the other one yields when it hears this
    }
  } else {
    if (data.lead !== undefined) me.heard = Date.now();
    if (data.event) onEvent(data.event);
    if (data.live !== undefined) showLive(data.live);
  }
}

// A tab closing without Web Locks says so; a leader names the tab that asked with the
// lowest id in the last 2 minutes, which claims the stream at once (the others would in
// SILENCE). A page kept in the back/forward cache joins again when it is shown.
window.addEventListener("pagehide", () => {
  if (!share || LOCKS) return;
  const asked = [...share.others].filter(([, at]) => Date.now() - at < 120000).map(([id]) => id);
  share.channel.postMessage({ bye: share.id, next: share.leading ? Math.min(...asked) : null });
  leaveStream();
});
window.addEventListener("pageshow", (e) => {
  if (e.persisted && !share && !stream && !$("app").hidden) joinStream();
});

// What the page says of the stream; the tab reading it tells the others.
function showLive(text) {
  const was = $("live").textContent;
  $("live").textContent = text;
  if (share && share.leading) share.channel.postMessage({ live: text });
  else if (share && text === "live" && was !== "live") refresh("all");  // what changed meanwhile
}

function stopStream() {
  if (stream) stream.abort();
  stream = null;
}

async function openStream() {
  stopStream();
  const controller = new AbortController();
  stream = controller;
  try {
    const reply = await fetch("/api/v1/events", { headers: headers(), signal: controller.signal });
    if (reply.status === 401) { signOut(); return; }
    if (!reply.ok) throw new Error(reply.status === 503 ? "too many open pages" : "" + reply.status);
    endSlow();
    showLive("live");
    backoff = 1000;
    refresh("all");  // whatever changed while the stream was closed
    const reader = reply.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5));
        if (!data.length) continue;
        const event = JSON.parse(data.join("\n"));
        if (share) share.channel.postMessage({ event });
        onEvent(event);
      }
    }
    throw new Error("the service closed the stream");
  } catch (e) {
    if (controller.signal.aborted || stream !== controller) return;
    why = e.message;
    if (!down && !polling) down = setTimeout(beginSlow, SLOW_AFTER);
    showLive(polling ? slowText() : "not live (" + why + "); reconnecting…");
    setTimeout(() => { if (stream === controller) openStream(); }, backoff);
    backoff = Math.min(backoff * 2, 30000);
  }
}

const slowText = () => `slower updates, every ${POLL / 1000} s (not live: ${why}); reconnecting…`;

function beginSlow() {
  down = null;
  polling = setInterval(() => {
    const event = { type: "status.poll" };  // told to the other tabs as an event
    if (share) share.channel.postMessage({ event });
    onEvent(event);
  }, POLL);
  showLive(slowText());
  onEvent({ type: "status.poll" });
}

function endSlow() {
  clearTimeout(down);
  clearInterval(polling);
  down = null;
  polling = null;
}

function onEvent(event) {
  if (event.type === "job.progress") refresh("running");
  else if (event.type === "models.pull") refresh("service");
  else refresh("all");
}

// At most one refresh a second, whatever the rate of events: each one reads a page of
// each list, never the whole line. What a person did (``now``) is shown at once.
let pending = new Set();
let timer = null;
let drawing = false;
let urgent = false;
let last = 0;
// A hidden tab draws nothing (a browser may hold many tabs of the console): it only notes
// that its view is stale, and draws once, at once, when shown. It still reads and relays
// the stream if it is the leader: that is done before refresh().
let stale = false;

function refresh(what, now) {
  if ($("app").hidden) return;  // signed out: nothing is read until the token is given
  if (document.hidden) { stale = true; return; }
  pending.add(what);
  urgent = urgent || !!now;
  if (drawing) return;  // drawn again once this draw ends
  if (timer && !now) return;
  clearTimeout(timer);
  const wait = now ? 0 : Math.max(0, last + 1000 - Date.now());
  timer = setTimeout(async () => {
    timer = null;
    if (document.hidden) { stale = true; return; }  // hidden since it was asked for
    const asked = pending;
    pending = new Set();
    urgent = false;
    last = Date.now();
    drawing = true;
    try {
      await draw(asked);
      if (state.readFailed) say("");  // read again: what failed before (an outage) is over
    } catch (e) {
      if (e.status !== 401) sayReadFailed(e);
    }
    drawing = false;
    if (pending.size) refresh([...pending][0], urgent);
  }, wait);
}
setInterval(() => refresh("all"), 30000);  // estimates and free space move without events
document.addEventListener("visibilitychange", () => {
  if (!document.hidden && stale) { stale = false; refresh("all", true); }
});

async function draw(asked) {
  if (state.fileUuid) {
    if (asked.has("all")) await drawFileJobs();
    return;
  }
  const all = asked.has("all");
  const status = await get(`/api/v1/queue/status?limit=${PAGE}&offset=${state.waitingOffset}${waitingQuery()}`);
  state.status = status;
  drawService(status);
  await drawRunning(status);
  if (!all) return;
  drawWaiting(status);
  await Promise.all([drawFailed(), drawCancelled(), drawFiles(), drawRejected()]);
}

// -- words and numbers ---------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (value !== null && value !== undefined && value !== false) node.setAttribute(key, value);
  }
  for (const child of children) if (child !== null && child !== undefined) node.append(child);
  return node;
}

function say(text) {
  $("message").textContent = text;
  state.readFailed = false;
}

// A read the page made by itself failed: said until a later read succeeds (an action's
// failure stays until the next action instead).
function sayReadFailed(e) {
  say(e instanceof ApiError ? e.message : "cannot reach the service: " + e.message);
  state.readFailed = true;
}

function clockTime(seconds) {
  seconds = Math.max(0, seconds);
  const m = Math.floor(seconds / 60);
  const s = seconds - m * 60;
  const h = Math.floor(m / 60);
  const mm = h ? String(m % 60).padStart(2, "0") : String(m);
  return (h ? h + ":" : "") + mm + ":" + s.toFixed(1).padStart(4, "0");
}

function span(seconds) {
  if (seconds === null || !Number.isFinite(seconds)) return "unknown";
  seconds = Math.round(seconds);
  if (seconds < 60) return seconds + " s";
  if (seconds < 3600) return Math.floor(seconds / 60) + " min " + (seconds % 60) + " s";
  return Math.floor(seconds / 3600) + " h " + Math.floor((seconds % 3600) / 60) + " min";
}

function when(iso) {
  if (!iso) return "not known";
  const t = new Date(iso);
  // The console's rule: this browser's local time, labelled with its zone (the CLI and the
  // logs say UTC, and label it so too).
  return t.toLocaleString(undefined, { dateStyle: "medium", timeStyle: "short" })
    + " " + zoneOf(t);
}

function zoneOf(t) {
  const part = new Intl.DateTimeFormat(undefined, { timeZoneName: "short" }).formatToParts(t)
    .find((p) => p.type === "timeZoneName");
  return part ? part.value : "";
}

function ago(iso) {
  return iso ? span(Math.max(0, now() - Date.parse(iso) / 1000)) + " ago" : "not known";  // clocks a second apart
}

function bytes(mb) {
  return mb >= 1024 ? (mb / 1024).toFixed(1) + " GB" : mb + " MB";
}

const now = () => (Date.now() + state.skew) / 1000;
const statusWord = (s) => el("span", { class: "status status-" + s, text: s });
const folderOf = (path) => (path && path.includes("/") ? path.slice(0, path.lastIndexOf("/")) : ".");
// "in <folder>" beside a file in a folder of the drop folder; nothing for one at its top
// ("in ." said nothing a person could use).
function inFolderOf(path) {
  const folder = folderOf(path);
  return folder === "." ? null : el("span", { class: "muted", text: "in " + folder });
}

function pager(id, offset, total, onPage) {
  const nav = $(id);
  nav.replaceChildren();
  if (total <= PAGE && offset === 0) return;
  const end = Math.min(offset + PAGE, total);
  nav.append(
    el("button", { type: "button", disabled: offset === 0, text: "Previous page",
      onclick: () => onPage(Math.max(0, offset - PAGE)) }),
    el("span", { text: `${total ? offset + 1 : 0}–${end} of ${total}` }),
    el("button", { type: "button", disabled: end >= total, text: "Next page",
      onclick: () => onPage(offset + PAGE) }),
  );
}

// -- the service ---------------------------------------------------------------------------

// Why fewer jobs may run than the maximum: the pause, what blocks, or the machine's load
// (dynamic concurrency holds back while CPU, memory or GPU is busy), as the TUI's gauges say.
function belowMax(s) {
  if (s.effective_concurrency >= s.max_concurrent) return "";
  if (s.worker_enabled === false) return ": this node runs no jobs (queue.worker_enabled = false)";
  if (s.drained) return ": this node is drained";
  if (s.paused) return ": paused";
  if (s.blocked_reason) return ": blocked";
  const r = s.resources || {};
  const load = [["CPU", r.cpu_percent], ["memory", r.memory_percent], ["GPU", r.gpu_percent]]
    .filter(([, v]) => v !== null && v !== undefined).map(([k, v]) => `${k} ${Math.round(v)}%`);
  return s.dynamic_concurrency ? `: held back by dynamic concurrency (${load.join(", ") || "the machine is busy"})` : "";
}

function drawService(s) {
  const word = s.paused ? "paused" : s.blocked_reason ? "blocked" : "running";
  const line = $("service-state");
  line.className = "state state-" + word;
  line.textContent = "queue " + word + (s.blocked_reason ? ": " + s.blocked_reason : "");
  $("pause").disabled = s.paused;
  $("resume").disabled = !s.paused;
  const input = $("max-concurrent");
  if (document.activeElement !== input) input.value = s.max_concurrent;
  const facts = [
    ["Jobs", `${s.active_count} running · ${s.pending_count} pending · ${s.retrying_count || 0} retrying`],
    ["Concurrency", `effective ${s.effective_concurrency} / max ${s.max_concurrent}` +
      (s.dynamic_concurrency ? " (dynamic)" : "") + belowMax(s)],
    ["Finished", `${s.statistics.total_processed} (${s.statistics.total_failed} failed)`],
  ];
  for (const d of s.disk || []) {
    facts.push(["Free disk", `${bytes(d.free_mb)} of ${bytes(d.total_mb)} for ${d.folder}` +
      ` (nothing starts below ${bytes(d.min_free_mb)})`]);
  }
  for (const n of s.nodes || []) facts.push(["Node", nodeLine(n)]);
  for (const m of s.models || []) {
    const done = m.total ? ` ${m.percent}% (${bytes(Math.round(m.done / 2 ** 20))})` : "";
    facts.push(["Model pull", `${m.model}: ${m.state}${done}${m.error ? ": " + m.error : ""}`]);
  }
  if (s.drained) facts.push(["Drained", "this node starts no job; its running jobs finish (`momentry-edge drain --undo` takes jobs again)"]);
  const b = s.last_backup;
  facts.push(["Last backup", b ? `${when(b.created_at)} (${b.scheduled ? "scheduled" : "by hand"})` : "none in the data folder"]);
  $("service-facts").replaceChildren(...facts.flatMap(([k, v]) => [el("dt", { text: k }), el("dd", { text: v })]));
}

// A node as the operator needs it: offline with its last heartbeat, or what it takes on.
function nodeLine(n) {
  if (n.online === false) return `${n.id} on ${n.host}: OFFLINE, last heartbeat ${when(n.last_seen)} (${ago(n.last_seen)})`;
  const takes = n.worker === "off" ? "runs no jobs (queue.worker_enabled = false)"
    : n.worker === "drained" ? `drained, ${n.active} running` : `${n.active} running of ${n.max_concurrent}`;
  return `${n.id} on ${n.host}: ${takes}, last heartbeat ${ago(n.last_seen)}`;
}

$("pause").addEventListener("click", () => act("POST", "/api/v1/queue/pause"));
$("resume").addEventListener("click", () => act("POST", "/api/v1/queue/resume"));
$("concurrency").addEventListener("submit", (event) => {
  event.preventDefault();
  const value = Number($("max-concurrent").value);
  act("PUT", "/api/v1/queue/concurrency", { max_concurrent: value });
});

// -- running jobs --------------------------------------------------------------------------

async function drawRunning(s) {
  const running = s.queue.filter((j) => j.status === "processing");
  const details = await Promise.all(running.map((j) => optional("/api/v1/jobs/" + j.task_id)));
  await Promise.all(running.map((j) => placeOf(j.file_uuid)));
  const items = running.map((j, i) => runningItem(j, details[i]));
  $("running").replaceChildren(...(items.length ? items : [el("li", { class: "muted", text: "No job is running." })]));
}

async function placeOf(uuid) {
  if (!(uuid in state.places)) {
    const file = await optional("/api/v1/files/" + uuid);
    state.places[uuid] = file ? file.path : "";
  }
  return state.places[uuid];
}

// Time left from each processor's own rate on this file (items done per second since it
// began); the processors of a job run side by side, so the job ends with the slowest.
function remaining(detail) {
  let longest = 0;
  let known = false;
  let waiting = 0;
  for (const run of Object.values(detail.processors)) {
    if (run.status === "pending") { waiting += 1; continue; }
    if (run.status !== "running") continue;
    if (!run.total || !run.current || !run.started_at) continue;
    const elapsed = now() - Date.parse(run.started_at) / 1000;
    if (elapsed <= 0) continue;
    known = true;
    longest = Math.max(longest, (run.total - run.current) / (run.current / elapsed));
  }
  const text = known ? "about " + span(longest) + " left" : "time left not known yet";
  return waiting ? `${text}; ${waiting} processor${waiting > 1 ? "s" : ""} not started` : text;
}

function runningItem(job, detail) {
  const path = state.places[job.file_uuid] || job.file_name;
  const node = (state.status.nodes || []).find((n) => n.id === job.node);
  const where = `on ${job.node || "?"}${node && node.online === false ? " (offline)" : ""}` +
    ` · started ${when(job.started_at)} · last progress ${ago(job.progress_at)}`;
  const rows = [];
  for (const [name, run] of Object.entries(detail ? detail.processors : {})) {
    const pct = run.progress || 0;
    const count = run.total ? ` (${run.current} / ${run.total})` : "";
    rows.push(el("div", { class: "proc" },
      el("span", { text: name }),
      el("progress", { max: 100, value: pct, "aria-label": `${name} progress on ${job.file_name}` }),
      el("span", { class: "muted", text: `${run.status} ${pct}%${count}` })));
  }
  return el("li", { "data-task": job.task_id },
    el("div", { class: "row" },
      el("a", { class: "name", href: "#/file/" + job.file_uuid, text: job.file_name }),
      statusWord(job.status),
      inFolderOf(path),
      job.stalled ? el("span", { class: "status status-failed", text: "stalled" }) : null,
      el("span", { class: "muted", text: detail ? remaining(detail) : "" }),
      el("button", { type: "button", "aria-label": "Cancel " + job.file_name, text: "Cancel",
        onclick: () => cancelJob(job) })),
    el("div", { class: "muted", text: where }),
    ...rows);
}

// -- the waiting line ----------------------------------------------------------------------

function drawWaiting(s) {
  const waiting = s.queue.filter((j) => j.status === "pending" || j.status === "retrying");
  const items = waiting.map((j) => {
    const label = j.file_name;
    const select = el("select", { "aria-label": "Priority of " + label,
      onchange: (e) => act("PUT", `/api/v1/queue/task/${j.task_id}/priority`, { priority: e.target.value }) },
      ...["high", "normal", "low"].map((p) => el("option", { value: p, text: p, selected: p === j.priority })));
    const place = j.status === "pending" ? `#${j.position}` : "retrying";
    const start = j.status === "pending" ? waitingStart(j) : "next attempt " + when(j.next_attempt_at);
    const tick = el("input", { type: "checkbox", "aria-label": "Select " + label,
      checked: state.selected.has(j.task_id),
      onchange: (e) => { if (e.target.checked) state.selected.set(j.task_id, label); else state.selected.delete(j.task_id); showSelected(); } });
    return el("li", { "data-task": j.task_id },
      el("div", { class: "row" },
        tick,
        el("span", { text: place }),
        el("a", { class: "name", href: "#/file/" + j.file_uuid, text: label }),
        statusWord(j.status),
        el("span", { class: j.stranded ? "status status-failed" : "muted", text: start }),
        select,
        j.status === "pending" ? el("button", { type: "button", "aria-label": "Prioritize " + label,
          text: "Prioritize", onclick: () => act("POST", "/api/v1/queue/prioritize/" + j.file_uuid) }) : null,
        el("button", { type: "button", "aria-label": "Cancel " + label, text: "Cancel",
          onclick: () => cancelJob(j) })));
  });
  $("waiting").replaceChildren(...(items.length ? items : [el("li", { class: "muted", text: "Nothing is waiting." })]));
  // A ticked job that no longer waits (it started, or was cancelled) is no longer ticked.
  const shown = new Set(waiting.map((j) => j.task_id));
  for (const task of state.selected.keys()) if (!shown.has(task)) state.selected.delete(task);
  showSelected();
  const total = s.shown_count ?? s.pending_count + (s.retrying_count || 0);
  waitingPager(state.waitingOffset, total, (o) => { state.waitingOffset = o; refresh("all", true); });
  $("select-shown").checked = waiting.length > 0 && waiting.every((j) => state.selected.has(j.task_id));
  $("select-shown").dataset.shown = JSON.stringify(waiting.map((j) => [j.task_id, j.file_name]));
  const where = state.waitingFolder ? ` in folder ${state.waitingFolder}` : "";
  $("waiting-filter").textContent = state.waitingStatus || state.waitingFolder
    ? `Showing ${total} ${state.waitingStatus || "waiting"} job${total === 1 ? "" : "s"}${where}` +
      ` of ${s.pending_count + (s.retrying_count || 0)} waiting.` : "";
}

// -- the waiting list's filter and pages ---------------------------------------------------

// A waiting job's start: when, or why it has none (no node can run it, paused, no history).
function waitingStart(j) {
  if (j.stranded) return j.stranded;
  return "starts " + (j.estimated_start ? when(j.estimated_start) : "not known (paused, blocked or no history)");
}

function waitingQuery() {
  const q = state.waitingStatus ? "&status=" + state.waitingStatus : "";
  return q + (state.waitingFolder ? "&folder=" + encodeURIComponent(state.waitingFolder) : "");
}

// Show: the list of the folder typed and the status chosen; a folder no file is in is
// said, and the list stays as it was.
$("bulk").addEventListener("submit", async (event) => {
  event.preventDefault();
  const folder = bulkFolder();
  const status = $("waiting-status").value;
  const q = (status ? "&status=" + status : "") + (folder ? "&folder=" + encodeURIComponent(folder) : "");
  try {
    await get(`/api/v1/queue/status?limit=1&offset=0${q}`);
  } catch (e) {
    if (e.status !== 401) say(e.message);
    return;
  }
  say("");
  Object.assign(state, { waitingFolder: folder, waitingStatus: status, waitingOffset: 0 });
  refresh("all", true);
});

// Pages of the waiting line: first, previous, next, last, and straight to the page of a
// place in the list shown (the 500th of 520 is one step away, not 20).
function waitingPager(offset, total, onPage) {
  const nav = $("waiting-pager");
  // Made anew only when its page or total changed: each refresh (every queue event) would
  // otherwise take away a place half typed into "Go to #".
  if (nav.dataset.shown === `${offset}/${total}`) return;
  nav.dataset.shown = `${offset}/${total}`;
  const before = $("waiting-goto");
  const typed = before ? before.value : "";
  const focused = before !== null && document.activeElement === before;
  nav.replaceChildren();
  if (total <= PAGE && offset === 0) return;
  const end = Math.min(offset + PAGE, total);
  const last = Math.max(0, Math.floor((total - 1) / PAGE) * PAGE);
  const go = el("input", { id: "waiting-goto", type: "number", min: 1, max: total, inputmode: "numeric" });
  nav.append(
    el("button", { type: "button", disabled: offset === 0, text: "First page", onclick: () => onPage(0) }),
    el("button", { type: "button", disabled: offset === 0, text: "Previous page",
      onclick: () => onPage(Math.max(0, offset - PAGE)) }),
    el("span", { text: `${total ? offset + 1 : 0}–${end} of ${total}` }),
    el("button", { type: "button", disabled: end >= total, text: "Next page", onclick: () => onPage(offset + PAGE) }),
    el("button", { type: "button", disabled: end >= total, text: "Last page", onclick: () => onPage(last) }),
    el("label", { for: "waiting-goto", text: "Go to #" }), go,
    el("button", { type: "button", text: "Go", onclick: () => {
      const n = Math.min(Math.max(1, Math.floor(Number(go.value) || 1)), total);
      onPage(Math.floor((n - 1) / PAGE) * PAGE);
    } }),
  );
  go.value = typed;
  if (focused) go.focus();
}

$("select-shown").addEventListener("change", (e) => {
  const shown = JSON.parse(e.target.dataset.shown || "[]");
  for (const [task, name] of shown) {
    if (e.target.checked) state.selected.set(task, name); else state.selected.delete(task);
  }
  for (const box of $("waiting").querySelectorAll("input[type=checkbox]")) box.checked = e.target.checked;
  showSelected();
});

// The skip link: to the file search at once, without a change of page (the hash routes).
document.querySelector(".skip").addEventListener("click", (event) => {
  event.preventDefault();
  $("search-name").focus();
});

function showSelected() {
  const count = state.selected.size;
  $("cancel-selected").disabled = !count;
  $("cancel-selected").textContent = count ? `Cancel selected (${count})` : "Cancel selected";
}

$("cancel-selected").addEventListener("click", () => {
  const chosen = [...state.selected.entries()];
  const names = chosen.slice(0, 5).map(([, name]) => name).join(", ") + (chosen.length > 5 ? ", …" : "");
  confirmThen(`Cancel ${chosen.length} waiting job${chosen.length === 1 ? "" : "s"}: ${names}?`, "Cancel jobs", async () => {
    const failed = [];
    for (const [task, name] of chosen) {
      try { await call("POST", `/api/v1/jobs/${task}/cancel`); } catch (e) { failed.push(`${name}: ${e.message}`); }
      state.selected.delete(task);
    }
    $("bulk-said").textContent = `Cancelled ${chosen.length - failed.length} of ${chosen.length}.`;
    say(failed.length ? "Not cancelled: " + failed.join("; ") : "");
    refresh("all", true);
  });
});

// A folder's jobs at once, the folder named as the lists name it ("in day 1").
const bulkFolder = () => $("bulk-folder").value.trim().replace(/^\.\/?$|\/+$/g, "");
const bulkBody = () => (bulkFolder() ? { folder: bulkFolder() } : {});
const inFolder = () => (bulkFolder() ? `in folder ${bulkFolder()}` : "in every folder");

async function bulk(path, done) {
  try {
    const reply = await (await call("POST", path, bulkBody())).json();
    say("");
    $("bulk-said").textContent = done(reply);
    refresh("all", true);
  } catch (e) {
    if (e.status !== 401) say(e.message);
  }
}

$("bulk-retry").addEventListener("click", () => bulk("/api/v1/queue/retry", (r) =>
  `Retried ${r.retried} failed job${r.retried === 1 ? "" : "s"} ${inFolder()}.` +
  (r.refused.length ? ` Not retried: ${r.refused.map((x) => `${x.task_id} (${x.reason})`).join("; ")}` : "")));
$("bulk-cancel").addEventListener("click", () => confirmThen(
  `Cancel every waiting job ${inFolder()}? Running jobs go on; Retry puts each back.`, "Cancel jobs",
  () => bulk("/api/v1/queue/clear", (r) => `Cancelled ${r.cleared} waiting job${r.cleared === 1 ? "" : "s"} ${inFolder()}.`)));

// -- failed jobs ---------------------------------------------------------------------------

// One cause is said once, with the processors it hit (a frame pass's members fail alike),
// and the attempts only when there were several.
function causes(failed) {
  const byError = new Map();
  for (const [name, f] of Object.entries(failed)) {
    const error = f.error || "(no error recorded)";
    const cause = byError.get(error) || { names: [], attempts: 0 };
    cause.names.push(name);
    cause.attempts = Math.max(cause.attempts, f.attempts || 0);
    byError.set(error, cause);
  }
  return [...byError].map(([error, c]) => el("div", {},
    el("span", { text: `${c.names.join(", ")} failed` + (c.attempts > 1 ? ` after ${c.attempts} attempts` : "") + ":" }),
    el("pre", { class: "err", text: error })));
}

// A job's failed processors as the failed list gives them: name -> {error, attempts}.
const failedRuns = (job) => Object.fromEntries(Object.entries(job.processors)
  .filter(([, run]) => run.status === "failed"));

async function drawFailed() {
  const dead = await get(`/api/v1/queue/dead?limit=${PAGE}&offset=${state.failedOffset}`);
  await Promise.all(dead.jobs.map((j) => placeOf(j.file_uuid)));
  const items = dead.jobs.map((j) => el("li", { "data-task": j.task_id },
    el("div", { class: "row" },
      el("a", { class: "name", href: "#/file/" + j.file_uuid, text: j.file_name }),
      statusWord(j.status),
      inFolderOf(state.places[j.file_uuid] || j.file_name),
      el("span", { class: "muted", text: "ended " + when(j.completed_at) }),
      el("button", { type: "button", "aria-label": "Retry " + j.file_name, text: "Retry",
        onclick: () => act("POST", `/api/v1/jobs/${j.task_id}/retry`) }),
      el("button", { type: "button", "aria-label": "Dismiss " + j.file_name, text: "Dismiss",
        onclick: () => dismissJob(j) })),
    ...causes(j.failed),
    j.error_message && !Object.keys(j.failed).length ? el("pre", { class: "err", text: j.error_message }) : null));
  $("failed").replaceChildren(...(items.length ? items : [el("li", { class: "muted", text: "No failed job." })]));
  pager("failed-pager", state.failedOffset, dead.total, (o) => { state.failedOffset = o; refresh("all", true); });
}

// -- cancelled jobs ------------------------------------------------------------------------

async function drawCancelled() {
  const list = await get(`/api/v1/jobs?status=cancelled&limit=${PAGE}&offset=${state.cancelledOffset}`);
  const items = list.jobs.map((j) => el("li", { "data-task": j.task_id },
    el("div", { class: "row" },
      el("a", { class: "name", href: "#/file/" + j.file_uuid, text: j.file_name }),
      statusWord(j.status),
      el("span", { class: "muted", text: j.error || "" }),
      el("button", { type: "button", "aria-label": "Retry " + j.file_name, text: "Retry",
        onclick: () => act("POST", `/api/v1/jobs/${j.task_id}/retry`) }),
      el("button", { type: "button", "aria-label": "Dismiss " + j.file_name, text: "Dismiss",
        onclick: () => dismissJob(j) }))));
  $("cancelled").replaceChildren(...(items.length ? items : [el("li", { class: "muted", text: "No cancelled job." })]));
  pager("cancelled-pager", state.cancelledOffset, list.total, (o) => { state.cancelledOffset = o; refresh("all", true); });
}

// -- files ---------------------------------------------------------------------------------

async function drawFiles() {
  const name = state.search ? "&name=" + encodeURIComponent(state.search) : "";
  const list = await get(`/api/v1/files?state=present,missing&limit=${PAGE}&offset=${state.filesOffset}${name}`);
  const items = list.files.map((f) => el("li", {},
    el("div", { class: "row" },
      el("a", { class: "name", href: "#/file/" + f.file_uuid, text: f.file_name }),
      f.status ? statusWord(f.status) : el("span", { class: "muted", text: "no job" }),
      f.state !== "present" ? el("span", { class: "muted", text: f.state }) : null,
      inFolderOf(f.path))));
  $("files").replaceChildren(...(items.length ? items : [state.search ? el("li", { class: "muted", text: "No file by that name." }) : whereFilesGo(state.status)]));
  pager("files-pager", state.filesOffset, list.total, (o) => { state.filesOffset = o; refresh("all", true); });
}

// The empty console says where files go: the drop folders, and how uploaders reach them.
function whereFilesGo(status) {
  const folders = (status && status.drop_folders) || [];
  if (!folders.length) {
    return el("li", { class: "muted", id: "where-files-go",
      text: "No file yet. This node watches no folder: files come from the nodes that do, or `momentry-edge submit`." });
  }
  const address = status.upload_address;
  return el("li", { id: "where-files-go" },
    el("p", { text: `No file yet. Put video or audio files in ${folders.length > 1 ? "one of the drop folders" : "the drop folder"} (any folder in it too); each is taken once its upload has finished:` }),
    el("ul", {}, ...folders.map((f) => el("li", {}, el("code", { text: f })))),
    address ? el("p", {}, "Uploaders reach it at ", el("code", { text: address }), ".")
      : el("p", { class: "muted", text: "Copy files there on this machine, or upload them to it (SFTP, a shared folder); service.upload_address names the address here." }));
}

$("search").addEventListener("submit", (event) => {
  event.preventDefault();
  state.search = $("search-name").value.trim();
  state.filesOffset = 0;
  refresh("all", true);
});

async function drawRejected() {
  const list = await get(`/api/v1/files?state=rejected,ignored&limit=${PAGE}&offset=${state.rejectedOffset}`);
  const items = list.files.map((f) => el("li", {},
    el("div", { class: "row" },
      el("span", { class: "name", text: f.path || f.file_name }),
      el("span", { class: "status status-failed", text: f.state })),
    el("div", { class: "muted", text: f.reason || "no reason recorded" })));
  $("rejected").replaceChildren(...(items.length ? items : [el("li", { class: "muted", text: "No rejected or ignored file." })]));
  pager("rejected-pager", state.rejectedOffset, list.total, (o) => { state.rejectedOffset = o; refresh("all", true); });
}

// -- one file's page -----------------------------------------------------------------------

function route() {
  const match = location.hash.match(/^#\/file\/([0-9a-f]{32})(?:\/at\/([0-9]+(?:\.[0-9]+)?))?$/);
  state.at = match && match[2] !== undefined ? Number(match[2]) : null;  // a moment: its line shown
  for (const url of state.blobs) URL.revokeObjectURL(url);
  state.blobs = [];
  state.fileUuid = match ? match[1] : null;
  $("home").hidden = !!match;
  $("file").hidden = !match;
  if (match) drawFile(match[1]).catch((e) => { if (e.status !== 401) sayReadFailed(e); });
  else refresh("all");
}
window.addEventListener("hashchange", () => { if (!$("app").hidden) route(); });

async function blobUrl(path) {
  const url = URL.createObjectURL(await (await call("GET", path)).blob());
  state.blobs.push(url);
  return url;
}

async function download(path, name) {
  try {
    const url = await blobUrl(path);
    const link = el("a", { href: url, download: name });
    document.body.append(link);
    link.click();
    link.remove();
  } catch (e) {
    if (e.status !== 401) say(e.message);
  }
}

const base = (uuid) => "/api/v1/files/" + uuid;
const results = (uuid, name) => optional(`${base(uuid)}/results/${name}`);

async function drawFile(uuid) {
  const file = await get(base(uuid));
  $("file-name").textContent = file.file_name;
  const facts = [
    ["Folder", folderOf(file.path) === "." ? "the drop folder itself" : folderOf(file.path)],
    ["State", file.state + (file.reason ? ": " + file.reason : "")],
    ["Status", file.status || "no job"],
    ["Duration", file.duration ? clockTime(file.duration) : "not known"],
    ["Picture", pictureOf(file)],
    ["Sound", file.audio_codec || "none"], ["Registered", when(file.registered_at)],
  ];
  $("file-facts").replaceChildren(...facts.flatMap(([k, v]) => [el("dt", { text: k }), el("dd", { text: v })]));
  state.skipped = skippedOf(await drawJobs(file));
  // Only what has a document is asked for: a 404 would be logged by the browser.
  const shown = file.results || {};
  const [cut, asr, asrx, yolo, ocr, face, pose] = await Promise.all(
    ["cut", "asr", "asrx", "yolo", "ocr", "face", "pose"].map((p) => (shown[p] ? results(uuid, p) : null)));
  if (state.fileUuid !== uuid) return;
  drawScenes(uuid, cut);
  drawTranscript(uuid, file, asrx && asrx.result ? ["asrx", asrx] : ["asr", asr]);
  drawFound("objects", yolo, (frame) => (frame.detections || []).map((d) => d.label), "No objects found", "yolo");
  drawFound("text", ocr, (frame) => (frame.lines || []).map((l) => l.text), "No text found", "ocr");
  drawPeople(face, pose, file.duration);
}

// A sound file has no picture (none, not "not known"), and a file not probed yet one not known.
function pictureOf(file) {
  if (file.width) return `${file.width}×${file.height}, ${file.fps} fps, ${file.video_codec}`;
  return file.audio_codec && !file.video_codec ? "none (a sound file)" : "not known";
}

// The processors the file's newest job skipped, with why: "cut was skipped", not "has not run".
function skippedOf(jobs) {
  const newest = (jobs || []).find((j) => j);
  const skipped = {};
  for (const [name, run] of Object.entries((newest && newest.processors) || {})) {
    if (run.status === "skipped") skipped[name] = run.reason || "nothing to do";
  }
  return skipped;
}

async function drawFileJobs() {
  const file = await get(base(state.fileUuid));
  drawJobs(file);
}

// The file's jobs (the newest 10), each with its processors and how they ended; one that
// ended short can be retried here, one waiting or running cancelled.
const ENDED_SHORT = ["failed", "partial", "cancelled"];
const UNDER_WAY = ["pending", "retrying", "processing"];

async function drawJobs(file) {
  const jobs = await Promise.all(file.jobs.slice(0, 10).map((j) => optional("/api/v1/jobs/" + j.task_id)));
  const job = (j) => Object.assign({ file_name: file.file_name }, j);
  $("file-jobs").replaceChildren(...file.jobs.slice(0, 10).map((j, i) => el("li", {},
    el("div", { class: "row" }, el("span", { class: "name", text: j.task_id }), statusWord(j.status),
      el("span", { class: "muted", text: "created " + when(j.created_at) }),
      ENDED_SHORT.includes(j.status) ? el("button", { type: "button", "aria-label": "Retry " + j.task_id,
        text: "Retry", onclick: () => act("POST", `/api/v1/jobs/${j.task_id}/retry`) }) : null,
      UNDER_WAY.includes(j.status) ? el("button", { type: "button", "aria-label": "Cancel " + j.task_id,
        text: "Cancel", onclick: () => cancelJob(job(j)) }) : null),
    jobs[i] ? el("div", { class: "muted", text: Object.entries(jobs[i].processors)
      .map(([name, run]) => `${name}: ${run.status}`).join(" · ") }) : null,
    ...(jobs[i] ? causes(failedRuns(jobs[i])) : []),
    jobLog(j.task_id))));
  return jobs;
}

// The job's log lines (those `logs --job` prints), read when opened, again at each redraw.
function jobLog(task) {
  const lines = el("pre", { class: "log", text: "reading…" });
  const read = () => get(`/api/v1/jobs/${task}/log?limit=200`).then((r) => {
    lines.textContent = r.lines.join("\n") || `no line about this job in the log of ${r.node}`;
  }, (e) => { lines.textContent = e.message; });
  const open = state.openLogs.has(task);
  if (open) read();
  return el("details", { open, ontoggle: (e) => {
    if (e.target.open && !state.openLogs.has(task)) { state.openLogs.add(task); read(); }
    if (!e.target.open) state.openLogs.delete(task);
  } }, el("summary", { text: "Log" }), lines);
}

// What is shown is the last complete result; a newer run that failed or was stopped is
// named above it, and a result that is not complete (none is) says so.
function runNote(doc, what, tag) {
  if (!doc) return null;
  const ended = (run) => (run.status === "partial" ? "was stopped" : run.status)
    + (run.last_checkpoint && run.last_checkpoint.timestamp != null ? " at " + clockTime(run.last_checkpoint.timestamp) : "")
    + (run.error ? ": " + run.error : "");
  const later = doc.later_run;
  const text = later ? `A later ${what} run (${later.task_id}) ${ended(later)}. Shown: the last complete result (${doc.task_id}).`
    : doc.status !== "completed" ? `Not complete: this ${what} run ${ended(doc)}.` : null;
  return text ? el(tag, { class: "note later", role: "note", text }) : null;
}

const noted = (note, items) => (note ? [note, ...items] : items);

function notRun(doc, what) {
  if (!doc && state.skipped && state.skipped[what]) return `${what} was skipped: ${state.skipped[what]}.`;
  if (!doc) return `${what} has not run on this file.`;
  if (doc.status !== "completed" && !doc.result) return `${what} ${doc.status}: ${doc.error || ""}`;
  return null;
}

async function drawScenes(uuid, cut) {
  const why = notRun(cut, "cut");
  if (why) { $("scenes").replaceChildren(el("li", { class: "muted", text: why })); return; }
  const scenes = cut.result.scenes.slice(0, 300);
  $("scenes").replaceChildren(...noted(runNote(cut, "cut", "li"), scenes.map((s) => {
    const caption = `Scene ${s.index + 1}: ${clockTime(s.start)}–${clockTime(s.end)}`;
    const img = el("img", { alt: caption, width: 160, height: 90 });
    if (s.thumbnail) blobUrl(`${base(uuid)}/thumbnails/${s.index}`).then((u) => { img.src = u; }, () => { img.alt = caption + " (no picture)"; });
    return el("li", {}, el("figure", {}, img, el("figcaption", { text: caption })));
  })));
}

function drawTranscript(uuid, file, [name, doc]) {
  const why = notRun(doc, "asr");
  const stem = file.file_name.replace(/\.[^.]*$/, "");
  $("downloads").replaceChildren();
  if (why) { $("transcript").replaceChildren(el("li", { class: "muted", text: why })); return; }
  $("downloads").append(
    el("button", { type: "button", text: "Download SRT", onclick: () => download(`${base(uuid)}/results/${name}.srt`, `${stem}.srt`) }),
    el("button", { type: "button", text: "Download VTT", onclick: () => download(`${base(uuid)}/results/${name}.vtt`, `${stem}.vtt`) }),
    el("button", { type: "button", text: "Download JSON", onclick: () => download(`${base(uuid)}/results/${name}`, `${stem}.${name}.json`) }));
  const segments = doc.result.segments || [];
  $("transcript").replaceChildren(...noted(runNote(doc, name, "li"), segments.length ? segments.map((s) => el("li", {
    class: state.at !== null && s.start <= state.at && state.at < s.end + 0.001 ? "here" : null },
    el("time", { text: `${clockTime(s.start)} → ${clockTime(s.end)}` }), el("span", { text: s.text.trim() })))
    : [el("li", { class: "muted", text: "No speech found." })]));
  const here = $("transcript").querySelector("li.here");
  if (here) { here.setAttribute("aria-current", "true"); here.scrollIntoView({ block: "center" }); }
}

// Times a thing is seen, as spans: frames closer than three sampling steps join one span.
function spans(times) {
  const sorted = [...new Set(times)].sort((a, b) => a - b);
  const steps = sorted.slice(1).map((t, i) => t - sorted[i]).filter((d) => d > 0);
  const step = steps.length ? Math.min(...steps) : 1;
  const out = [];
  for (const t of sorted) {
    const lastSpan = out[out.length - 1];
    if (lastSpan && t - lastSpan[1] <= 3 * step) lastSpan[1] = t;
    else out.push([t, t]);
  }
  return out.map(([a, b]) => (a === b ? clockTime(a) : `${clockTime(a)}–${clockTime(b)}`)).join(", ");
}

function drawFound(id, doc, namesOf, none, what) {
  const why = notRun(doc, what);
  if (why) { $(id).replaceChildren(el("li", { class: "muted", text: why })); return; }
  const seen = new Map();
  for (const frame of doc.result.frames || []) {
    for (const name of namesOf(frame)) {
      if (!seen.has(name)) seen.set(name, []);
      seen.get(name).push(frame.timestamp);
    }
  }
  const rows = [...seen.entries()].sort((a, b) => b[1].length - a[1].length).slice(0, 200);
  $(id).replaceChildren(...noted(runNote(doc, what, "li"), rows.length ? rows.map(([name, times]) => el("li", {},
    el("strong", { text: name }), ` in ${times.length} frame${times.length === 1 ? "" : "s"}: `,
    el("time", { text: spans(times) }))) : [el("li", { class: "muted", text: none })]));
}

function drawPeople(face, pose, duration) {
  const parts = [];
  for (const [what, doc, key] of [["Faces", face, "faces"], ["People (poses)", pose, "people"]]) {
    const why = notRun(doc, what === "Faces" ? "face" : "pose");
    if (why) { parts.push(el("p", { class: "muted", text: why })); continue; }
    const note = runNote(doc, what === "Faces" ? "face" : "pose", "p");
    if (note) parts.push(note);
    const frames = doc.result.frames || [];  // those with one at least
    const sampled = doc.result.frames_sampled ?? frames.length;  // every frame looked at
    const counts = frames.map((f) => (f[key] || []).length);
    let most = 0;  // a loop: Math.max(...counts) throws past ~125,000 frames
    for (const c of counts) if (c > most) most = c;
    const at = frames[counts.indexOf(most)];
    parts.push(el("p", { text: `${what}: at most ${most} at once` + (most && at ? ` (first at ${clockTime(at.timestamp)})` : "")
      + `, over ${sampled} sampled frame${sampled === 1 ? "" : "s"}` + (sampled > frames.length ? `, ${frames.length} of them with any` : "") + "." }));
    if (most) parts.push(timeline(frames, counts, most, duration, doc.result.sample_fps, what));
  }
  $("people").replaceChildren(...parts);
}

// How many at once over the file's whole duration: a bar per stretch of time, empty where
// none was seen (two faces at 0:38 are a mark at 0:38, not a full strip).
function timeline(frames, counts, most, duration, fps, what) {
  const last = frames.length ? frames[frames.length - 1].timestamp : 0;
  const length = Math.max(duration || 0, last, 0.001);
  const n = Math.max(1, Math.min(120, Math.round(length * (fps || 1))));
  const peak = new Array(n).fill(0);
  frames.forEach((f, i) => {
    const bin = Math.min(n - 1, Math.floor(f.timestamp / (length / n)));
    if (counts[i] > peak[bin]) peak[bin] = counts[i];
  });
  const bars = peak.map((c, i) => {
    const bar = el("span", { title: `${clockTime(i * length / n)}–${clockTime((i + 1) * length / n)}: ${c}` });
    bar.style.height = (100 * c / most) + "%";
    return bar;
  });
  return el("div", { class: "bars", role: "img",
    "aria-label": `${what} count over time, from 0 to ${most}, over 0:00–${clockTime(length)}` }, ...bars);
}

start();

// -- find the moment -----------------------------------------------------------------------
// One box: files by name and moments by what was said, shown or written (GET /api/v1/search);
// "by meaning" asks for the moments nearest in sense (mode=meaning), whatever their words.
// A hit opens the file's page at its moment (#/file/<uuid>/at/<seconds>), its transcript
// line marked; the link can be copied, and the hits exported as CSV.

const FIND_PAGE = 50;
const find = { q: "", hits: [], pictures: [] };
const momentLink = (hit) => "#/file/" + hit.file.file_uuid + (hit.start === null ? "" : "/at/" + hit.start.toFixed(3));
const SOURCES = { asr: "said", asrx: "said", ocr: "on screen", yolo: "seen", name: "file name" };

$("find-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  find.q = $("find-q").value.trim();
  if (!find.q) { $("find-results").hidden = true; return; }
  try {
    const mode = $("find-meaning").checked ? "&mode=meaning" : "";
    const found = await get(`/api/v1/search?limit=${FIND_PAGE}${mode}&q=` + encodeURIComponent(find.q));
    find.hits = found.hits;
    drawHits(found);
  } catch (e) {
    if (e.status !== 401) { find.hits = []; drawHits(null, e.message); }
  }
});

function drawHits(found, problem) {
  $("find-results").hidden = false;
  $("find-csv").hidden = !find.hits.length;
  for (const url of find.pictures) URL.revokeObjectURL(url);
  find.pictures = [];
  if (!found) { $("find-count").textContent = problem; $("find-hits").replaceChildren(); return; }
  const more = found.total_exact ? "" : "more than ";
  $("find-count").textContent = (found.total ? `${more}${found.total} found` : "Nothing found")
    + (found.total > found.hits.length ? `, the best ${found.hits.length} shown` : "")
    + (found.index.complete ? "" : found.mode === "meaning"
      ? ` (still reading the meaning of ${found.index.waiting} moments)`
      : ` (still indexing ${found.index.waiting} earlier results)`);
  $("find-hits").replaceChildren(...found.hits.map((hit) => {
    const picture = hit.thumbnail_url ? el("img", { alt: "", width: 96, height: 54 }) : el("span", { class: "none" });
    // Kept while the hits are shown (not with the file page's pictures, revoked on leaving it).
    if (hit.thumbnail_url) {
      call("GET", hit.thumbnail_url).then((r) => r.blob()).then((b) => {
        picture.src = URL.createObjectURL(b);
        find.pictures.push(picture.src);
      }, () => picture.remove());
    }
    const where = hit.start === null ? "" : clockTime(hit.start) + " ";
    const link = el("a", { class: "name", href: momentLink(hit), text: `${hit.file.name} ${where}` });
    const copy = el("button", { type: "button", text: "Copy link", onclick: () => copyLink(hit, copy) });
    const text = el("span", {}, ...hit.snippet.map((p) => (p.match ? el("mark", { text: p.text }) : p.text)));
    return el("li", { class: "hit" }, picture, el("div", {},
      el("div", { class: "row" }, link, el("span", { class: "muted", text: SOURCES[hit.processor] || hit.processor }), copy),
      text));
  }));
}

async function copyLink(hit, button) {
  const url = location.origin + location.pathname + momentLink(hit);
  try {
    await navigator.clipboard.writeText(url);
    button.textContent = "Copied";
  } catch (_) {  // no clipboard here (a page over plain http): shown to copy by hand
    window.prompt("Link to this moment", url);
  }
}

$("find-csv").addEventListener("click", () => {
  const cell = (v) => (v === null || v === undefined ? "" : /[",\n\r]/.test(String(v)) ? `"${String(v).replace(/"/g, '""')}"` : String(v));
  const rows = [["file", "folder", "file_uuid", "source", "start", "end", "timecode", "text", "link"]];
  for (const h of find.hits) {
    rows.push([h.file.name, h.file.folder, h.file.file_uuid, h.processor, h.start, h.end,
      h.start === null ? "" : clockTime(h.start), h.text, location.origin + location.pathname + momentLink(h)]);
  }
  const csv = rows.map((r) => r.map(cell).join(",")).join("\r\n") + "\r\n";
  const url = URL.createObjectURL(new Blob([csv], { type: "text/csv;charset=utf-8" }));
  const link = el("a", { href: url, download: "moments.csv" });
  document.body.append(link);
  link.click();
  link.remove();
  URL.revokeObjectURL(url);
});
