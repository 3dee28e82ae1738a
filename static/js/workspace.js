// Workspace page: refresh the status fragment every few seconds until the workspace ends.
(function () {
  var box = document.getElementById("workspace-status");
  if (!box) return;
  var finished = ["succeeded", "failed", "stopped"];
  function refresh() {
    fetch(box.dataset.url, { credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
      .then(function (html) {
        box.innerHTML = html;
        var state = document.getElementById("workspace-state");
        var now = state && state.className.split("state-")[1];
        var done = now && finished.indexOf(now) >= 0;
        if (now && now !== "pending" && now !== "admitted") {
          // The "is queued." banner of the launch is no longer true: it goes.
          document.querySelectorAll(".messages .msg-queued").forEach(function (li) { li.remove(); });
        }
        if (!done) setTimeout(refresh, 3000);
      })
      .catch(function () { setTimeout(refresh, 10000); });
  }
  setTimeout(refresh, 3000);
})();
