// traceap report: draws the window-score timelines (the paper's Figure 7, interactive) from the
// JSON embedded in the page.  Trace-derived strings only ever go through textContent.
(function () {
  "use strict";
  const DATA = JSON.parse(document.getElementById("traceap-data").textContent);
  const SVG = "http://www.w3.org/2000/svg";
  const GREY = "#b9c3ce";
  const M = { left: 44, right: 12, steps: 18, plot: 150, lane: 12, axis: 24 };

  function el(tag, attrs, parent) {
    const e = document.createElementNS(SVG, tag);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }
  function h(tag, text, cls, parent) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = text;
    if (cls) e.className = cls;
    if (parent) parent.appendChild(e);
    return e;
  }
  function color(p) { return (p && DATA.colors[p]) || "#7b3294"; }
  function title(p) { return (p && DATA.titles[p]) || p || "unclassified"; }
  // The same formatting as traceap.units.fmt_us (terminal, JSON readers, this page).
  function fmtUs(us) {
    if (us === null || us === undefined || !isFinite(us)) return "-";
    const a = Math.abs(us);
    if (a >= 1e6) return (us / 1e6).toFixed(2) + " s";
    if (a >= 1e3) return (us / 1e3).toFixed(1) + " ms";
    return us.toFixed(0) + " us";
  }
  const CAUSE = { warmup: "warm-up", communication: "communication", compile_gaps: "compile gaps",
                  host_copy_sync: "copies/syncs", data_loading: "data loading",
                  launch_bound: "launch-bound host", not_explained: "not explained" };
  function fmtMs(ms) { return fmtUs(ms * 1e3); }
  function niceStep(range, n) {
    const raw = range / n, p = Math.pow(10, Math.floor(Math.log10(raw)));
    const m = raw / p;
    return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
  }

  function table(parent, rows) {
    const t = h("table", null, null, parent);
    for (const r of rows) {
      const tr = h("tr", null, null, t);
      const td = h("td", null, null, tr);
      const c = h("code", r[0], null, td);
      c.title = r[0];
      for (let i = 1; i < r.length; i++) h("td", r[i], "n", tr);
    }
  }

  function fillTip(tip, R, i) {
    tip.textContent = "";
    const w0 = i * R.width_ms, flagged = R.flagged[i];
    h("div", "Window " + i + "  \u00b7  " + fmtMs(w0) + " \u2013 " + fmtMs(w0 + R.width_ms), "h", tip);
    let line = "score " + R.score[i].toFixed(2);
    if (flagged) {
      line += "  \u00b7  flagged: " + title(R.pattern[i]);
      if (R.conf[i] !== null) line += " (" + Math.round(R.conf[i] * 100) + "%)";
    }
    const d = h("div", line, null, tip);
    if (flagged) d.style.color = color(R.pattern[i]);
    const g = R.digests && R.digests[i];
    if (!g) return;
    h("div", "GPU busy " + Math.round(g.busy * 100) + "%  \u00b7  " + g.nk + " kernels" +
      (g.mc ? "  \u00b7  " + g.mc[0] + " memcpy (" + g.mc[1].toFixed(1) + " MB)" : "") +
      (g.nc ? "  \u00b7  " + g.nc + " NCCL" : ""), null, tip);
    if (g.ic && g.ic.length) {
      h("div", "GPU idle here", "sec", tip);
      table(tip, g.ic.map(c => [CAUSE[c[0]] || c[0], fmtUs(c[1])]));
    }
    if (g.k.length) {
      h("div", "Top kernels", "sec", tip);
      table(tip, g.k.map(k => [k[0], k[1] + "\u00d7", fmtUs(k[2])]));
    }
    if (g.o.length) {
      h("div", "Top CPU ops", "sec", tip);
      table(tip, g.o.map(o => [o[0], o[1] + "\u00d7", fmtUs(o[2])]));
    }
    if (g.ld) {
      h("div", "Launch delay (CPU launch \u2192 GPU start)", "sec", tip);
      table(tip, [["median", fmtUs(g.ld[0])], ["max: " + g.ld[2], fmtUs(g.ld[1])]]);
    }
  }

  function jumpToFinding(R, i) {
    const f = R.finding_of[i];
    if (f === null || f < 0) return;
    const card = document.getElementById(R.id + "-f" + f);
    if (!card) return;
    card.scrollIntoView({ behavior: "smooth", block: "start" });
    card.classList.remove("flash");
    void card.offsetWidth;
    card.classList.add("flash");
  }

  function drawTimeline(box, R) {
    const W = Math.max(box.clientWidth, 600);
    box.textContent = "";
    const plotW = W - M.left - M.right;
    const top = M.steps, base = top + M.plot, laneY = base + 4;
    const H = laneY + M.lane + M.axis;
    const svg = el("svg", { width: W, height: H, class: "tl-svg", role: "img" }, box);
    el("title", {}, svg).textContent = "Window scores over the trace";
    const bw = plotW / R.n;
    const x = i => M.left + i * bw;
    const y = v => base - v * M.plot;
    const msx = ms => M.left + (ms / R.span_ms) * plotW;

    // Profiler steps: alternating bands with their numbers.
    R.steps.forEach((s, k) => {
      const x0 = msx(Math.max(s[0], 0)), x1 = msx(Math.min(s[1], R.span_ms));
      if (x1 <= x0) return;
      el("rect", { x: x0, y: 0, width: x1 - x0, height: M.steps - 3,
                   fill: k % 2 ? "#dfe7f0" : "#eef2f7" }, svg);
      el("line", { x1: x0, x2: x0, y1: 0, y2: base, stroke: "#c5d0dc", "stroke-dasharray": "2,3" }, svg);
      if (x1 - x0 > 34) {
        const t = el("text", { x: x0 + 4, y: 11, "font-size": 10, fill: "#5b6877" }, svg);
        t.textContent = "step " + s[2];
      }
    });
    // Score grid.
    for (const v of [0, 0.5, 1]) {
      el("line", { x1: M.left, x2: W - M.right, y1: y(v), y2: y(v), stroke: "#e6ebf0" }, svg);
      const t = el("text", { x: M.left - 6, y: y(v) + 4, "font-size": 10, "text-anchor": "end",
                             fill: "#5b6877" }, svg);
      t.textContent = v.toFixed(1);
    }
    const yl = el("text", { x: 10, y: top + M.plot / 2, "font-size": 10, fill: "#5b6877",
                            transform: "rotate(-90 10 " + (top + M.plot / 2) + ")",
                            "text-anchor": "middle" }, svg);
    yl.textContent = "score";
    if (R.threshold !== null) {
      el("line", { x1: M.left, x2: W - M.right, y1: y(R.threshold), y2: y(R.threshold),
                   stroke: "#b3261e", "stroke-dasharray": "5,4", "stroke-width": 1 }, svg);
    }
    // Bars: the window scores; flagged windows in their pattern's colour, and a lane below.
    const gap = bw > 5 ? 1 : 0;
    for (let i = 0; i < R.n; i++) {
      const f = R.flagged[i], c = f ? color(R.pattern[i]) : GREY;
      el("rect", { x: x(i) + gap / 2, y: y(R.score[i]), width: Math.max(bw - gap, 0.5),
                   height: Math.max(R.score[i] * M.plot, 0.5), fill: c, class: "wbar" }, svg);
      if (f) el("rect", { x: x(i), y: laneY, width: bw, height: M.lane, fill: c }, svg);
    }
    el("rect", { x: M.left, y: laneY, width: plotW, height: M.lane, fill: "none",
                 stroke: "#d3dae2" }, svg);
    // Optional lines: GPU busy and each pattern's own score.
    const lines = {};
    function poly(vals, stroke, dash, width) {
      const pts = vals.map((v, i) => (x(i) + bw / 2).toFixed(1) + "," + y(v).toFixed(1)).join(" ");
      return el("polyline", { points: pts, fill: "none", stroke: stroke, "stroke-width": width,
                              "stroke-dasharray": dash, "pointer-events": "none" }, svg);
    }
    if (R.busy) lines.busy = poly(R.busy, "#1d2733", "3,2", 1.2);
    for (const p in R.pscores) lines[p] = poly(R.pscores[p], color(p), "", 1.5);
    // Time axis (ms from the trace start).
    const step = niceStep(R.span_ms, Math.max(2, Math.floor(plotW / 90)));
    for (let t = 0; t <= R.span_ms + 1e-9; t += step) {
      const xx = msx(t);
      el("line", { x1: xx, x2: xx, y1: laneY + M.lane, y2: laneY + M.lane + 4, stroke: "#8895a3" }, svg);
      const tt = el("text", { x: xx, y: H - 6, "font-size": 10, "text-anchor": "middle",
                              fill: "#5b6877" }, svg);
      tt.textContent = fmtMs(t);
    }
    // Hover targets: one per window, full height.
    const hi = el("rect", { x: 0, y: top, width: bw, height: M.plot + 4 + M.lane, fill: "#2f6fb2",
                            opacity: 0, "pointer-events": "none" }, svg);
    const tip = h("div", null, "tip", box);
    for (let i = 0; i < R.n; i++) {
      const m = el("rect", { x: x(i), y: top, width: bw, height: M.plot + 4 + M.lane,
                             class: "wmark" + (R.flagged[i] ? " flag" : ""), "data-w": i }, svg);
      m.addEventListener("mouseenter", () => {
        hi.setAttribute("x", x(i)); hi.setAttribute("opacity", 0.12);
        fillTip(tip, R, i);
        tip.style.display = "block";
        const left = x(i) + bw + 12 + 420 > W ? x(i) - 432 : x(i) + bw + 12;
        tip.style.left = Math.max(0, left) + "px";
        tip.style.top = (top + 4) + "px";
      });
      m.addEventListener("mouseleave", () => { hi.setAttribute("opacity", 0); tip.style.display = "none"; });
      m.addEventListener("click", () => jumpToFinding(R, i));
    }
    box.dataset.drawn = String(R.n);
    box._geometry = { svg: svg, x: x, bw: bw, top: top, height: M.plot + 4 + M.lane };
    if (box._selected) select(box, box._selected);
    return lines;
  }

  // Outline some windows (a finding's) on a drawn timeline.
  function select(box, windows) {
    box._selected = windows;
    const g = box._geometry;
    if (!g) return;
    g.svg.querySelectorAll(".sel").forEach(e => e.remove());
    for (const i of windows) {
      el("rect", { x: g.x(i), y: g.top, width: g.bw, height: g.height, class: "sel" }, g.svg);
    }
  }

  function legend(box, R, lines, state) {
    const lg = box.nextElementSibling;
    if (!lg || !lg.classList.contains("legend")) return;
    lg.textContent = "";
    const seen = [];
    R.pattern.forEach((p, i) => { if (R.flagged[i] && seen.indexOf(p) < 0) seen.push(p); });
    for (const p of seen) {
      const s = h("span", null, null, lg);
      h("span", null, "swatch", s).style.background = color(p);
      s.appendChild(document.createTextNode(title(p)));
    }
    const n = h("span", null, null, lg);
    h("span", null, "swatch", n).style.background = GREY;
    n.appendChild(document.createTextNode("not flagged"));
    for (const key in lines) {
      const lab = h("label", null, null, lg);
      const cb = h("input", null, null, lab);
      cb.type = "checkbox";
      cb.checked = !!state[key];
      lines[key].style.display = cb.checked ? "" : "none";
      cb.addEventListener("change", () => {
        state[key] = cb.checked;
        lines[key].style.display = cb.checked ? "" : "none";
      });
      lab.appendChild(document.createTextNode(key === "busy" ? " GPU busy" : " " + title(key) + " score"));
    }
  }

  function drawStrip(box, R) {
    const W = Math.max(box.clientWidth, 300), H = 18;
    box.textContent = "";
    const svg = el("svg", { width: W, height: H }, box);
    const bw = W / R.n;
    for (let i = 0; i < R.n; i++) {
      const s = R.score[i];
      const fill = R.flagged[i] ? color(R.pattern[i])
        : "rgb(" + Math.round(235 - 110 * s) + "," + Math.round(239 - 100 * s) + "," + Math.round(244 - 80 * s) + ")";
      const r = el("rect", { x: i * bw, y: 0, width: bw + 0.3, height: H, fill: fill, class: "rcell" }, svg);
      el("title", {}, r).textContent = "window " + i + ": score " + s.toFixed(2) +
        (R.flagged[i] ? " \u00b7 " + title(R.pattern[i]) : "");
    }
  }

  const states = {};
  function drawAll() {
    document.querySelectorAll(".timeline").forEach(box => {
      const k = +box.dataset.rank, R = DATA.ranks[k];
      if (box.offsetParent === null) return;  // hidden tab: drawn when shown
      states[k] = states[k] || { busy: true };
      legend(box, R, drawTimeline(box, R), states[k]);
    });
    document.querySelectorAll(".rankstrip").forEach(box => drawStrip(box, DATA.ranks[+box.dataset.rank]));
  }

  function showRank(k) {
    document.querySelectorAll(".rank-section").forEach(s => { s.hidden = +s.dataset.rank !== k; });
    document.querySelectorAll(".tabs button").forEach(b => b.classList.toggle("on", +b.dataset.rank === k));
    drawAll();
  }
  document.querySelectorAll(".tabs button").forEach(b => b.addEventListener("click", () => showRank(+b.dataset.rank)));
  document.querySelectorAll(".rankrow").forEach(r => r.addEventListener("click", () => {
    showRank(+r.dataset.rank);
    const s = document.querySelector(".rank-section[data-rank='" + r.dataset.rank + "']");
    if (s) s.scrollIntoView({ behavior: "smooth" });
  }));
  // A part of the idle bar: open its finding (the card flashes like a timeline click).
  document.querySelectorAll("a.idle-part.link").forEach(a => a.addEventListener("click", ev => {
    const card = document.getElementById(a.getAttribute("href").slice(1));
    if (!card) return;
    ev.preventDefault();
    card.scrollIntoView({ behavior: "smooth", block: "start" });
    card.classList.remove("flash");
    void card.offsetWidth;
    card.classList.add("flash");
  }));
  document.querySelectorAll("button.show").forEach(b => b.addEventListener("click", () => {
    const k = +b.dataset.rank;
    if (document.querySelector(".tabs")) showRank(k);
    const box = document.getElementById("timeline-" + k);
    select(box, JSON.parse(b.dataset.windows));
    box.scrollIntoView({ behavior: "smooth", block: "center" });
  }));
  // A copy button on each code snippet of a fix.
  document.querySelectorAll(".fix pre").forEach(pre => {
    const b = h("button", "copy", "copy");
    b.type = "button";
    b.addEventListener("click", () => {
      const text = pre.querySelector("code").textContent;
      const done = () => { b.textContent = "copied"; setTimeout(() => { b.textContent = "copy"; }, 1200); };
      if (navigator.clipboard && window.isSecureContext) {
        navigator.clipboard.writeText(text).then(done, () => {});
      } else {
        const r = document.createRange();
        r.selectNodeContents(pre.querySelector("code"));
        const sel = window.getSelection();
        sel.removeAllRanges(); sel.addRange(r);
        done();
      }
    });
    pre.insertBefore(b, pre.firstChild);
  });
  if (document.querySelector(".tabs")) showRank(0); else drawAll();
  let pending = null;
  window.addEventListener("resize", () => { clearTimeout(pending); pending = setTimeout(drawAll, 120); });
})();
