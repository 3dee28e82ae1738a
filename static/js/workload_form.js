// Submit form: show the GPU amount field that matches the kind of GPU request, and a sweep's
// trials for random search only; show the
// chosen project's policy limits; an environment fills in its image; the simulated
// duration shows only while the chosen node pools include a simulated one.
(function () {
  "use strict";
  var form = document.getElementById("workload-form");
  if (!form) { return; }
  function data(id) {
    var el = document.getElementById(id);
    return el ? JSON.parse(el.textContent) : null;
  }
  function row(name) { return document.getElementById("row-" + name); }

  var select = document.getElementById("id_gpu_request");
  function syncGpus() {
    var byMemory = select.value === "memory";
    var byMig = select.value === "mig";
    if (row("gpus")) { row("gpus").hidden = byMemory || byMig; }
    // A MIG request names a profile, or GPU memory for the smallest profile holding it.
    if (row("gpu_memory_mib")) { row("gpu_memory_mib").hidden = !(byMemory || byMig); }
    if (row("mig_profile")) { row("mig_profile").hidden = !byMig; }
  }
  if (select) { select.addEventListener("change", syncGpus); syncGpus(); }

  // A sweep's number of trials applies to random search only (a grid tries every point).
  var method = document.getElementById("id_search_method");
  function syncTrials() { if (row("trials")) { row("trials").hidden = method.value !== "random"; } }
  if (method) { method.addEventListener("change", syncTrials); syncTrials(); }

  var project = document.getElementById("id_project");
  function syncLimits() {
    form.querySelectorAll(".limit[data-project]").forEach(function (el) {
      el.hidden = el.dataset.project !== project.value;
    });
  }
  if (project) { project.addEventListener("change", syncLimits); syncLimits(); }

  var environment = document.getElementById("id_environment");
  var images = data("environment-images") || {};
  if (environment) {
    environment.addEventListener("change", function () {
      if (images[environment.value]) { document.getElementById("id_image").value = images[environment.value]; }
    });
  }

  var simulated = data("simulated-pools") || [];
  var real = data("real-pools") || [];
  function syncDuration() {
    var duration = row("duration_s");
    if (!duration) { return; }
    var ticked = Array.prototype.map.call(
      form.querySelectorAll("input[name=node_pools]:checked"), function (box) { return box.value; });
    // Any pool may be chosen when none is ticked: the duration applies if a simulated one exists.
    var pools = ticked.length ? ticked : simulated.concat(real);
    duration.hidden = !pools.some(function (p) { return simulated.indexOf(p) >= 0; });
  }
  form.querySelectorAll("input[name=node_pools]").forEach(function (box) {
    box.addEventListener("change", syncDuration);
  });
  syncDuration();
})();
