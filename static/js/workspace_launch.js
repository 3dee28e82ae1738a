// Launch form: an environment card fills in its default resources; a template hides them;
// the chosen project's policy shows next to the project.
(function () {
  var form = document.getElementById("launch-form");
  if (!form) return;
  function set(name, value) { if (form.elements[name]) form.elements[name].value = value; }
  form.querySelectorAll("input[name=environment]").forEach(function (radio) {
    radio.addEventListener("change", function () {
      set("gpus", radio.dataset.gpus);
      set("cpu", radio.dataset.cpu);
      set("memory_gib", radio.dataset.memoryGib);
    });
  });
  function showTemplate() {
    var usesTemplate = form.elements.template && form.elements.template.value !== "";
    document.getElementById("resources").hidden = usesTemplate;
  }
  function showPolicy() {
    var project = form.elements.project.value;
    form.querySelectorAll(".project-limit").forEach(function (el) {
      el.hidden = el.dataset.project !== project;
    });
  }
  if (form.elements.template) form.elements.template.addEventListener("change", showTemplate);
  form.elements.project.addEventListener("change", showPolicy);
  showTemplate();
  showPolicy();
})();
