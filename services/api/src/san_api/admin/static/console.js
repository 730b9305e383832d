// Live updates: the server sends an event whenever jobs change (and every few seconds for
// broker-side numbers); every element marked hx-trigger="san:refresh from:body" reloads.
(function () {
  "use strict";
  var source = null;
  function connect() {
    source = new EventSource("/admin/events");
    source.onmessage = function () {
      if (window.htmx) { window.htmx.trigger(document.body, "san:refresh"); }
    };
    source.onerror = function () {
      document.body.classList.add("offline");
    };
    source.onopen = function () {
      document.body.classList.remove("offline");
    };
  }
  document.addEventListener("DOMContentLoaded", connect);
})();
