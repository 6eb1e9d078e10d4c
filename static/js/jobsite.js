// jobsite: small progressive enhancements; every page works without them.
(function () {
  "use strict";

  // <form data-confirm="Question?">: ask before submitting (e.g. cancelling a job).
  document.addEventListener("submit", function (event) {
    var form = event.target;
    var question = form.getAttribute && form.getAttribute("data-confirm");
    if (question && !window.confirm(question)) {
      event.preventDefault();
    }
  });
})();
