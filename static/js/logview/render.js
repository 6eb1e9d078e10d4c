// Rendering a replica's log: queued pieces drawn a few hundred lines per frame, at most MAX_LINES lines in the
// page, and the notes above and below the lines. Methods of LogViewer (viewer.js).

import { AnsiRenderer } from "./ansi.js";
import { note } from "./stats.js";
import { byteLength, el, formatBytes, takeLines } from "./text.js";

var MAX_LINES = 5000;  // kept in the page
var FRAME_BUDGET_MS = 8;  // rendering stops for the frame once it took this long

export var rendering = {};

rendering.clear = function (offset, skipped) {  // skipped: [from, to), the queue's head replaces
  this.generation += 1;
  if (skipped) this.skipped = skipped; else this.queue = [];
  this.pre.textContent = "";
  this.lines = 0;
  this.start = this.end = offset;
  this.renderer = new AnsiRenderer();
  this.match = null;
};

rendering.enqueue = function (item) {
  item.done = 0;  // characters of item.text rendered so far
  item.at = item.start;  // and the byte offset they reach
  this.queue.push(item);
  this.schedule();
};

rendering.schedule = function () {
  if (this.frame) return;
  var self = this;
  this.frame = requestAnimationFrame(function () {
    self.frame = null;
    self.renderSome();
  });
};

rendering.renderSome = function () {
  var began = performance.now();
  try { this.renderFrame(began); } finally { note("render", performance.now() - began); }
};

rendering.renderFrame = function (began) {
  var follow = this.stick || (this.follow && this.follow.checked);
  var rendered = false;
  while (this.queue.length && performance.now() - began < FRAME_BUDGET_MS) {
    var item = this.queue[0];
    if (item.replace && !item.done) this.clear(item.start, item.replace);  // never an empty log in between
    var step = takeLines(item.text, item.done), cut = step[0];
    var text = item.text.slice(item.done, cut);
    var last = cut >= item.text.length;
    var to = last ? item.end : item.at + byteLength(text);
    this.addPiece(text, item.at, to, step[1], item.className, null);
    item.done = cut;
    item.at = to;
    rendered = true;
    if (last) {
      this.queue.shift();
      if (item.ack) this.ack(item.end);
      if (item.then) item.then();
    }
  }
  if (rendered) {
    this.trimAbove();
    this.updateBars();
    if (follow) this.scrollToEnd();
  }
  if (this.queue.length) this.schedule();
};

rendering.addPiece = function (text, start, end, lines, className, before) {
  // A block of its own (appending one lays out that one only); its last line break is the block's end.
  var piece = el("span", "log-piece" + (className ? " " + className : ""));
  piece.setAttribute("data-start", start);
  piece.setAttribute("data-end", end);
  piece.setAttribute("data-lines", lines);
  appendMarked(this.renderer, piece, text.replace(/\r?\n$/, ""));
  if (before) {  // "earlier"
    this.pre.insertBefore(piece, before);
  } else {
    this.pre.appendChild(piece);
    this.end = end;
  }
  this.lines += lines;
  this.pre.hidden = false;
  var empty = this.root.querySelector(".log-empty");
  if (empty) empty.remove();
};

// Lines the archiver wrote where the cluster lost log lines (jobs/logs.py LOST_LINES_PREFIX): shown apart.
var LOST_LINES = /^\[jobsite: log lines lost here[^\n]*$/m;

function appendMarked(renderer, piece, text) {
  var match;
  while ((match = LOST_LINES.exec(text)) !== null) {
    if (match.index) piece.appendChild(renderer.render(text.slice(0, match.index)));
    piece.appendChild(el("span", "log-lost", match[0]));
    text = text.slice(match.index + match[0].length);
  }
  if (text) piece.appendChild(renderer.render(text));
}

rendering.trimAbove = function () {
  while (this.lines > MAX_LINES && this.pre.childNodes.length > 1) {
    var first = this.pre.firstChild;
    this.lines -= Number(first.getAttribute("data-lines")) || 0;
    this.pre.removeChild(first);
    this.start = Number(this.pre.firstChild.getAttribute("data-start"));
  }
};

rendering.trimBelow = function () {
  var trimmed = false;
  while (this.lines > MAX_LINES && this.pre.childNodes.length > 1) {
    var last = this.pre.lastChild;
    this.lines -= Number(last.getAttribute("data-lines")) || 0;
    this.pre.removeChild(last);
    this.end = Number(this.pre.lastChild.getAttribute("data-end"));
    trimmed = true;
  }
  if (trimmed) this.pause();
};

// the notes above and below the lines

rendering.updateBars = function () {
  var size = this.root.querySelector(".log-size");
  if (size) size.textContent = "(" + formatBytes(Math.max(this.size, this.end)) + ")";
  if (this.above) {
    var aboveText = this.above.querySelector("[data-log-above-text]");
    this.above.hidden = this.start <= 0;
    if (this.skipped && this.skipped[1] === this.start) {
      aboveText.textContent = "Skipped " + formatBytes(this.skipped[1] - this.skipped[0]) + " while following " +
        "(bytes " + this.skipped[0].toLocaleString() + "–" + this.skipped[1].toLocaleString() + ").";
      this.above.setAttribute("data-log-skipped", "");
    } else {
      aboveText.textContent = formatBytes(this.start) + " above.";
      this.above.removeAttribute("data-log-skipped");
    }
  }
  if (this.below) {
    var belowText = this.below.querySelector("[data-log-below-text]");
    this.below.hidden = this.live;
    belowText.textContent = this.size > this.end ? formatBytes(this.size - this.end) + " below." :
      "Not following.";
  }
};
