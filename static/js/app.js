// Conditions for the pages' hx-trigger filters. htmx compiles a filter by prefixing each
// name with "event." (an arrow function's parameter included), so a filter only calls a
// function named here.

// True while someone is writing a reason in the run page's controls: a reason is typed, or
// focus is in a control. The live part's refresh (which holds the controls) waits for it.
window.reasonBeingTyped = function () {
  const controls = document.getElementById("run-controls");
  if (!controls) return false;
  if (controls.contains(document.activeElement)) return true;
  return Array.from(controls.querySelectorAll("input[name=reason]")).some(function (field) {
    return field.value !== "";
  });
};

// A destructive action asks first, saying what it will do: the form (or the button that
// submits it) carries the question in data-confirm. Declining sends nothing.
document.addEventListener("submit", function (event) {
  const question =
    (event.submitter && event.submitter.dataset.confirm) || event.target.dataset.confirm;
  if (question && !window.confirm(question)) {
    event.preventDefault();
  }
});
