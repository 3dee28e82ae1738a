// Draws every server-built plotly figure on the page: <div data-figure="ID"> next to the
// json_script element with that id. Used by the dashboard, heat map, reports and the chart
// partials that project, department and workload pages include.
(function () {
  "use strict";
  // Plotly does not wrap a title: on a narrow chart (a phone) a long one ran past both
  // edges. Break it at its spaces into lines of about as many characters as fit (8 px
  // each at the 14 px title font), and make room above the plot for the extra lines.
  function fitTitle(layout, width) {
    var title = layout && layout.title;
    var text = title && (typeof title === "string" ? title : title.text);
    var perLine = Math.max(16, Math.floor(width / 8));
    if (!text || !width || text.length <= perLine || text.indexOf("<br>") >= 0) return layout;
    var lines = [];
    text.split(" ").forEach(function (word) {
      var last = lines.length ? lines[lines.length - 1] : null;
      if (last !== null && (last + " " + word).length <= perLine) lines[lines.length - 1] += " " + word;
      else lines.push(word);
    });
    var fitted = Object.assign({}, layout);
    fitted.title = Object.assign({}, typeof title === "string" ? {} : title, { text: lines.join("<br>") });
    fitted.margin = Object.assign({}, layout.margin);
    fitted.margin.t = (fitted.margin.t || 40) + 18 * (lines.length - 1);
    return fitted;
  }
  function draw(el, figure) {
    var layout = fitTitle(figure.layout, el.clientWidth);
    window.Plotly.react(el, figure.data, layout, figure.config || {});
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
