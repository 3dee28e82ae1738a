// The overview refreshes my work and my projects (a server-rendered fragment) every few
// seconds, as the dashboard does, without reloading the page.
(function () {
  "use strict";
  var live = document.getElementById("home-live");
  if (!live) return;
  var every = parseInt(live.dataset.every, 10) || 5000;
  function tick() {
    fetch(live.dataset.src, { credentials: "same-origin", headers: { "X-Requested-With": "fetch" } })
      .then(function (r) { if (!r.ok) throw new Error(r.status); return r.text(); })
      .then(function (html) { live.innerHTML = html; live.classList.remove("stale"); })
      .catch(function () { live.classList.add("stale"); })
      .finally(function () { window.setTimeout(tick, every); });
  }
  window.setTimeout(tick, every);
})();
