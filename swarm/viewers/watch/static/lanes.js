// slotswarm watch: the lanes canvas, one lane per slot (loaded before watch.js,
// which owns the model and calls drawLanes on its frames).
//
// The lanes sweep rather than scroll: the time axis stays put while "now" moves
// right across it, and jumps back by half a window when it reaches the right
// edge (a window of "all" doubles instead, and fits the events once they are
// all there: a recording, or a swarm that stopped). So a frame has to repaint only the
// strip of the canvas between the oldest time its news touched (the model's
// `redrawFrom`) and now: cleared, and the whole scene drawn again clipped to it,
// which gives exactly the pixels a full redraw would. A scrolling view moves
// every pixel every frame, and with fifty pages open on a busy machine, drawing
// and compositing whole canvases once a second each was most of what the pages
// cost it. The whole canvas is drawn again only when the axis jumps, the canvas
// changes size, the reader picks another window, or the model starts over.
"use strict";

const LANE = 26, BAND = 18, GUTTER = 110;
const EDGE = 6; // pixels a strip reaches past its times: marks, strokes and a run's 1-pixel gap stick out that far

// What the canvas shows now, and (for tools) how much drawing it took: frames,
// full redraws and pixels redrawn.
const sweep = { model: null, key: "", start: 0, span: 1, drawnTo: -Infinity, open: [], labelled: new WeakSet(),
                frames: 0, full: 0, pixels: 0 };

function drawLanes(m, end, win, last) {
  const canvas = document.getElementById("lanes");
  const lifted = [...new Set(m.bands.map((b) => b.agent))];
  const rows = Math.max(m.slots.length, 1);
  const height = 24 + rows * LANE + (lifted.length ? 8 + lifted.length * BAND : 0) + 8;
  const width = canvas.clientWidth || 800;
  const dpr = window.devicePixelRatio || 1;
  if (canvas.width !== Math.round(width * dpr) || canvas.height !== Math.round(height * dpr)) {
    canvas.width = Math.round(width * dpr); canvas.height = Math.round(height * dpr);
    canvas.style.height = height + "px";
  }
  moveAxis(m, end, win, last);
  const key = [width, height, dpr, win, rows, lifted.join("\n"), sweep.start, sweep.span].join("|");
  let from = Math.min(m.redrawFrom, sweep.drawnTo);
  if (sweep.model !== m || sweep.key !== key) {
    sweep.model = m; sweep.key = key; sweep.labelled = new WeakSet(); sweep.open = []; sweep.drawnTo = -Infinity;
    from = -Infinity;
  }
  const { start, span } = sweep;
  const x = (t) => GUTTER + (t - start) / span * (width - GUTTER - 10);
  // A run's label appears once the run is wide enough for it, over pixels drawn
  // before: the strip then reaches back to the run's start. (A run that opened
  // and closed since the last frame lies inside the strip whole.)
  const open = m.slots.filter((r) => r);
  for (const r of [...sweep.open, ...open]) {
    if (sweep.labelled.has(r)) continue;
    const left = Math.max(r.start, start);
    if (x(r.end ?? end) - x(left) > 34) { sweep.labelled.add(r); from = Math.min(from, left); }
  }
  sweep.open = open;
  // (Live, now can step back a little: it runs on between batches, and a batch
  // may end earlier than that. What was drawn past it is redrawn too.)
  const x0 = from === -Infinity ? 0 : Math.max(Math.floor(x(from)) - EDGE, 0);
  const x1 = from === -Infinity ? width : Math.min(Math.ceil(x(Math.max(end, sweep.drawnTo))) + EDGE, width);
  m.redrawFrom = Infinity;
  sweep.drawnTo = end;
  sweep.frames += 1;
  if (from === -Infinity) sweep.full += 1;
  if (x1 <= x0) return;
  const g = canvas.getContext("2d");
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  g.save();
  g.beginPath(); g.rect(x0, 0, x1 - x0, height); g.clip();
  g.clearRect(x0, 0, x1 - x0, height);
  g.font = "11px system-ui, sans-serif";
  g.textBaseline = "middle";
  // Times the strip covers (with its edge), to skip what lies outside it.
  const tA = start + (x0 - EDGE - GUTTER) / (width - GUTTER - 10) * span;
  const tB = start + (x1 + EDGE - GUTTER) / (width - GUTTER - 10) * span;
  drawScene(g, m, { x, width, height, rows, lifted, start, end, tA, tB });
  g.restore();
  sweep.pixels += (x1 - x0) * height;
}

function moveAxis(m, end, win, last) {
  if (win > 0) {
    if (sweep.span !== win || end > sweep.start + win || end < sweep.start) {
      sweep.span = win; sweep.start = end - win / 2;
    }
  } else if (last !== null) { // all of it, and no more will come: from 0 to the last event
    sweep.start = Math.min(0, end);
    sweep.span = Math.max(last - sweep.start, 1);
  } else { // all of it, from time 0 (or from now, for a clock before 0)
    const start = Math.min(0, end);
    if (sweep.start !== start || sweep.span < 1 || end > start + sweep.span) {
      let span = Math.max(end - start, 5) * 2;
      if (sweep.start === start && sweep.span >= 1) for (span = sweep.span; end > start + span;) span *= 2;
      sweep.start = start; sweep.span = span;
    }
  }
}

function drawScene(g, m, v) {
  const { x, width, height, rows, lifted, start, end, tA, tB } = v;
  const laneY = (slot) => 20 + slot * LANE;
  const drawnAt = Date.now();
  const axisEnd = start + sweep.span;

  // time axis
  g.fillStyle = "#888"; g.strokeStyle = "#eee";
  const stepS = niceStep(sweep.span / 8);
  for (let t = Math.ceil(start / stepS) * stepS; t <= axisEnd; t += stepS) {
    g.beginPath(); g.moveTo(x(t), 14); g.lineTo(x(t), height); g.stroke();
    g.fillText(t.toFixed(Math.max(0, -Math.floor(Math.log10(stepS) + 1e-9))) + " s", x(t) + 2, 7);
  }
  for (let s = 0; s < rows; s++) {
    g.fillStyle = "#444"; g.fillText(`slot ${s}`, 6, laneY(s) + LANE / 2);
    g.strokeStyle = "#ddd"; g.strokeRect(GUTTER, laneY(s) + 2, width - GUTTER - 10, LANE - 4);
  }
  // now
  g.strokeStyle = "#bbb"; g.beginPath(); g.moveTo(x(end), 14); g.lineTo(x(end), height); g.stroke();

  // turns in slots
  for (const r of m.runs) {
    const rEnd = r.end ?? end;
    if (rEnd < start || rEnd < tA || r.start > tB) continue;
    const x0 = Math.max(x(r.start), GUTTER), x1 = Math.max(x(rEnd), x0 + 1);
    const y = laneY(r.slot) + 4, h = LANE - 8;
    g.globalAlpha = r.foreground ? 1 : 0.5;
    g.fillStyle = m.colours.get(r.agent) || "#999";
    g.fillRect(x0, y, Math.max(x1 - x0 - 1, 1), h); // a pixel apart: turns back to back stay two
    g.globalAlpha = 1;
    if (r.foreground) { g.lineWidth = 2; g.strokeStyle = "#000"; g.strokeRect(x0, y, x1 - x0, h); g.lineWidth = 1; }
    if (x1 - x0 > 34) {
      g.fillStyle = r.foreground ? "#fff" : "#000";
      g.fillText((r.foreground ? "★ " : "") + `t${r.turn}`, x0 + 3, y + h / 2);
    }
  }

  // pauses: a red mark where the turn lost its slot, linked to where it resumed
  for (const p of m.pauses) {
    const until = p.resumed_t ?? p.ended_t ?? end;
    if (until < start && p.t < start) continue;
    if (p.shown_at === null) p.shown_at = drawnAt; // in view, so on the canvas (perhaps drawn by an earlier strip)
    if (Math.max(until, p.t) < tA || Math.min(until, p.t) > tB) continue;
    const px = x(p.t), py = laneY(p.slot) + 3;
    g.strokeStyle = "#d00"; g.setLineDash([4, 3]);
    g.beginPath(); g.moveTo(px, py);
    if (p.resumed_t !== null) {
      const qx = x(p.resumed_t), qy = laneY(p.resumed_slot) + 3;
      g.bezierCurveTo(px + (qx - px) / 2, py - 10, px + (qx - px) / 2, qy - 10, qx, qy);
      g.stroke(); g.setLineDash([]);
      triangle(g, qx, qy, "#2a2", true);
    } else {
      g.lineTo(x(until), py); g.stroke(); g.setLineDash([]);
    }
    triangle(g, px, py, "#d00", false);
  }

  // inheritance: a band on the lifted agent, naming who waits on it
  if (lifted.length) {
    const top = 20 + rows * LANE + 8;
    lifted.forEach((agent, i) => {
      g.fillStyle = "#444"; g.fillText(`${agent} lifted`, 6, top + i * BAND + BAND / 2);
    });
    for (const b of m.bands) {
      const bEnd = b.end ?? end;
      if (bEnd < start) continue;
      if (b.shown_at === null) b.shown_at = drawnAt;
      if (bEnd < tA || b.start > tB) continue;
      const i = lifted.indexOf(b.agent), y = top + i * BAND + 2;
      const x0 = Math.max(x(b.start), GUTTER), x1 = Math.max(x(bEnd), x0 + 2);
      g.fillStyle = "rgba(200, 60, 200, 0.25)"; g.fillRect(x0, y, x1 - x0, BAND - 4);
      g.strokeStyle = "#a3a"; g.strokeRect(x0, y, x1 - x0, BAND - 4);
      g.fillStyle = "#606";
      g.fillText(`p${b.priority}: ${b.by_agent} waits on it`, x0 + 3, y + (BAND - 4) / 2);
    }
  }

  // lost events: a red line where the stream had a gap
  for (const d of m.drops) {
    if (d.t < start || d.t < tA || d.t > tB) continue;
    g.strokeStyle = "#d00"; g.lineWidth = 2;
    g.beginPath(); g.moveTo(x(d.t), 14); g.lineTo(x(d.t), height); g.stroke(); g.lineWidth = 1;
  }
}

function triangle(g, x, y, colour, up) {
  g.fillStyle = colour; g.beginPath();
  if (up) { g.moveTo(x - 5, y + 6); g.lineTo(x + 5, y + 6); g.lineTo(x, y - 2); }
  else { g.moveTo(x - 5, y - 3); g.lineTo(x + 5, y - 3); g.lineTo(x, y + 5); }
  g.fill();
}

function niceStep(raw) {
  const p = Math.pow(10, Math.floor(Math.log10(Math.max(raw, 1e-3))));
  for (const k of [1, 2, 5, 10]) if (raw <= k * p) return k * p;
  return 10 * p;
}
