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

// A refresh asked for just before someone began typing a reason can answer after: it is not
// swapped in then, so it cannot wipe the reason (the first beat after the reason is cleared
// brings the figures).
document.addEventListener("htmx:beforeSwap", function (event) {
  const target = event.detail.target;
  if (target && target.id === "run-live" && window.reasonBeingTyped()) {
    event.detail.shouldSwap = false;
  }
});

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

// The live parts refresh on the wall clock's beat — every REFRESH_MS, at :00, :05, :10 … —
// not on a timer counted from each page's load. Two pages open side by side (the overview
// and a run page, in two windows) then read the run at the same moment and show the same
// figures; with a timer per page one lagged the other by up to a whole refresh. The pages
// listen with hx-trigger="beat from:document". A hidden tab's throttled timer fires late:
// the next beat is taken from the clock again, and a beat is dispatched once.
const REFRESH_MS = 5000;
let lastBeat = null;
function nextBeat() {
  const now = Date.now();
  const slot = Math.floor(now / REFRESH_MS);
  if (lastBeat !== null && slot !== lastBeat) {
    document.dispatchEvent(new Event("beat"));
  }
  lastBeat = slot;
  window.setTimeout(nextBeat, (slot + 1) * REFRESH_MS - now);
}
nextBeat();

// "select all" on the dead-letter page: ticks (or clears) every letter box of its form.
document.addEventListener("change", function (event) {
  const all = event.target;
  if (!all.dataset || !all.dataset.tickAll) return;
  document
    .querySelectorAll('input[type=checkbox][form="' + all.dataset.tickAll + '"]')
    .forEach(function (box) {
      box.checked = all.checked;
    });
});

// The run page says when its figures are frozen: while a reason is being typed the live part
// does not refresh (reasonBeingTyped), and a marker says so until the reason is sent or
// cleared and the focus has left the controls.
function markRefreshPaused() {
  const marker = document.getElementById("refresh-paused");
  if (marker) marker.hidden = !window.reasonBeingTyped();
}
document.addEventListener("beat", markRefreshPaused);
["input", "focusin", "focusout"].forEach(function (name) {
  document.addEventListener(name, function () {
    window.setTimeout(markRefreshPaused, 0);
  });
});

// A refused form comes back with its error beside the field: the first field marked invalid
// takes the focus, which brings it (and its error) into view however long the page is.
document.addEventListener("DOMContentLoaded", function () {
  const field = document.querySelector('form [aria-invalid="true"]');
  if (field) field.focus();
});
