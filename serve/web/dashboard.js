// The live dashboard: reads /dashboard/events (server-sent events, one snapshot a second, see
// serve/page.cpp) while its tab is shown, keeps the last minutes in memory, and draws small
// canvas charts, the layer x expert heat map and the tables. Counters arrive cumulative; rates
// are differences between snapshots. The figures drawn are also left in data-* attributes (the
// browser test reads them).
"use strict";

const Dash = {
  windowS: 300,       // the charts' span
  recentTicks: 10,    // the heat map's "recent": the last 10 snapshots
  hist: [],           // per snapshot: {t, gen, prompt, hits, misses, read}
  cells: [],          // per snapshot: the per-expert counters (flat, layer-major)
  layerMisses: [],    // per snapshot: misses per layer
  last: null,         // the last snapshot
  abort: null,
  ticks: 0,

  start() {
    if (Dash.abort) return;
    Dash.abort = new AbortController();
    Dash.run(Dash.abort);
  },
  stop() { if (Dash.abort) { Dash.abort.abort(); Dash.abort = null; } },
  async run(ctl) {
    while (!ctl.signal.aborted) {
      try {
        const r = await App.fetch("/dashboard/events", { signal: ctl.signal });
        if (!r.ok) throw new Error(await App.message(r));
        App.error("");
        await App.readEvents(r, (d) => Dash.update(JSON.parse(d)));
      } catch (e) {
        if (ctl.signal.aborted) return;
        if (e.status === 401) { Dash.abort = null; return; }
        App.error("The dashboard's stream failed: " + e.message + " (retrying)");
      }
      await new Promise((ok) => setTimeout(ok, 2000));
    }
  },

  sum(a) { let s = 0; for (const x of a) s += x; return s; },
  update(j) {
    Dash.last = j;
    Dash.ticks++;
    const ex = j.experts, d = j.daemon;
    const h = { t: j.t_ms / 1000, gen: j.serve.generated_tokens, prompt: j.serve.prompt_tokens,
                hits: null, misses: null, read: null };
    let cells = [];
    let lm = null;
    if (ex) {
      h.hits = 0; h.misses = 0; lm = [];
      for (const L of ex.layers) {
        const hs = Dash.sum(L.hits), ms = Dash.sum(L.misses);
        h.hits += hs; h.misses += ms; lm.push(ms);
        for (let e = 0; e < L.hits.length; e++) cells.push(L.hits[e] + L.misses[e]);
      }
      h.read = ex.drive ? ex.drive.read_bytes : null;
    } else {
      for (const row of j.routes) for (const v of row) cells.push(v);
    }
    if (d) {
      if (h.hits === null) { h.hits = d.cache_hits; h.misses = d.cache_misses; }
      if (h.read === null) h.read = d.pack_read_bytes;
    }
    // The heat map's source changed (expertd came or went): its history starts again.
    const prev = Dash.cells[Dash.cells.length - 1];
    if (prev && prev.length !== cells.length) Dash.cells = Dash.cells.map(() => cells);
    Dash.hist.push(h);
    Dash.cells.push(cells);
    Dash.layerMisses.push(lm);
    while (Dash.hist.length && Dash.hist[0].t < h.t - Dash.windowS) {
      Dash.hist.shift(); Dash.cells.shift(); Dash.layerMisses.shift();
    }
    if (!document.getElementById("view-dash").hidden) Dash.draw();
  },

  // Rate series: (x[i] - x[i-1]) / dt for the field f; per-token ratios use g.
  series(f) {
    const out = [];
    for (let i = 1; i < Dash.hist.length; i++) {
      const a = Dash.hist[i - 1], b = Dash.hist[i];
      const v = f(a, b, b.t - a.t);
      out.push({ t: b.t, v });
    }
    return out;
  },
  hitRate(a, b) {
    if (a.hits === null || b.hits === null) return null;
    const dh = b.hits - a.hits, dm = b.misses - a.misses;
    return dh + dm > 0 ? dh / (dh + dm) : null;
  },

  draw() {
    const j = Dash.last;
    if (!j) return;
    const info = App.info || {};
    const ex = j.experts, d = j.daemon;
    const note = document.getElementById("dash-note");
    if (info.experts === "local") {
      note.hidden = false;
      note.textContent = "This server reads every expert in place from the GGUF (--local): residency, " +
        "the hit rate, the drive's reads and the engines need expertd (expert-serve --socket). " +
        "The heat map shows how often the routers chose each expert.";
    } else if (j.daemon_error) {
      note.hidden = false;
      note.textContent = "expertd cannot be read: " + j.daemon_error;
    } else if (j.experts_error) {
      note.hidden = false;
      note.textContent = "expertd's per-expert snapshot is missing (" + j.experts_error + "): the heat map " +
        "shows the routers' choices; residency, misses per layer and the what-if table need it.";
    } else note.hidden = true;

    const tok = Dash.series((a, b, dt) => dt > 0 ? (b.gen - a.gen) / dt : null);
    const hit = Dash.series(Dash.hitRate);
    const read = Dash.series((a, b, dt) => a.read !== null && dt > 0 ? (b.read - a.read) / dt / 1048576 : null);
    const lastv = (s) => { for (let i = s.length - 1; i >= Math.max(0, s.length - 3); i--) if (s[i].v !== null) return s[i].v; return null; };
    const tokNow = lastv(tok), hitNow = lastv(hit);
    Dash.big("tok-s", tokNow, tokNow === null ? "–" : tokNow.toFixed(1));
    Dash.big("hit-rate", hitNow, hitNow === null ? (h0() ? "idle" : "needs expertd") : (100 * hitNow).toFixed(1) + " %");
    function h0() { return Dash.hist.length && Dash.hist[Dash.hist.length - 1].hits !== null; }
    Dash.chart("chart-tok", tok, { color: "#4fa3ff", min: 0 });
    Dash.chart("chart-hit", hit, { color: "#3fb950", min: 0, max: 1 });
    const measured = ex && ex.drive ? ex.drive.read_mib_s_measured : null;
    Dash.chart("chart-read", read, { color: "#d29922", min: 0, ref: measured });

    // Bytes read per token over the recent window, against the drive.
    const H = Dash.hist, n = H.length, k = Math.max(0, n - 1 - Dash.recentTicks);
    let perTok = null, mibs = null;
    if (n > 1 && H[n - 1].read !== null && H[k].read !== null) {
      const dtok = (H[n - 1].gen + H[n - 1].prompt) - (H[k].gen + H[k].prompt);
      const dread = H[n - 1].read - H[k].read;
      if (dtok > 0) perTok = dread / dtok;
      if (H[n - 1].t > H[k].t) mibs = dread / (H[n - 1].t - H[k].t) / 1048576;
    }
    document.getElementById("bytes-tok").textContent =
      perTok === null ? (d ? "–" : "needs expertd") : Dash.bytes(perTok) + " / token";
    document.getElementById("drive-line").textContent = mibs === null ? "no reads measured" :
      "reading " + mibs.toFixed(1) + " MiB/s" + (measured ? " of the drive's measured " + measured.toFixed(0) + " MiB/s"
                                                           : " (the drive's bandwidth not measured yet)");
    const s = j.serve;
    document.getElementById("requests").textContent = String(s.requests);
    document.getElementById("requests-line").textContent = s.active_sequences + " running, " + s.queue_length +
      " waiting; prefix cache " + s.prefix_hits + " hits / " + s.prefix_misses + " misses, " +
      s.prefix_reused_tokens + " tokens reused" +
      (s.draft_tokens > 0 ? "; drafts " + s.draft_accepted_tokens + " kept of " + s.draft_tokens + " (" +
                            (100 * s.draft_accepted_tokens / s.draft_tokens).toFixed(0) + "%)" : "");
    Dash.heat();
    Dash.misses();
    Dash.tables();
  },
  big(id, v, text) {
    const el = document.getElementById(id);
    el.textContent = text;
    el.dataset.value = v === null ? "" : String(v);
  },
  // The charts' time span: what has been seen, from one minute up to windowS.
  span() {
    const H = Dash.hist;
    const seen = H.length > 1 ? H[H.length - 1].t - H[0].t : 0;
    return Math.max(60, Math.min(Dash.windowS, seen));
  },
  bytes(b) {
    if (b >= 1048576) return (b / 1048576).toFixed(1) + " MiB";
    if (b >= 1024) return (b / 1024).toFixed(1) + " KiB";
    return b.toFixed(0) + " B";
  },
  // A canvas sized to its box at the device's pixel ratio; its 2-D context in CSS pixels.
  fit(c, cssH) {
    const dpr = window.devicePixelRatio || 1, w = c.clientWidth;
    if (c.width !== Math.round(w * dpr) || c.height !== Math.round(cssH * dpr)) {
      c.width = Math.round(w * dpr);
      c.height = Math.round(cssH * dpr);
      c.style.height = cssH + "px";
    }
    const g = c.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, w, cssH);
    return { g, w, h: cssH };
  },
  chart(id, pts, o) {
    const { g, w, h } = Dash.fit(document.getElementById(id), 70);
    const now = Dash.hist.length ? Dash.hist[Dash.hist.length - 1].t : 0;
    let max = o.max;
    if (max === undefined) {
      max = o.ref || 0;
      for (const p of pts) if (p.v !== null && p.v > max) max = p.v;
      max = max > 0 ? max * 1.15 : 1;
    }
    const span = Dash.span();
    const x = (t) => w - (now - t) / span * w, y = (v) => h - 2 - (v - o.min) / (max - o.min) * (h - 14);
    g.strokeStyle = "#30363d"; g.lineWidth = 1;
    g.beginPath(); g.moveTo(0, h - 1.5); g.lineTo(w, h - 1.5); g.stroke();
    if (o.ref) {
      g.strokeStyle = "#f85149"; g.setLineDash([4, 3]);
      g.beginPath(); g.moveTo(0, y(o.ref)); g.lineTo(w, y(o.ref)); g.stroke(); g.setLineDash([]);
    }
    g.strokeStyle = o.color; g.lineWidth = 1.5; g.beginPath();
    let pen = false;
    for (const p of pts) {
      if (p.v === null) { pen = false; continue; }
      if (pen) g.lineTo(x(p.t), y(p.v)); else g.moveTo(x(p.t), y(p.v));
      pen = true;
    }
    g.stroke();
    g.fillStyle = "#8b949e"; g.font = "10px sans-serif";
    g.fillText(o.max === 1 ? "100 %" : max >= 100 ? String(Math.round(max)) : max.toPrecision(2), 2, 10);
    g.fillText(span >= 120 ? "-" + Math.round(span / 60) + " min" : "-" + Math.round(span) + " s", 2, h - 5);
  },
  // Layers down, experts across: the cell's hue is where the expert is (expertd's snapshot:
  // VRAM, host RAM, loading, absent), its brightness how often it was used recently.
  heat() {
    const c = document.getElementById("heat");
    const j = Dash.last, ex = j.experts;
    const L = ex ? ex.n_layer : j.routes.length, E = ex ? ex.n_expert : (j.routes[0] || []).length;
    if (!L || !E) return;
    const cur = Dash.cells[Dash.cells.length - 1];
    const old = Dash.cells[Math.max(0, Dash.cells.length - 1 - Dash.recentTicks)];
    const recent = cur.map((v, i) => v - (old[i] || 0));
    let max = 0, total = 0, rsum = 0;
    for (let i = 0; i < cur.length; i++) { if (recent[i] > max) max = recent[i]; total += cur[i]; rsum += recent[i]; }
    const cssW = c.clientWidth, cw = cssW / E, ch = Math.max(4, Math.min(18, Math.floor(400 / L)));
    const { g } = Dash.fit(c, ch * L);
    const hue = { V: 135, H: 210, L: 40 };
    for (let l = 0; l < L; l++) {
      const res = ex ? ex.layers[l].resident : null;
      for (let e = 0; e < E; e++) {
        const i = l * E + e, r = max > 0 ? recent[i] / max : 0;
        const state = res ? res[e] : "U";
        if (state === "." || (!res && r === 0)) g.fillStyle = r > 0 ? `hsl(0, 0%, ${20 + 50 * r}%)` : "#161b22";
        else if (state === "U") g.fillStyle = `hsl(25, 90%, ${18 + 50 * r}%)`;
        else g.fillStyle = `hsl(${hue[state] || 0}, 70%, ${22 + 45 * r}%)`;
        g.fillRect(e * cw, l * ch, Math.max(1, cw - (cw > 3 ? 1 : 0)), ch - 1);
      }
    }
    c.dataset.total = String(total);
    c.dataset.recent = String(rsum);
    c.dataset.ticks = String(Dash.ticks);
    c.dataset.layers = String(L);
    c.dataset.experts = String(E);
    c.onmousemove = (ev) => {
      const e = Math.floor(ev.offsetX / cw), l = Math.floor(ev.offsetY / ch);
      if (l < 0 || l >= L || e < 0 || e >= E) return;
      const res = ex ? ex.layers[l].resident[e] : null;
      c.title = "layer " + (ex ? ex.layers[l].model_layer : l) + ", expert " + e + ": " + recent[l * E + e] + " recent, " + cur[l * E + e] + " in all" +
        (res ? " (" + ({ V: "in VRAM", H: "in host RAM", L: "loading", ".": "not cached" }[res] || res) + ")" : "");
    };
    document.getElementById("heat-legend").textContent = (ex
      ? "Hue: where the expert is (green VRAM, blue host RAM, amber loading, grey not cached); " +
        "brightness: its acquires over the last " + Dash.recentTicks + " s. "
      : "Brightness: how often the routers chose the expert over the last " + Dash.recentTicks + " s " +
        "(residency needs expertd). ") + L + " layers (top to bottom) x " + E + " experts.";
  },
  misses() {
    const box = document.getElementById("misses");
    const cur = Dash.layerMisses[Dash.layerMisses.length - 1];
    const old = Dash.layerMisses[Math.max(0, Dash.layerMisses.length - 1 - Dash.recentTicks)];
    if (!cur) { box.textContent = "Needs expertd's per-expert snapshot."; return; }
    const rec = cur.map((v, i) => v - (old ? old[i] : 0));
    const max = Math.max(1, ...rec);
    box.replaceChildren();
    rec.forEach((v, l) => {
      const row = document.createElement("div");
      row.className = "bar";
      row.innerHTML = "<span></span><i></i><b></b>";
      row.children[0].textContent = "layer " + Dash.last.experts.layers[l].model_layer;
      row.children[1].style.width = (100 * v / max).toFixed(1) + "%";
      row.children[2].textContent = String(v);
      box.append(row);
    });
  },
  rows(id, head, rows) {
    const t = document.getElementById(id);
    t.replaceChildren();
    const tr = (cells, tag) => {
      const r = document.createElement("tr");
      for (const x of cells) { const c = document.createElement(tag); c.textContent = x; r.append(c); }
      t.append(r);
    };
    tr(head, "th");
    if (!rows.length) tr(["–"].concat(head.slice(1).map(() => "")), "td");
    for (const r of rows) tr(r, "td");
  },
  tables() {
    const j = Dash.last, s = j.serve, d = j.daemon || {}, ex = j.experts;
    const ms = (v) => (v * 1000).toFixed(v < 0.01 ? 2 : 1) + " ms";
    const lat = [["time to first token", ms(s.ttft_s.p50), ms(s.ttft_s.p90), ms(s.ttft_s.p99)],
                 ["time per token", ms(s.token_s.p50), ms(s.token_s.p90), ms(s.token_s.p99)]];
    for (const k of Object.keys(d))
      if (k.endsWith("_us_p50")) {
        const base = k.slice(0, -4);
        lat.push(["expertd " + base.replace(/_us$/, "").replace(/_/g, " "),
                  d[k] + " µs", d[base + "_p90"] + " µs", d[base + "_p99"] + " µs"]);
      }
    Dash.rows("latency", ["", "p50", "p90", "p99"], lat);
    if (ex) {
      Dash.rows("engines", ["name", "pid", "kind", "acquires", "up"],
                ex.engines.map((e) => [e.name, String(e.pid), e.kind, String(e.acquires), Math.round(e.connected_s) + " s"]));
      Dash.rows("whatif", ["cache", "slots", "hit rate"],
                ex.what_if.map((w) => [Math.round(w.cache_mib) + " MiB" + (w.slots === ex.slot_count ? " (now)" : ""),
                                       String(w.slots), w.hit_rate === null ? "–" : (100 * w.hit_rate).toFixed(1) + " %"]));
    } else {
      Dash.rows("engines", ["engine", ""], d.clients !== undefined ? [[d.clients + " connected", ""]] : [["needs expertd", ""]]);
      Dash.rows("whatif", ["cache", "hit rate"], [["needs expertd's snapshot", ""]]);
    }
  },
};

document.addEventListener("app-tab", (e) => {
  if (e.detail === "tab-dash") { Dash.start(); requestAnimationFrame(Dash.draw); } else Dash.stop();
});
document.addEventListener("app-info", () => {
  if (!document.getElementById("view-dash").hidden) Dash.start();
});
window.addEventListener("resize", () => { if (!document.getElementById("view-dash").hidden) Dash.draw(); });
