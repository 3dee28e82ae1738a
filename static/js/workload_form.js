// Submit form: show the GPU amount fields that match the kind of GPU request.
(function () {
  "use strict";
  var select = document.getElementById("id_gpu_request");
  if (!select) { return; }
  var gpus = document.getElementById("row-gpus");
  var memory = document.getElementById("row-gpu_memory_mib");
  var mig = document.getElementById("row-mig_profile");
  function sync() {
    var byMemory = select.value === "memory";
    var byMig = select.value === "mig";
    if (gpus) { gpus.hidden = byMemory || byMig; }
    // A MIG request names a profile, or GPU memory for the smallest profile holding it.
    if (memory) { memory.hidden = !(byMemory || byMig); }
    if (mig) { mig.hidden = !byMig; }
  }
  select.addEventListener("change", sync);
  sync();
})();
