// Which byte range of a replica's log is shown: ranges fetched from the API cut to whole lines, jumps to the start
// and the end, and the lines before or after those shown. Methods of LogViewer (viewer.js).

import { AnsiRenderer } from "./ansi.js";
import { byteLength, decoder, takeLines } from "./text.js";

export var WINDOW_BYTES = 256 * 1024;  // fetched by a jump, "earlier" or "later"

// Bytes [start, end) of a replica's log, cut to whole lines: from the first line that begins in the range
// (headCut) and up to the last line that ends in it (tailCut). Resolves {start, end, size, bytes}.
function fetchRange(viewer, params, headCut, tailCut) {
  var query = "attempt=" + viewer.attempt + "&replica=" + viewer.rank;
  for (var key in params) query += "&" + key + "=" + params[key];
  return fetch(viewer.api + "?" + query, { credentials: "same-origin" }).then(function (r) {
    if (!r.ok) throw new Error(String(r.status));
    var start = Number(r.headers.get("X-Log-Start")) || 0;
    var size = Number(r.headers.get("X-Log-Size")) || 0;
    return r.arrayBuffer().then(function (buffer) {
      var bytes = new Uint8Array(buffer), from = 0, to = bytes.length;
      if (headCut && start > 0) {
        var nl = bytes.indexOf(10);
        from = nl < 0 ? to : nl + 1;
      }
      if (tailCut && start + to < size) {
        var last = bytes.lastIndexOf(10);
        to = last < from ? from : last + 1;
      }
      return { start: start + from, end: start + to, size: size, bytes: bytes.subarray(from, to) };
    });
  });
}

export var ranges = {};

// moving around: everything shown is one byte range of the log

ranges.show = function (range, pieces, then) {
  // Replace what is shown by ``range`` (from fetchRange), split into pieces [{from, to, className}] of it.
  this.clear(range.start);
  this.size = Math.max(this.size, range.size);
  var self = this;
  pieces.forEach(function (p, i) {
    var item = { text: decoder.decode(range.bytes.subarray(p.from - range.start, p.to - range.start)),
                 start: p.from, end: p.to, className: p.className };
    if (i === pieces.length - 1) item.then = then;
    self.enqueue(item);
  });
  if (!pieces.length && then) then();
  this.updateBars();
};

ranges.request = function (params, headCut, tailCut) {
  var generation = ++this.generation;
  var self = this;
  this.setState("Loading…");
  return fetchRange(this, params, headCut, tailCut).then(function (range) {
    if (generation !== self.generation) throw new Error("superseded");
    self.setState("");
    return range;
  }, function (error) {
    self.setState("Could not load the log (" + error.message + ").");
    throw error;
  });
};

ranges.jumpToStart = function () {
  var self = this;
  if (this.follow) this.follow.checked = false;
  this.pause();
  this.request({ start: 0, end: WINDOW_BYTES }, false, true).then(function (range) {
    self.skipped = null;
    self.show(range, [{ from: range.start, to: range.end }], function () {
      self.pre.scrollTop = 0;
      self.updateBars();
    });
  }).catch(function () {});
};

ranges.jumpToEnd = function () {
  var self = this;
  if (this.follow) this.follow.checked = true;
  this.stick = true;
  this.root.open = true;
  this.request({ tail_bytes: WINDOW_BYTES }, true, false).then(function (range) {
    self.skipped = null;
    self.show(range, [{ from: range.start, to: range.end }], function () { self.scrollToEnd(); });
    self.live = true;
    self.received = range.end;
    self.subscribed = false;
    self.resubscribe();
    self.updateBars();
    self.pre.focus({ preventScroll: true });
  }).catch(function () {});
};

ranges.loadEarlier = function () {
  if (this.start <= 0 || this.queue.length) return;
  var self = this, before = this.start, generation = this.generation;
  fetchRange(this, { start: Math.max(0, before - WINDOW_BYTES), end: before }, true, false).then(function (range) {
    if (generation !== self.generation || self.start !== before) return;
    var height = self.pre.scrollHeight, top = self.pre.scrollTop;
    var saved = self.renderer;
    self.renderer = new AnsiRenderer();  // colours start afresh above
    var text = decoder.decode(range.bytes);
    // Rendered at once (at most WINDOW_BYTES), in pieces, before the first line shown.
    var first = self.pre.firstChild, at = range.start, done = 0;
    while (done < text.length) {
      var step = takeLines(text, done), slice = text.slice(done, step[0]);
      var to = step[0] >= text.length ? range.end : at + byteLength(slice);
      self.addPiece(slice, at, to, step[1], "", first);
      done = step[0];
      at = to;
    }
    self.renderer = saved;
    self.start = range.start;
    self.pre.scrollTop = top + (self.pre.scrollHeight - height);  // the lines in view stay where they were
    if (self.follow) self.follow.checked = false;
    self.trimBelow();
    self.updateBars();
  }).catch(function () { self.setState("Could not load earlier lines."); });
};

ranges.loadLater = function () {
  if (this.live || this.queue.length) return;
  var self = this, after = this.end, generation = this.generation;
  fetchRange(this, { start: after, end: after + WINDOW_BYTES }, false, true).then(function (range) {
    if (generation !== self.generation || self.end !== after) return;
    self.size = Math.max(self.size, range.size);
    if (range.end > range.start) self.enqueue({ text: decoder.decode(range.bytes), start: range.start, end: range.end });
    if (range.end >= range.size) {  // reached the end: follow from here
      self.live = true;
      self.received = range.end;
      self.resubscribe();
    }
    self.updateBars();
  }).catch(function () { self.setState("Could not load later lines."); });
};
