// jobsite log viewer: follows replica logs at any rate, jumps to the start, the end or a search match, and shows
// ANSI colours. The page works without it (the server renders the log's tail as plain text).
//
// Log text only ever reaches the page through text nodes and class names: never as HTML.
// The server (ws/jobs/<id>/logs/, jobs/consumers.py JobLogConsumer) sends one piece per log at a time and the
// next only once this viewer has shown it; one that fell behind gets the newest window, which replaces the lines
// shown in the frame that draws it (the log is never blank), and a note of the bytes skipped. Pieces are rendered
// a few hundred lines per frame, at most MAX_LINES lines stay in the page (older ones can be loaded by range).
//
// An ES module (static/js/logview/ holds its parts); like the deferred script it was, it runs once the page is
// parsed.

import { AnsiRenderer } from "./logview/ansi.js";
import { LogSocket } from "./logview/socket.js";
import { stats } from "./logview/stats.js";
import { LogViewer } from "./logview/viewer.js";

var ns = (window.jobsite = window.jobsite || {});

// --- start: every inline log viewer of the page, and those that appear later ----------------------------

var sockets = {};
var viewers = [];

function scan() {
  viewers = viewers.filter(function (v) {
    if (document.contains(v.root)) return true;
    v.live = false;
    v.resubscribe();
    delete v.socket.viewers[v.key];
    return false;
  });
  var nodes = document.querySelectorAll("details[data-log]:not([data-static])");
  for (var i = 0; i < nodes.length; i++) {
    var node = nodes[i];
    if (node.logViewer || !node.querySelector("pre.log-text")) continue;
    var job = node.getAttribute("data-job");
    var socket = sockets[job] || (sockets[job] = new LogSocket(job));
    var viewer = new LogViewer(node, socket);
    node.logViewer = viewer;
    socket.viewers[viewer.key] = viewer;
    viewers.push(viewer);
  }
}

// Viewers come and go with what htmx swaps in (a new attempt's logs, the page's blocks): looked for again once
// per frame after htmx has loaded new content, never on the log text's own changes.
function start() {
  scan();
  var pending = false;
  document.addEventListener("htmx:load", function () {
    if (pending) return;
    pending = true;
    requestAnimationFrame(function () { pending = false; scan(); });
  });
}

if (!ns.logview) {  // a module runs once a page; this keeps a second copy (another URL) from starting again
  ns.logview = { AnsiRenderer: AnsiRenderer, viewers: function () { return viewers; }, stats: stats };
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
}
