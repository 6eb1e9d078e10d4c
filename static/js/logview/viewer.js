// The viewer of one replica's log: its state and controls, its subscription to the socket (only while the page
// shows the end of the log and the viewer is unfolded) and the socket's messages. Rendering, moving around the
// log and searching it are in render.js, ranges.js and search.js.

import { AnsiRenderer } from "./ansi.js";
import { ranges } from "./ranges.js";
import { rendering } from "./render.js";
import { searching } from "./search.js";

export function LogViewer(root, socket) {
  this.root = root;
  this.socket = socket;
  this.attempt = Number(root.getAttribute("data-attempt"));
  this.rank = Number(root.getAttribute("data-rank"));
  this.key = this.attempt + "-" + this.rank;
  this.api = root.getAttribute("data-log-api");
  this.start = Number(root.getAttribute("data-start")) || 0;
  this.end = this.start;
  this.size = Number(root.getAttribute("data-size")) || 0;
  this.pre = root.querySelector("pre.log-text");
  this.follow = root.querySelector("[data-log-follow]");
  this.above = root.querySelector("[data-log-above]");
  this.below = root.querySelector("[data-log-below]");
  this.state = root.querySelector(".log-state");
  this.queue = [];  // {text, start, end, ...}: pieces to render, in order
  this.lines = 0;
  this.live = true;  // what the page shows reaches the end of the log, and the socket sends what comes next
  this.subscribed = false;
  this.received = 0;  // end of the newest piece the socket sent
  this.skipped = null;  // [from, to) skipped while following, shown above
  this.generation = 0;  // a jump starts a new one: what older requests bring is dropped
  this.renderer = new AnsiRenderer();
  this.match = null;

  var toolbar = root.querySelector(".log-toolbar");
  if (toolbar) toolbar.hidden = false;
  var initial = this.pre.textContent;  // the server's tail, as plain text: rendered again with colours
  this.pre.textContent = "";
  var end = Number(root.getAttribute("data-end")) || 0;
  if (initial) this.enqueue({ text: initial, start: this.start, end: end });
  this.received = end;

  var self = this;
  var on = function (selector, event, fn) {
    var nodes = root.querySelectorAll(selector);
    for (var i = 0; i < nodes.length; i++) nodes[i].addEventListener(event, fn);
  };
  on("[data-log-start]", "click", function () { self.jumpToStart(); });
  on("[data-log-end]", "click", function () { self.jumpToEnd(); });
  on("[data-log-earlier]", "click", function () { self.loadEarlier(); });
  on("[data-log-later]", "click", function () { self.loadLater(); });
  on("[data-log-search]", "submit", function (event) { event.preventDefault(); self.search(1); });
  on("[data-log-next]", "click", function () { self.search(1); });
  on("[data-log-prev]", "click", function () { self.search(-1); });
  if (this.follow) {
    this.follow.addEventListener("change", function () {
      if (self.follow.checked) self.jumpToEnd();
      else self.pause();
    });
  }
  this.pre.addEventListener("scroll", function () {
    if (self.scrolling || self.atEnd()) return;
    self.stick = false;
    if (self.follow && self.follow.checked) { self.follow.checked = false; self.pause(); }
  });
  root.addEventListener("toggle", function () { self.resubscribe(); });
  this.stick = !!(this.follow && this.follow.checked);
  this.updateBars();
  this.resubscribe();
}

LogViewer.prototype.atEnd = function () {
  return this.pre.scrollTop + this.pre.clientHeight >= this.pre.scrollHeight - 8;
};

LogViewer.prototype.scrollToEnd = function () {
  var self = this;
  this.scrolling = true;
  this.pre.scrollTop = this.pre.scrollHeight;
  requestAnimationFrame(function () { self.scrolling = false; });
};

LogViewer.prototype.setState = function (text) {
  if (this.state) this.state.textContent = text;
};

// subscription: only while the page shows the end of the log and the viewer is unfolded

LogViewer.prototype.resubscribe = function () {
  var wanted = this.live && this.root.open && document.contains(this.root);
  if (wanted) {
    this.subscribed = this.socket.send({ type: "log.follow", attempt: this.attempt, rank: this.rank,
                                         offset: this.received });
  } else if (this.subscribed) {
    this.socket.send({ type: "log.unfollow", attempt: this.attempt, rank: this.rank });
    this.subscribed = false;
  }
};

LogViewer.prototype.pause = function () {
  // Reading: the lines stay where they are; what comes next is shown on "Jump to end" (or "Later").
  this.stick = false;
  if (!this.live) return;
  this.live = false;
  this.replacing = null;  // a skip whose piece did not come: what is shown stays
  this.queue = this.queue.filter(function (item) { return !item.ack; });
  this.resubscribe();
  this.updateBars();
};

LogViewer.prototype.onPhase = function (finished) {
  if (finished && this.follow && this.follow.checked) {
    this.follow.checked = false;  // nothing more to follow; the last bytes still come and stay in view
    this.setState("The job has ended.");
  }
};

LogViewer.prototype.onMessage = function (m) {
  if (!this.live) return;
  if (m.type === "log.skipped") {  // the next piece replaces the lines shown, in the frame that draws it
    this.received = m.to;
    this.replacing = [m.from, m.to];
    this.size = Math.max(this.size, m.size || 0);
  } else if (m.type === "log.reset") {
    this.received = 0;
    this.skipped = this.replacing = null;
    this.clear(0);
    this.updateBars();
  } else if (m.type === "log.appended") {
    this.size = Math.max(this.size, m.size || m.end);
    if (m.end <= this.received) {
      this.ack(m.end);
      return;
    }
    this.received = m.end;
    this.enqueue({ text: m.text, start: m.offset, end: m.end, ack: true, replace: this.replacing });
    this.replacing = null;
  } else if (m.type === "log.error") {
    this.setState(m.message);
  }
};

LogViewer.prototype.ack = function (end) {
  this.socket.send({ type: "log.ack", attempt: this.attempt, rank: this.rank, end: end });
};

Object.assign(LogViewer.prototype, rendering, ranges, searching);
