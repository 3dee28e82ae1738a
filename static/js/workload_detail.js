// Workload page: refresh its state, allocation and events every few seconds until it ends.
(function () {
  "use strict";
  var live = document.getElementById("workload-live");
  if (!live) { return; }
  var PERIOD_MS = 5000;
  function finished() {
    var marker = live.querySelector("[data-final]");
    return marker && marker.dataset.final === "1";
  }
  function refresh() {
    if (finished() || document.hidden) { return schedule(); }
    fetch(live.dataset.url, { credentials: "same-origin" })
      .then(function (response) { return response.ok ? response.text() : null; })
      .then(function (html) { if (html !== null) { live.innerHTML = html; } })
      .catch(function () { /* the next tick tries again */ })
      .then(schedule);
  }
  function schedule() { window.setTimeout(refresh, PERIOD_MS); }
  schedule();
})();
