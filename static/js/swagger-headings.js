// Swagger UI heads the page with an h1, each tag and the schemas with an h3 and an h4, and an
// open operation's sections with h4 and h5: announced as the page's second, third and fourth
// levels (aria-level), as the UI renders them.
const SWAGGER_LEVELS = [
  ["h3.opblock-tag, section.models > h4", "2"],
  [".opblock h4", "3"],
  [".opblock h5", "4"],
];
new MutationObserver(function () {
  SWAGGER_LEVELS.forEach(function ([selector, level]) {
    document.querySelectorAll(selector).forEach(function (heading) {
      if (heading.getAttribute("aria-level") !== level) heading.setAttribute("aria-level", level);
    });
  });
}).observe(document.getElementById("swagger-ui"), { childList: true, subtree: true });
