// Search in a replica's log: the server searches the whole log; a match is shown with the lines around it.
// Methods of LogViewer (viewer.js).

import { WINDOW_BYTES } from "./ranges.js";

export var searching = {};

searching.search = function (direction) {
  var input = this.root.querySelector("[data-log-query]");
  var query = input ? input.value : "";
  if (!query) return;
  var self = this;
  var params = { q: encodeURIComponent(query), limit: 1 };
  var here = this.match && this.match.query === query ? this.match : null;
  if (direction > 0) params.after = here ? here.offset + 1 : (this.live ? 0 : this.start);
  else params.before = here ? here.offset : this.end;
  var url = this.api + "search/?attempt=" + this.attempt + "&replica=" + this.rank;
  for (var key in params) url += "&" + key + "=" + params[key];
  this.setState("Searching…");
  fetch(url, { credentials: "same-origin" }).then(function (r) {
    if (!r.ok) throw new Error(String(r.status));
    return r.json();
  }).then(function (data) {
    var m = data.matches[0];
    if (!m) {
      self.setState(direction > 0 ? "No match below." : "No match above.");
      return;
    }
    self.setState("");
    self.showMatch(m, query);
  }).catch(function (error) { self.setState("Search failed (" + error.message + ")."); });
};

searching.showMatch = function (m, query) {
  var self = this;
  if (this.follow) this.follow.checked = false;
  this.pause();
  var half = WINDOW_BYTES / 2;
  this.request({ start: Math.max(0, m.line_start - half), end: m.line_end + 1 + half }, true, true)
    .then(function (range) {
      self.skipped = null;
      var lineEnd = Math.min(range.end, m.line_end + 1);
      var pieces = [];
      if (m.line_start > range.start) pieces.push({ from: range.start, to: m.line_start });
      pieces.push({ from: m.line_start, to: lineEnd, className: "log-match" });
      if (range.end > lineEnd) pieces.push({ from: lineEnd, to: range.end });
      self.show(range, pieces, function () {
        var line = self.pre.querySelector(".log-match");
        if (line) {
          self.scrolling = true;
          line.scrollIntoView({ block: "center" });
          requestAnimationFrame(function () { self.scrolling = false; });
        }
        self.setState("Match at byte " + m.offset.toLocaleString() + ".");
      });
      self.match = { offset: m.offset, query: query };
    }).catch(function () {});
};
