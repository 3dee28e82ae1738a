// Follow a workload's log: poll the fragment every 2 s while "Follow" is ticked and the
// workload runs; keep the view at the bottom if the reader was there.
(function () {
  const box = document.getElementById("log");
  const follow = document.querySelector("[data-follow]");
  if (!box || !follow) return;
  const atBottom = (pre) => !pre || pre.scrollHeight - pre.scrollTop - pre.clientHeight < 20;
  const bottom = () => window.innerHeight + window.scrollY >= document.body.scrollHeight - 20;
  function tick() {
    const state = box.querySelector("[data-following]");
    if (!follow.checked || (state && state.dataset.following !== "1")) return;
    const pre = box.querySelector("[data-log-text]");
    const stick = atBottom(pre) && bottom();
    fetch(box.dataset.src, { credentials: "same-origin", headers: { "X-Requested-With": "fetch" } })
      .then((r) => (r.ok ? r.text() : Promise.reject(r.status)))
      .then((html) => {
        box.innerHTML = html;
        if (stick) window.scrollTo(0, document.body.scrollHeight);
      })
      .catch(() => {});
  }
  setInterval(tick, 2000);
})();
