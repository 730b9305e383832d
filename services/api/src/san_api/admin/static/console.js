// Live updates: the server sends an event whenever jobs change (and every few seconds for
// broker-side numbers); every element marked hx-trigger="san:refresh from:body" reloads.
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
  document.addEventListener("DOMContentLoaded", connect);
  window.addEventListener("pagehide", disconnect);
  window.addEventListener("pageshow", function (event) { if (event.persisted) { connect(); } });
})();
