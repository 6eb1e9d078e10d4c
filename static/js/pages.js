// jobsite: small progressive enhancements; every page works without them.
//
// Live pages use htmx's WebSocket extension (hx-ext="ws" ws-connect="…", shipped by django-htmx): the server sends
// fragments drawn from the pages' own templates as out-of-band swaps (jobs/consumers.py) and the extension swaps
// them in and reconnects. What is left here is specific to this app: durations that tick, the live badge in the
// top bar, telling the server where the page is when its socket (re)opens, selecting rows, and confirmations.
(function () {
  "use strict";

  var live = (window.jobsite = window.jobsite || {});
  live.received = live.received || 0;
  live.opened = live.opened || 0;
  live.closed = live.closed || 0;

  // <form data-confirm="Question?">: ask before submitting (e.g. cancelling a job).
  document.addEventListener("submit", function (event) {
    var form = event.target;
    var question = form.getAttribute && form.getAttribute("data-confirm");
    if (question && !window.confirm(question)) {
      event.preventDefault();
    }
  });

  // --- durations (as jobs/rules.py::fmt_duration, which the templates' |seconds filter uses) --------------

  function time(iso) {
    var t = iso ? Date.parse(iso) : NaN;
    return isNaN(t) ? null : t;
  }

  function humanSeconds(total) {
    total = Math.max(0, Math.floor(total));
    var days = Math.floor(total / 86400), rest = total % 86400;
    var hours = Math.floor(rest / 3600); rest %= 3600;
    var minutes = Math.floor(rest / 60), seconds = rest % 60;
    var pad = function (n) { return n < 10 ? "0" + n : String(n); };
    if (days) return hours ? days + "d " + hours + "h" : days + "d";
    if (hours) return hours + "h " + pad(minutes) + "m";
    if (minutes) return minutes + "m " + pad(seconds) + "s";
    return seconds + "s";
  }

  setInterval(function () {
    var cells = document.querySelectorAll(".duration[data-start]");
    for (var i = 0; i < cells.length; i++) {
      var start = time(cells[i].getAttribute("data-start"));
      if (start !== null && !cells[i].getAttribute("data-end")) cells[i].textContent = humanSeconds((Date.now() - start) / 1000);
    }
  }, 1000);

  // --- the sockets: the badge in the top bar, and where the page is when one (re)opens ----------------------

  var statusBadge = document.getElementById("live-status");

  function showStatus(state, text) {
    if (!statusBadge) return;
    statusBadge.hidden = false;
    statusBadge.className = "live-status live-" + state;
    statusBadge.textContent = text;
    statusBadge.title = state === "on" ? "Updates arrive as they happen" : "Not receiving updates right now";
  }

  document.addEventListener("htmx:wsOpen", function () {
    live.opened += 1;
    showStatus("on", "Live");
  });
  document.addEventListener("htmx:wsClose", function (event) {
    live.closed += 1;
    var code = event.detail && event.detail.event ? event.detail.event.code : 0;
    showStatus("off", code === 4401 || code === 4403 ? "Not live: log in again" : "Reconnecting…");
  });
  document.addEventListener("htmx:wsAfterMessage", function () {
    live.received += 1;
    // The first rows of an empty list: the table (and the bulk form) show, "no jobs yet" goes.
    if (!document.querySelector("#job-rows tr[data-job]")) return;
    var hidden = document.querySelectorAll("[data-show-with-rows][hidden]");
    for (var i = 0; i < hidden.length; i++) hidden[i].hidden = false;
    var empty = document.querySelector("#job-list [data-empty]");
    if (empty) empty.remove();
  });

  // The list's socket is told which rows the page shows, the detail's which event it showed last and which log
  // viewers it has: on opening and on a reconnect the server sends what changed meanwhile.
  function pageState(url) {
    var u = new URL(url, location.href);
    var rows = document.querySelectorAll("#job-rows tr[data-job]");
    if (u.pathname === "/ws/jobs/") {
      u.searchParams.set("shown", Array.prototype.map.call(rows, function (r) { return r.getAttribute("data-job"); }).join(","));
    } else if (/^\/ws\/jobs\/\d+\/$/.test(u.pathname)) {
      var last = 0, cells = document.querySelectorAll("#events [data-event]");
      for (var i = 0; i < cells.length; i++) last = Math.max(last, Number(cells[i].getAttribute("data-event")));
      u.searchParams.set("after", String(last));
      var logs = document.querySelectorAll("#logs-list details[data-log]");  // the viewers it has: it gets the others
      u.searchParams.set("logs", Array.prototype.map.call(logs, function (d) { return d.id.replace(/^log-/, ""); }).join(","));
    }
    return u.toString();
  }

  if (window.htmx) {
    var createWebSocket = htmx.createWebSocket || function (url) { return new WebSocket(url); };
    htmx.createWebSocket = function (url) { return createWebSocket.call(htmx, pageState(url)); };
  }

  // --- the job list: select rows, select all on the page -----------------------------------------------------

  function rowBoxes() {
    return document.querySelectorAll('#job-rows input[name="ids"]');
  }

  document.addEventListener("change", function (event) {
    if (!event.target.matches || !event.target.matches("[data-select-all]")) return;
    var boxes = rowBoxes();
    for (var i = 0; i < boxes.length; i++) boxes[i].checked = event.target.checked;
  });

  // The bulk form (hx-post) asks the question of the button pressed with the number of rows checked: "Cancel 3
  // selected jobs?". With none checked it asks nothing: the server answers "Select the jobs to act on first."
  document.addEventListener("htmx:confirm", function (event) {
    var form = event.detail.elt;
    if (!form.hasAttribute || !form.hasAttribute("data-confirm-selected")) return;
    var trigger = event.detail.triggeringEvent;
    var button = trigger && trigger.submitter;
    if (!button || button.form !== form) button = document.activeElement;
    if (!button || button.form !== form) return;
    var count = Array.prototype.filter.call(form.elements, function (el) {
      return el.name === "ids" && el.checked;
    }).length;
    var question = count === 1 ? button.getAttribute("data-confirm-one")
      : (button.getAttribute("data-confirm-many") || "").replace("{n}", String(count));
    if (!count || !question) return;
    event.preventDefault();
    if (window.confirm(question)) event.detail.issueRequest(true);
  });

  document.addEventListener("htmx:afterRequest", function (event) {
    if (event.detail.elt.id !== "bulk-form" || !event.detail.successful) return;
    var boxes = rowBoxes();
    for (var i = 0; i < boxes.length; i++) boxes[i].checked = false;
    var all = document.querySelector("[data-select-all]");
    if (all) all.checked = false;
  });

  // --- the job detail ---------------------------------------------------------------------------------------

  // "replica N" of the attempts table unfolds that replica's log before the page scrolls to it.
  document.addEventListener("click", function (event) {
    var link = event.target.closest ? event.target.closest("a[data-open-log]") : null;
    var target = link && document.getElementById(link.getAttribute("href").slice(1));
    if (target && target.tagName === "DETAILS") target.open = true;
  });

  // A log viewer the server inserted (a new attempt): the "no log yet" line goes (static/js/logview.js picks the
  // viewer up on the same htmx:load). A replica shown already that turned out to be the first to fail gets its
  // mark from the server: it is marked as a fresh page would and unfolded (its log says why the attempt failed);
  // nothing else the reader unfolded is folded.
  document.addEventListener("htmx:load", function (event) {
    var node = event.detail.elt;
    if (!node.matches) return;
    if (node.matches("details[data-log]")) {
      var placeholder = document.querySelector("#logs-list [data-no-logs]");
      if (placeholder) placeholder.remove();
    } else if (node.matches("[data-mark-slot]") && node.querySelector(".failed-mark")) {
      var viewer = node.closest("details[data-log]");
      if (viewer && !viewer.hasAttribute("data-failed")) {
        viewer.setAttribute("data-failed", "");
        viewer.open = true;
      }
    }
  });

  // --- submit form: a chosen YAML file shows in the text box ----------------------------------------------

  function yamlUpload() {
    var input = document.querySelector(".yaml-form input[type=file]");
    var box = document.querySelector(".yaml-form textarea");
    if (!input || !box || !window.FileReader) return;
    input.addEventListener("change", function () {
      var file = input.files && input.files[0];
      if (!file || file.size > 128 * 1024) return;
      var reader = new FileReader();
      reader.onload = function () { box.value = String(reader.result); };
      reader.readAsText(file);
    });
  }

  // --- submit form: a choice made while the group's choices were on their way is kept --------------------------
  // Choosing a group re-draws the image and instance type selects from the server (htmx, with the choices of the
  // moment it asked); a choice made before that answer arrives is put back when the new group offers it too.

  var chosen = null;
  document.addEventListener("htmx:beforeSwap", function (event) {
    var target = event.detail && event.detail.target;
    if (!target || target.id !== "group-fields") return;
    chosen = {};
    var selects = target.querySelectorAll("select[name]");
    for (var i = 0; i < selects.length; i++) chosen[selects[i].name] = selects[i].value;
  });
  document.addEventListener("htmx:afterSwap", function () {
    var fields = chosen && document.getElementById("group-fields");
    if (!fields) return;
    Object.keys(chosen).forEach(function (name) {
      var select = fields.querySelector("select[name='" + name + "']");
      if (!select || select.value === chosen[name]) return;
      for (var i = 0; i < select.options.length; i++) {
        if (select.options[i].value === chosen[name]) { select.value = chosen[name]; break; }
      }
    });
    chosen = null;
  });

  function start() {
    var all = document.querySelector("[data-select-all]");
    if (all) all.hidden = false;  // needs this script
    yamlUpload();
    live.ready = true;
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
