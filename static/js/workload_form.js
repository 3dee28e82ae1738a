// Submit form: show the GPU amount field that matches the kind of GPU request.
(function () {
  "use strict";
  var select = document.getElementById("id_gpu_request");
  if (!select) { return; }
  var gpus = document.getElementById("row-gpus");
  var memory = document.getElementById("row-gpu_memory_mib");
  function sync() {
    var byMemory = select.value === "memory";
    if (gpus) { gpus.hidden = byMemory; }
    if (memory) { memory.hidden = !byMemory; }
  }
  select.addEventListener("change", sync);
  sync();
})();
