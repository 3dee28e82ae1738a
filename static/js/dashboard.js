// The overview refreshes itself: the live numbers (a server-rendered fragment) every few
// seconds, the chart (a figure as JSON) every minute, without reloading the page.
(function () {
  "use strict";
  function poll(el, apply) {
    var every = parseInt(el.dataset.every, 10) || 5000;
    function tick() {
      fetch(el.dataset.src, { credentials: "same-origin", headers: { "X-Requested-With": "fetch" } })
        .then(function (r) { if (!r.ok) throw new Error(r.status); return r; })
        .then(apply)
        .catch(function () { el.classList.add("stale"); })
        .finally(function () { window.setTimeout(tick, every); });
    }
    window.setTimeout(tick, every);
  }
  document.addEventListener("DOMContentLoaded", function () {
    var now = document.getElementById("dashboard-now");
    if (now) poll(now, function (r) {
      return r.text().then(function (html) { now.innerHTML = html; now.classList.remove("stale"); });
    });
    var chart = document.getElementById("dashboard-chart");
    if (chart) poll(chart, function (r) {
      return r.json().then(function (figure) {
        window.GPUPoolCharts.draw(chart.querySelector("[data-figure]"), figure);
      });
    });
  });
})();
