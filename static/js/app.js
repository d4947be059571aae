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

// True while the page is in view. A hidden tab's timers are throttled by the browser (down
// to once a minute), so a page coming back into view refreshes its live parts at once
// rather than showing what it read one or more polls ago.
window.pageVisible = function () {
  return document.visibilityState === "visible";
};
