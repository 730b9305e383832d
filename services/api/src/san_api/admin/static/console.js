// Live updates: the server sends an event whenever jobs change (and every few seconds for
// broker-side numbers); every element marked hx-trigger="san:refresh from:body" reloads.
// Times arrive as <time datetime="…UTC…"> and are shown in the browser's own zone; the
// per-minute chart polls the admin API and is drawn here (no library, no CDN).
(function () {
  "use strict";
  var source = null;
  function connect() {
    if (source) { return; }
    source = new EventSource("/admin/events");
    source.onmessage = function () {
      if (window.htmx) { window.htmx.trigger(document.body, "san:refresh"); }
    };
    source.onerror = function () { document.body.classList.add("offline"); };
    source.onopen = function () { document.body.classList.remove("offline"); };
  }
  function disconnect() {
    // A page left open in the back/forward cache would otherwise keep its stream, and the
    // browser's few connections per host, busy.
    if (source) { source.close(); source = null; }
  }

  // -- local time ------------------------------------------------------------------------
  var zone = Intl.DateTimeFormat().resolvedOptions().timeZone;
  var stamp = new Intl.DateTimeFormat(undefined, {
    year: "numeric", month: "2-digit", day: "2-digit",
    hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false, timeZoneName: "short"
  });
  var clock = new Intl.DateTimeFormat(undefined, { hour: "2-digit", minute: "2-digit", hour12: false });
  function localTimes(root) {
    var found = (root || document).querySelectorAll("time[datetime]:not([data-local])");
    for (var i = 0; i < found.length; i++) {
      var at = new Date(found[i].getAttribute("datetime"));
      if (isNaN(at.getTime())) { continue; }
      found[i].title = found[i].textContent + " (" + zone + ")";
      found[i].textContent = stamp.format(at);
      found[i].setAttribute("data-local", zone);
    }
  }

  // -- the per-minute chart ----------------------------------------------------------------
  var SVG = "http://www.w3.org/2000/svg";
  var MINUTES = 60;
  var lastCells = null;
  var polling = null;
  function svgEl(name, attrs, text) {
    var node = document.createElementNS(SVG, name);
    for (var key in attrs) { node.setAttribute(key, attrs[key]); }
    if (text) { node.textContent = text; }
    return node;
  }
  function draw(cells) {
    var box = document.getElementById("minute-chart");
    if (!box || !cells) { return; }
    var svg = box.querySelector("svg");
    var now = Math.floor(Date.now() / 60000);
    var slots = {};
    for (var m = now - MINUTES + 1; m <= now; m++) { slots[m] = { ok: 0, bad: 0 }; }
    cells.forEach(function (cell) {
      var slot = slots[Math.floor(new Date(cell.at).getTime() / 60000)];
      if (!slot) { return; }
      if (cell.status === "COMPLETED") { slot.ok += cell.count; }
      if (cell.status === "FAILED") { slot.bad += cell.count; }
    });
    var peak = 1;
    for (var key in slots) { peak = Math.max(peak, slots[key].ok + slots[key].bad); }
    while (svg.firstChild) { svg.removeChild(svg.firstChild); }
    var width = 720 / MINUTES, base = 130, total = 0, ticks = [];
    Object.keys(slots).sort().forEach(function (key, i) {
      var slot = slots[key], at = new Date(key * 60000);
      var okH = 120 * slot.ok / peak, badH = 120 * slot.bad / peak;
      var label = clock.format(at) + ": " + slot.ok + " completed, " + slot.bad + " failed";
      var bar = svgEl("g", { "class": "minute", "data-minute": at.toISOString(),
                             "data-completed": slot.ok, "data-failed": slot.bad });
      bar.appendChild(svgEl("rect", { x: i * width + 1, y: base - okH, width: width - 2,
                                      height: okH, fill: "#15803d" }));
      bar.appendChild(svgEl("rect", { x: i * width + 1, y: base - okH - badH, width: width - 2,
                                      height: badH, fill: "#b91c1c" }));
      bar.appendChild(svgEl("title", {}, label));
      svg.appendChild(bar);
      if (i % 15 === 0 || i === MINUTES - 1) { ticks.push(clock.format(at)); }
      total += slot.ok + slot.bad;
    });
    svg.appendChild(svgEl("line", { x1: 0, y1: base + 0.5, x2: 720, y2: base + 0.5, stroke: "#94a3b8" }));
    // The axis is HTML below the drawing: the SVG is stretched to the page's width, which
    // would stretch its text too.
    var axis = box.querySelector(".axis");
    axis.textContent = "";
    ticks.forEach(function (tick) {
      var label = document.createElement("span");
      label.textContent = tick;
      axis.appendChild(label);
    });
    box.setAttribute("data-total", total);
    document.getElementById("minute-chart-peak").textContent = "peak " + peak + " / min";
    document.getElementById("minute-chart-updated").textContent =
      "updated " + clock.format(new Date()) + " (" + zone + ")";
  }
  function poll() {
    var box = document.getElementById("minute-chart");
    if (!box) { return; }
    fetch(box.getAttribute("data-source"), { credentials: "same-origin", cache: "no-store" })
      .then(function (response) {
        if (!response.ok) { throw new Error("HTTP " + response.status); }
        return response.json();
      })
      .then(function (stats) { lastCells = stats.buckets; draw(lastCells); box.classList.remove("stale"); })
      .catch(function () { box.classList.add("stale"); });
  }
  function startChart() {
    var box = document.getElementById("minute-chart");
    if (!box || polling) { return; }
    poll();
    polling = window.setInterval(poll, 1000 * Number(box.getAttribute("data-every") || 5));
  }
  function stopChart() {
    if (polling) { window.clearInterval(polling); polling = null; }
  }

  document.addEventListener("DOMContentLoaded", function () {
    connect();
    localTimes(document);
    startChart();
  });
  // htmx replaced part of the page: its times are UTC again, and the chart is empty
  document.addEventListener("htmx:afterSettle", function () {
    localTimes(document);
    draw(lastCells);
  });
  window.addEventListener("pagehide", function () { disconnect(); stopChart(); });
  window.addEventListener("pageshow", function (event) {
    if (event.persisted) { connect(); startChart(); }
  });
})();
