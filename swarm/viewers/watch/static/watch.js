// slotswarm watch: the live swarm, slot by slot. Plain JavaScript, no build step.
//
// Fed by server-sent events from /watch/events (swarm/viewers/watch/hub.py): unnamed
// events are batches of the stream's JSON lines, one a line (schema:
// runtime/events/kinds.py), named ones the hub's news (hello, reset, status). Everything the page shows comes from one
// model, built by apply(event) and published read-only as window.swarmState so
// tools and tests read exactly what is drawn.
"use strict";

const FOREGROUND = 10; // runtime/scheduling/priority.py
const TERMINAL = new Set(["turn.finished", "turn.cancelled", "turn.failed"]);
const MAX_MARKS = 20000; // runs, pauses and bands kept for drawing (counts are never trimmed)
const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
                 "#7f7f7f", "#bcbd22", "#17becf"]; // matplotlib's tab10, as `swarm plot` uses

// ------------------------------------------------------------------ the model

function newModel() {
  return {
    started: null, stopped: false, t: 0, step: 0,
    slots: [],          // slot -> the run holding it, or null
    turns: new Map(),   // live turns: id -> {id, agent, priority, slot, paused, run, pause, tokens}
    agents: new Map(),  // name -> row of the agents table
    runs: [],           // {turn, agent, slot, start, end, foreground}
    pauses: [],         // {turn, agent, slot, t, by_agent, resumed_slot, resumed_t, ended_t, received_at, shown_at}
    bands: [],          // {agent, by_agent, priority, base_priority, start, end, received_at, shown_at, cleared_at}
    drops: [],          // {t, count}: where the stream lost events (count null: unknown)
    counts: { events: 0, turns: 0, admitted: 0, preemptions: 0, resumes: 0, inheritances: 0, restores: 0,
              finished: 0, cancelled: 0, failed: 0, crashes: 0, dropped: 0, drop_notices: 0, unknown: 0 },
    latency: { fg_wait: new Samples(), ttft: new Samples(), itl: new Samples() },
    colours: new Map(),
    redrawFrom: -Infinity, // the oldest time news touched since the lanes were last drawn (lanes.js)
  };
}

// Samples kept sorted for percentiles: new ones wait in `fresh` and are merged in
// when a figure is asked for, so a draw costs one merge, not a sort of them all
// (inter-token latency gets a sample a token).
class Samples {
  constructor() { this.sorted = []; this.fresh = []; }
  push(x) { this.fresh.push(x); }
  get length() { return this.sorted.length + this.fresh.length; }
  all() {
    if (this.fresh.length) {
      const a = this.sorted, b = this.fresh.sort((x, y) => x - y), out = new Array(a.length + b.length);
      let i = 0, j = 0, k = 0;
      while (i < a.length && j < b.length) out[k++] = a[i] <= b[j] ? a[i++] : b[j++];
      while (i < a.length) out[k++] = a[i++];
      while (j < b.length) out[k++] = b[j++];
      this.sorted = out; this.fresh = [];
    }
    return this.sorted;
  }
}

function agentRow(m, name) {
  let a = m.agents.get(name);
  if (!a) {
    a = { name, base_priority: null, priority: null, inherited_by: null, inherited_priority: null,
          tokens: 0, paused_s: 0, preemptions: 0, turns: 0, waiting: 0, running: 0, paused: 0, crashed: null };
    m.agents.set(name, a);
    m.colours.set(name, PALETTE[m.colours.size % PALETTE.length]);
  }
  return a;
}

function trim(list) {
  if (list.length > MAX_MARKS) list.splice(0, list.length - MAX_MARKS);
}

function openRun(m, turn, e) {
  const run = { turn: turn.id, agent: turn.agent, slot: e.slot, start: e.t, end: null,
                foreground: (e.priority ?? 0) >= FOREGROUND };
  m.runs.push(run); trim(m.runs);
  turn.run = run; turn.slot = e.slot;
  while (m.slots.length <= e.slot) m.slots.push(null);
  m.slots[e.slot] = run;
}

function closeRun(m, turn, t) {
  if (!turn.run) return;
  turn.run.end = t;
  if (m.slots[turn.run.slot] === turn.run) m.slots[turn.run.slot] = null;
  turn.run = null; turn.slot = null;
}

// Applies one event to the model; true for a mark the lanes show at once (a
// pause, an inheritance, lost events).
function apply(m, e, receivedAt) {
  if (!e || typeof e !== "object" || typeof e.event !== "string") return;
  const c = m.counts;
  if (e.event === "events.dropped") {
    c.drop_notices += 1;
    if (typeof e.count === "number") c.dropped += e.count;
    m.drops.push({ t: m.t, count: typeof e.count === "number" ? e.count : null }); trim(m.drops);
    if (m.t < m.redrawFrom) m.redrawFrom = m.t;
    return true;
  }
  c.events += 1;
  if (typeof e.t === "number") {
    if (e.t > m.t) m.t = e.t;
    if (e.t < m.redrawFrom) m.redrawFrom = e.t;
  }
  if (typeof e.step === "number" && e.step > m.step) m.step = e.step;
  const a = typeof e.agent === "string" && e.agent !== "gpu" ? agentRow(m, e.agent) : null;
  const turn = e.turn != null ? m.turns.get(e.turn) : undefined;
  if (a && turn === undefined && e.turn != null && e.event !== "turn.queued" && !TERMINAL.has(e.event)) {
    // A turn queued before this page started listening: known from here on.
    m.turns.set(e.turn, { id: e.turn, agent: e.agent, priority: e.priority, slot: null, paused: false, run: null, pause: null, tokens: 0 });
    a.waiting += 1;
  }
  const tr = e.turn != null ? m.turns.get(e.turn) : undefined;
  if (tr && typeof e.priority === "number") tr.priority = e.priority;
  switch (e.event) {
    case "swarm.started":
      m.started = { slots: e.slots, policy: e.policy, device: e.device, model: e.model, unix_time: e.unix_time, t: e.t };
      while (m.slots.length < (e.slots || 0)) m.slots.push(null);
      m.stopped = false;
      break;
    case "swarm.stopped":
      m.stopped = true;
      break;
    case "turn.queued":
      c.turns += 1;
      if (!a) break;
      a.turns += 1; a.waiting += 1;
      if (!a.inherited_by && typeof e.priority === "number") a.base_priority = e.priority;
      m.turns.set(e.turn, { id: e.turn, agent: e.agent, priority: e.priority, slot: null, paused: false, run: null, pause: null, tokens: 0 });
      break;
    case "turn.admitted":
      c.admitted += 1;
      if (!tr || e.slot == null) break;
      a.waiting -= 1; a.running += 1;
      openRun(m, tr, e);
      if ((e.priority ?? 0) >= FOREGROUND && typeof e.waited_s === "number") m.latency.fg_wait.push(e.waited_s);
      break;
    case "turn.preempted":
      c.preemptions += 1;
      if (!a) break;
      a.preemptions += 1;
      if (!tr) break;
      if (tr.run) { a.running -= 1; a.paused += 1; } // (a memory preemption may hit a paused turn)
      const slot = e.slot ?? tr.slot;
      closeRun(m, tr, e.t);
      tr.paused = true;
      if (typeof e.tokens === "number") tr.tokens = e.tokens; // generated so far: counted before the turn ends
      tr.pause = { turn: e.turn, agent: e.agent, slot, t: e.t, by_agent: e.by_agent ?? null, by_turn: e.by_turn ?? null,
                   resumed_slot: null, resumed_t: null, ended_t: null, received_at: receivedAt, shown_at: null };
      m.pauses.push(tr.pause); trim(m.pauses);
      break;
    case "turn.resumed":
      c.resumes += 1;
      if (!a) break;
      if (typeof e.paused_s === "number") a.paused_s += e.paused_s;
      if (!tr || e.slot == null) break;
      if (tr.paused) { a.paused -= 1; a.running += 1; } else if (!tr.run) { a.waiting -= 1; a.running += 1; }
      if (tr.pause) { // (the link to the resume starts back at the pause)
        tr.pause.resumed_slot = e.slot; tr.pause.resumed_t = e.t;
        if (tr.pause.t < m.redrawFrom) m.redrawFrom = tr.pause.t;
        tr.pause = null;
      }
      tr.paused = false;
      openRun(m, tr, e);
      break;
    case "turn.progress": // a running turn's tokens so far, told now and then
      if (tr && typeof e.tokens === "number" && e.tokens > tr.tokens) tr.tokens = e.tokens;
      break;
    case "turn.finished": case "turn.cancelled": case "turn.failed":
      c[e.event.slice(5)] += 1;
      if (!a) break;
      a.tokens += e.tokens || 0;
      if ((e.priority ?? 0) >= FOREGROUND) {
        if (typeof e.ttft_s === "number") m.latency.ttft.push(e.ttft_s);
        addGaps(m.latency.itl, e);
      }
      if (!tr) break;
      if (tr.run) a.running -= 1; else if (tr.paused) a.paused -= 1; else a.waiting -= 1;
      if (tr.pause) tr.pause.ended_t = e.t;
      closeRun(m, tr, e.t);
      m.turns.delete(e.turn);
      break;
    case "priority.inherited":
      c.inheritances += 1;
      if (!a) break;
      closeBand(m, a, e.t);
      a.inherited_by = e.by_agent ?? "?"; a.inherited_priority = e.priority ?? null;
      if (typeof e.base_priority === "number") a.base_priority = e.base_priority;
      m.bands.push({ agent: e.agent, by_agent: e.by_agent ?? "?", priority: e.priority, base_priority: e.base_priority,
                     start: e.t, end: null, received_at: receivedAt, shown_at: null, cleared_at: null });
      trim(m.bands);
      break;
    case "priority.restored":
      c.restores += 1;
      if (!a) break;
      closeBand(m, a, e.t, receivedAt);
      a.inherited_by = null; a.inherited_priority = null;
      if (typeof e.base_priority === "number") a.base_priority = e.base_priority;
      break;
    case "agent.crashed":
      c.crashes += 1;
      if (a) a.crashed = e.reason || "crashed";
      break;
    case "kv.swapped_out": case "kv.swapped_in": case "kv.recomputed": case "step.abandoned": case "tool.called":
      break;
    default:
      c.unknown += 1; // a kind newer than this page: counted, otherwise ignored
  }
  return e.event === "turn.preempted" || e.event === "priority.inherited"; // a mark: drawn at once
}

// Inter-token latency is per token, as in the run summary: each gap its reader
// waited, from the turn's token times, so a pause is one long gap among short
// ones. A log from before end events carried them has only the turn's mean gap:
// then that, once per gap.
function addGaps(itl, e) {
  const times = e.token_s;
  if (Array.isArray(times) && times.length === e.tokens) {
    for (let i = 1; i < times.length; i++) itl.push(times[i] - times[i - 1]);
  } else if (typeof e.itl_s === "number") {
    for (let i = 1; i < e.tokens; i++) itl.push(e.itl_s);
  }
}

function closeBand(m, a, t, receivedAt) {
  for (let i = m.bands.length - 1; i >= 0; i--) {
    const b = m.bands[i];
    if (b.agent === a.name && b.end === null) { b.end = t; b.cleared_at = receivedAt ?? null; return; }
  }
}

// An agent's tokens: its ended turns' and what its live turns are known to have
// generated so far (turn.progress and a pause say how many), so a long turn
// counts before it ends.
function agentTokens(m, a) {
  let n = a.tokens;
  for (const tr of m.turns.values()) if (tr.agent === a.name) n += tr.tokens;
  return n;
}

function agentState(a) {
  if (a.crashed) return "crashed";
  if (a.running > 0) return a.paused > 0 ? `running ${a.running}, paused ${a.paused}` : `running ${a.running}`;
  if (a.paused > 0) return `paused ${a.paused}`;
  if (a.waiting > 0) return `waiting ${a.waiting}`;
  return "idle";
}

function effectivePriority(m, a) {
  let p = a.inherited_priority ?? a.base_priority;
  for (const tr of m.turns.values()) {
    if (tr.agent === a.name && typeof tr.priority === "number" && (p === null || tr.priority > p)) p = tr.priority;
  }
  return p;
}

// Linear interpolation between closest ranks: numpy.percentile's default, as the run summary uses.
function percentile(sorted, q) {
  if (!sorted.length) return null;
  const pos = (sorted.length - 1) * q / 100, lo = Math.floor(pos), hi = Math.ceil(pos);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo);
}

function summary(samples) {
  const s = samples.all();
  return { n: s.length, p50: percentile(s, 50), p90: percentile(s, 90), p99: percentile(s, 99), max: s.length ? s[s.length - 1] : null };
}

// ------------------------------------------------------------ the connection

const page = {
  model: newModel(),
  mode: null,            // "live" or "replay", as the hub says
  source: "",
  status: { text: "connecting…", live: false },
  connected: false,
  lastId: null,
  lastEventAt: 0,        // performance.now() of the newest live event, to scroll between events
  drawnLanes: 0,         // slot lanes on the canvas as last drawn
  replay: { events: [], next: 0, clock: 0, playing: true, speed: 1, lastTick: null },
  source_es: null,
};

function connect() {
  const url = "watch/events" + (page.lastId ? "?last=" + encodeURIComponent(page.lastId) : "");
  const es = new EventSource(url);
  page.source_es = es;
  es.onopen = () => { page.connected = true; changed(); };
  es.onerror = () => {
    page.connected = false; changed();
    if (es.readyState === EventSource.CLOSED) { // the server refused us: try again ourselves
      setTimeout(connect, 2000);
    }
  };
  es.addEventListener("hello", (msg) => {
    const hello = JSON.parse(msg.data);
    if (page.mode !== null && page.mode !== hello.mode) startOver();
    page.mode = hello.mode; page.source = hello.source;
    document.getElementById("replay").hidden = page.mode !== "replay";
    changed();
  });
  es.addEventListener("reset", () => { startOver(); changed(); });
  es.addEventListener("status", (msg) => { page.status = JSON.parse(msg.data); changed(); });
  es.onmessage = (msg) => {
    page.lastId = msg.lastEventId || page.lastId;
    const receivedAt = Date.now();
    let mark = false; // a batch with a mark in it is drawn at once
    for (const line of msg.data.split("\n")) { // a batch: one event a line
      let e;
      try { e = JSON.parse(line); } catch { continue; } // not an event: ignored
      if (page.mode === "replay") page.replay.events.push(e);
      else mark = apply(page.model, e, receivedAt) || mark;
    }
    if (page.mode === "replay") return changed();
    page.lastEventAt = performance.now();
    news(mark);
  };
}

function startOver() {
  page.model = newModel();
  page.replay.events = []; page.replay.next = 0; page.replay.clock = 0; page.replay.lastTick = null;
}

// ----------------------------------------------------------------- replaying

function replayStart() { return page.replay.events.length ? page.replay.events[0].t || 0 : 0; }
function replayEnd() { const ev = page.replay.events; return ev.length ? ev[ev.length - 1].t || 0 : 0; }

function replayTo(clock) {
  const r = page.replay;
  if (clock < r.clock) { page.model = newModel(); r.next = 0; }
  r.clock = clock;
  while (r.next < r.events.length && (r.events[r.next].t ?? 0) <= clock) {
    apply(page.model, r.events[r.next], Date.now());
    r.next += 1;
  }
}

function tickReplay(now) {
  const r = page.replay;
  if (page.mode !== "replay") return;
  if (r.playing && r.events.length) {
    const dt = r.lastTick === null ? 0 : (now - r.lastTick) / 1000;
    if (r.next === 0 && r.clock < replayStart()) r.clock = replayStart();
    replayTo(Math.min(r.clock + dt * r.speed, replayEnd()));
    if (r.next >= r.events.length) r.playing = false;
    drawing.dirty = true;
  }
  r.lastTick = r.playing ? now : null;
}

function setupReplayControls() {
  const r = page.replay;
  const play = document.getElementById("play");
  play.onclick = () => {
    if (!r.playing && r.next >= r.events.length) replayTo(replayStart() - 1); // at the end: from the start
    r.playing = !r.playing; changed();
  };
  document.getElementById("speed").onchange = (ev) => { r.speed = Number(ev.target.value); changed(); };
  document.getElementById("seek").oninput = (ev) => {
    const s = replayStart(), e = replayEnd();
    replayTo(s + (e - s) * Number(ev.target.value) / 1000); changed();
  };
  document.getElementById("to-end").onclick = () => { replayTo(replayEnd()); r.playing = false; changed(); };
}

// ------------------------------------------------------------------- drawing

// When a page draws. Every frame costs the browser CPU whatever it shows, most
// of it outside the page's script (style, layout, paint, raster, compositing),
// and the swarm may share the machine with the browser. Measured with ten
// settled headless pages on the 2-core machine: a page that only takes its
// batch of events each second costs 0.65 ms of CPU a second; an animation frame
// a second adds 0.9 ms, changing a canvas in it 0.7 ms more, changing text in it
// 1.6 ms more. So frames are rationed by what they cost:
// - a mark (pause, inheritance, lost events; the hub sends it within 0.25 s) or
//   something the reader did is drawn at once;
// - otherwise news waits for the next ordinary frame, which comes FRAME_SHARE⁻¹
//   times the last frames' cost after the one before, between 1 and 10 s.
//   A frame's cost is what its main thread took, from its animation frame to a
//   task queued behind the rendering that follows; on a busy machine the
//   renderer waits for a core meanwhile, so pages draw less often just when
//   the swarm needs the CPU;
// - a replay that plays draws ten frames a second;
// - nothing changes: no frames. (A hidden page gets no animation frames.)
const FRAME_SHARE = 0.003, MIN_MS = 1000, MAX_MS = 10000, PLAY_MS = 100;
const drawing = { urgent: true, dirty: true, lastFrame: -Infinity, timer: null, timerAt: Infinity,
                  frameMs: null, intervalMs: MIN_MS, frames: 0 };

function changed() { drawing.urgent = drawing.dirty = true; schedule(); }
function news(mark) { drawing.dirty = true; if (mark) drawing.urgent = true; schedule(); }

function schedule() {
  const d = drawing;
  const live = page.mode === "live" && page.status.live && !page.model.stopped;
  const playing = page.mode === "replay" && page.replay.playing;
  const every = d.urgent ? 0 : playing ? PLAY_MS : d.dirty || live ? d.intervalMs : null;
  if (every === null) return; // idle until the next event or click
  const at = Math.max(d.lastFrame + every, performance.now());
  if (d.timer !== null) {
    if (d.timerAt <= at) return;
    clearTimeout(d.timer);
  }
  d.timerAt = at;
  d.timer = setTimeout(() => requestAnimationFrame(frame), at - performance.now());
}

const behindFrame = new MessageChannel();
behindFrame.port1.onmessage = (msg) => measured(performance.now() - msg.data);

function frame(now) {
  const d = drawing, began = performance.now();
  d.timer = null; d.timerAt = Infinity;
  d.lastFrame = now; d.frames += 1;
  tickReplay(now);
  draw();
  if (d.dirty) render();
  d.dirty = d.urgent = false;
  behindFrame.port2.postMessage(began);
  schedule();
}

function measured(ms) {
  const d = drawing;
  d.frameMs = d.frameMs === null ? ms : 0.7 * d.frameMs + 0.3 * ms;
  d.intervalMs = Math.min(Math.max(d.frameMs / FRAME_SHARE, MIN_MS), MAX_MS);
}

function viewEnd() {
  const m = page.model;
  if (page.mode === "replay") return page.replay.clock;
  if (page.status.live && !m.stopped && page.lastEventAt) {
    return m.t + (performance.now() - page.lastEventAt) / 1000; // keep scrolling between events
  }
  return m.t;
}

// Where the events end for good, or null while more may come: the axis of the
// window "all" then fits them.
function finalEnd() {
  const m = page.model;
  if (page.mode === "replay") return replayEnd();
  return page.status.live && !m.stopped ? null : m.t;
}

function draw() {
  const m = page.model;
  page.drawnLanes = m.slots.length;
  drawLanes(m, viewEnd(), Number(document.getElementById("window").value), finalEnd());
}

function esc(s) {
  return String(s).replace(/[&<>"']/g, (ch) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[ch]);
}

function ms(s) { return s === null ? "–" : s < 1 ? (s * 1000).toFixed(s < 0.01 ? 1 : 0) + " ms" : s.toFixed(2) + " s"; }

// What render() last wrote to each element's property: one that did not change is
// not written again, so the browser has nothing to lay out or paint there.
const written = new Map();
function put(id, prop, value) {
  let props = written.get(id);
  if (!props) { props = {}; written.set(id, props); }
  if (props[prop] === value) return;
  props[prop] = value;
  document.getElementById(id)[prop] = value;
}

// Table rows updated in place, cell by cell, and only where the text changed:
// rebuilding a table's HTML costs the browser a new layout and paint of it all,
// every time. Each row is [class, cell text...]; `made(tr, i)` decorates a new row.
function fillRows(id, rows, made) {
  const body = document.getElementById(id);
  rows.forEach((row, i) => {
    let tr = body.rows[i];
    if (!tr) {
      tr = body.insertRow();
      for (let k = 1; k < row.length; k++) tr.insertCell().append(document.createTextNode(""));
      if (made) made(tr, i);
    }
    if (tr.className !== row[0]) tr.className = row[0];
    for (let k = 1; k < row.length; k++) {
      const text = tr.cells[k - 1].lastChild, value = String(row[k]);
      if (text.data !== value) text.data = value;
    }
  });
  while (body.rows.length > rows.length) body.deleteRow(-1);
}

function render() {
  const m = page.model;
  const st = m.started;
  put("swarm", "textContent", st
    ? `${st.slots} slots · ${st.policy}${st.model ? " · " + st.model : ""}${st.device ? " · " + st.device : ""}${m.stopped ? " · stopped" : ""}`
    : (page.mode === "replay" ? "recording" : "no swarm yet"));
  // A run that ended takes its page server with it: that is its end, not a fault.
  put("status", "textContent", page.connected ? page.status.text
    : m.stopped ? "the swarm stopped; its page server has closed" : "disconnected, reconnecting…");
  put("status", "className", "status " + (page.connected && page.status.live ? "live" : page.connected ? "" : "off"));
  const c = m.counts;
  put("drops", "hidden", c.drop_notices === 0);
  put("drops", "textContent", `⚠ events lost: ${c.dropped}${m.drops.some((d) => d.count === null) ? "+" : ""}`);
  for (const k of ["turns", "finished", "preemptions", "inheritances"]) put("n-" + k, "textContent", String(c[k]));
  put("n-step", "textContent", String(m.step));
  put("n-t", "textContent", m.t.toFixed(1) + " s");

  const agents = [...m.agents.values()];
  fillRows("agent-rows", agents.map((a) => {
    const eff = effectivePriority(m, a);
    return [a.crashed ? "crashed" : a.inherited_by ? "lifted" : "", a.name, agentState(a), a.base_priority ?? "–",
            `${eff ?? "–"}${a.inherited_by ? ` (${a.inherited_by} waits)` : ""}`, agentTokens(m, a), a.paused_s.toFixed(1) + " s",
            a.preemptions, a.turns];
  }), (tr, i) => {
    const swatch = document.createElement("i");
    swatch.className = "swatch"; swatch.style.background = m.colours.get(agents[i].name);
    tr.cells[0].prepend(swatch, " ");
  });

  const lat = [["wait (request to slot)", m.latency.fg_wait], ["time to first token", m.latency.ttft], ["inter-token", m.latency.itl]];
  fillRows("latency-rows", lat.map(([label, samples]) => {
    const s = summary(samples);
    return ["", label, s.n, ms(s.p50), ms(s.p90), ms(s.p99), ms(s.max)];
  }));

  put("legend", "innerHTML", [...m.colours.entries()]
    .map(([name, colour]) => `<span><i style="background:${colour}"></i>${esc(name)}</span>`).join("") +
    '<span><i style="background:#777;outline:2px solid #000"></i>★ foreground turn</span>' +
    '<span style="color:#d00">▼ paused ⤳ <span style="color:#2a2">▲</span> resumed</span>' +
    '<span><i style="background:rgba(200,60,200,.35)"></i>inherited priority</span>');

  if (page.mode === "replay") {
    const r = page.replay, s = replayStart(), e = replayEnd();
    put("play", "textContent", r.playing ? "pause" : "play");
    put("clock", "textContent", `${r.clock.toFixed(1)} / ${e.toFixed(1)} s · ${r.next}/${r.events.length} events`);
    // (The slider is the reader's too: always set, or a drag would jump back.)
    document.getElementById("seek").value = String(e > s ? Math.round((r.clock - s) / (e - s) * 1000) : 0);
  }
}

// --------------------------------------------------------- window.swarmState

function snapshot() {
  const m = page.model;
  const agents = {};
  for (const a of m.agents.values()) {
    agents[a.name] = { state: agentState(a), base_priority: a.base_priority, priority: effectivePriority(m, a),
                       inherited_by: a.inherited_by, tokens: agentTokens(m, a), paused_s: a.paused_s, preemptions: a.preemptions,
                       turns: a.turns, running: a.running, paused: a.paused, waiting: a.waiting, crashed: a.crashed };
  }
  const copy = (o) => Object.assign({}, o);
  // When a mark's event happened on the wall clock (the swarm stamps its start
  // with unix_time), so how late the page showed it can be told.
  const st = m.started;
  const mark = (o, t) => Object.assign({}, o, st && typeof st.unix_time === "number"
    ? { event_wall_ms: st.unix_time * 1000 + (t - (st.t || 0)) * 1000 } : {});
  return {
    connected: page.connected, mode: page.mode, source: page.source, status: copy(page.status),
    started: m.started && copy(m.started), stopped: m.stopped, t: m.t, step: m.step,
    slots: m.slots.map((r) => r && { turn: r.turn, agent: r.agent, foreground: r.foreground, since: r.start }),
    drawn_lanes: page.drawnLanes,
    drawing: { frames: drawing.frames, frame_ms: drawing.frameMs, interval_ms: drawing.intervalMs,
               lanes_frames: sweep.frames, lanes_full: sweep.full, lanes_pixels: sweep.pixels,
               axis: [sweep.start, sweep.start + sweep.span] },
    agents,
    counts: copy(m.counts),
    pauses: m.pauses.map((p) => mark(p, p.t)),
    inheritances: m.bands.map((b) => mark(b, b.start)),
    drops: m.drops.map(copy),
    latency: { fg_wait: summary(m.latency.fg_wait), ttft: summary(m.latency.ttft), itl: summary(m.latency.itl) },
    replay: page.mode === "replay" ? { playing: page.replay.playing, speed: page.replay.speed, clock: page.replay.clock,
                                       end: replayEnd(), applied: page.replay.next, loaded: page.replay.events.length } : null,
  };
}

Object.defineProperty(window, "swarmState", { get: snapshot, enumerable: true });

setupReplayControls();
document.getElementById("window").onchange = () => changed();
window.addEventListener("resize", () => changed());
connect();
schedule();
