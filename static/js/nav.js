// The page frame: the top bar's menu on narrow screens, the "Queues" menu, and time stamps in the reader's time zone.
// Small and independent of pages.js; every part leaves the page usable without it.
(function () {
  "use strict";

  // --- the top bar's menu button (narrow screens) ------------------------------------------------------------
  var topbar = document.querySelector(".topbar");
  var button = topbar && topbar.querySelector(".nav-button");
  var panel = button && document.getElementById(button.getAttribute("aria-controls"));

  function setOpen(open) {
    topbar.classList.toggle("nav-open", open);
    button.setAttribute("aria-expanded", open ? "true" : "false");
  }

  if (button && panel) {
    button.hidden = false;
    topbar.classList.add("nav-ready"); // from here on the CSS folds the panel on narrow screens
    button.addEventListener("click", function () {
      setOpen(!topbar.classList.contains("nav-open"));
    });
  }

  // --- the "Queues" menu (and the narrow menu): Escape and a click elsewhere close them ---------------------------
  function openMenus() {
    return Array.prototype.slice.call(document.querySelectorAll("details.navmenu[open]"));
  }

  document.addEventListener("keydown", function (event) {
    if (event.key !== "Escape") return;
    openMenus().forEach(function (menu) {
      menu.open = false;
      var summary = menu.querySelector("summary");
      if (summary && menu.contains(document.activeElement)) summary.focus();
    });
    if (button && topbar.classList.contains("nav-open")) {
      setOpen(false);
      if (panel.contains(document.activeElement)) button.focus();
    }
  });

  document.addEventListener("click", function (event) {
    openMenus().forEach(function (menu) {
      if (!menu.contains(event.target)) menu.open = false;
    });
    if (button && topbar.classList.contains("nav-open") && !topbar.contains(event.target)) setOpen(false);
  });

  // --- time stamps: <time datetime="ISO" data-local> shows UTC from the server; here, the reader's time ----------
  function pad(n) { return n < 10 ? "0" + n : String(n); }

  function stamp(d, utc, seconds) {
    var y = utc ? d.getUTCFullYear() : d.getFullYear();
    var mo = utc ? d.getUTCMonth() : d.getMonth();
    var day = utc ? d.getUTCDate() : d.getDate();
    var h = utc ? d.getUTCHours() : d.getHours();
    var mi = utc ? d.getUTCMinutes() : d.getMinutes();
    var s = utc ? d.getUTCSeconds() : d.getSeconds();
    return y + "-" + pad(mo + 1) + "-" + pad(day) + " " + pad(h) + ":" + pad(mi) + (seconds ? ":" + pad(s) : "");
  }

  var zone = "";
  try { zone = Intl.DateTimeFormat().resolvedOptions().timeZone || ""; } catch (e) { /* older browsers */ }

  function localise(root) {
    if (!root || !root.querySelectorAll) return;
    var nodes = root.matches && root.matches("time[data-local]") ? [root] : root.querySelectorAll("time[data-local]");
    for (var i = 0; i < nodes.length; i++) {
      var node = nodes[i];
      var iso = node.getAttribute("datetime");
      if (!iso || node.getAttribute("data-localised") === iso) continue;
      var d = new Date(iso);
      if (isNaN(d.getTime())) continue;
      var seconds = node.getAttribute("data-local") === "seconds";
      node.textContent = stamp(d, false, seconds);
      node.title = stamp(d, true, true) + " UTC" + (zone ? " (shown in " + zone + ")" : "");
      node.setAttribute("data-localised", iso);
    }
  }

  localise(document.body);
  // Fragments swapped in later (htmx swaps, out-of-band ones included, and the pages' own refreshes).
  ["htmx:load", "htmx:afterSwap", "htmx:oobAfterSwap"].forEach(function (name) {
    document.addEventListener(name, function (event) { localise(event.target); });
  });
  if (window.MutationObserver) {
    new MutationObserver(function (records) {
      for (var i = 0; i < records.length; i++) {
        var target = records[i].target;
        if (target.closest && target.closest("pre")) continue; // log text never holds time stamps
        var added = records[i].addedNodes;
        for (var j = 0; j < added.length; j++) if (added[j].nodeType === 1) localise(added[j]);
      }
    }).observe(document.body, { childList: true, subtree: true });
  }
})();
