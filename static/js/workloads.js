// Workloads list: sortable headers (server-side sort through ?sort=) and readable durations.
(function () {
  "use strict";
  var table = document.getElementById("workloads");
  var form = document.getElementById("workload-filters");
  if (!table || !form) { return; }
  var current = table.dataset.sort || "";
  table.querySelectorAll("[data-sort-key]").forEach(function (link) {
    var key = link.dataset.sortKey;
    if (current.replace("-", "") === key) { link.textContent += current.charAt(0) === "-" ? " ▼" : " ▲"; }
    link.addEventListener("click", function (event) {
      event.preventDefault();
      form.elements.sort.value = current === key ? "-" + key : key;
      form.submit();
    });
  });
  function human(seconds) {
    if (seconds < 60) { return seconds + " s"; }
    if (seconds < 3600) { return Math.floor(seconds / 60) + " min"; }
    if (seconds < 86400) { return (seconds / 3600).toFixed(1) + " h"; }
    return (seconds / 86400).toFixed(1) + " d";
  }
  table.querySelectorAll("td[data-seconds]").forEach(function (cell) {
    if (cell.dataset.seconds !== "") { cell.textContent = human(parseInt(cell.dataset.seconds, 10)); }
  });
})();
