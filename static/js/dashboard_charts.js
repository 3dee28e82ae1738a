// Draws every server-built plotly figure on the page: <div data-figure="ID"> next to the
// json_script element with that id. Used by the dashboard, heat map, reports and the chart
// partials that project, department and workload pages include.
(function () {
  "use strict";
  function draw(el, figure) {
    window.Plotly.react(el, figure.data, figure.layout, figure.config || {});
  }
  function drawAll(root) {
    (root || document).querySelectorAll("[data-figure]").forEach(function (el) {
      var source = document.getElementById(el.dataset.figure);
      if (source) draw(el, JSON.parse(source.textContent));
    });
  }
  window.GPUPoolCharts = { draw: draw, drawAll: drawAll };
  document.addEventListener("DOMContentLoaded", function () { drawAll(document); });
})();
