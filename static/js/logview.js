// jobsite log viewer: follows replica logs at any rate, jumps to the start, the end or a search match, and shows
// ANSI colours. The page works without it (the server renders the log's tail as plain text).
//
// Log text only ever reaches the page through text nodes and class names: never as HTML.
// The server (ws/jobs/<id>/logs/, jobs/consumers.py JobLogConsumer) sends one piece per log at a time and the
// next only once this viewer has shown it; one that fell behind gets the newest window, which replaces the lines
// shown in the frame that draws it (the log is never blank), and a note of the bytes skipped. Pieces are rendered
// a few hundred lines per frame, at most MAX_LINES lines stay in the page (older ones can be loaded by range).
(function () {
  "use strict";

  var ns = (window.jobsite = window.jobsite || {});
  if (ns.logview) return;  // included again by a swapped fragment

  var WINDOW_BYTES = 256 * 1024;  // fetched by a jump, "earlier" or "later"
  var MAX_LINES = 5000;  // kept in the page
  var LINES_PER_PIECE = 200;  // one element, rendered in one step
  var FRAME_BUDGET_MS = 8;  // rendering stops for the frame once it took this long

  function el(tag, className, text) {
    var node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function formatBytes(n) {
    var units = [["GiB", 1 << 30], ["MiB", 1 << 20], ["KiB", 1 << 10]];
    for (var i = 0; i < units.length; i++) {
      if (n >= units[i][1]) return (n / units[i][1]).toPrecision(3).replace(/\.?0+$/, "") + " " + units[i][0];
    }
    return n + " B";
  }

  // The longest each kind of work of the viewer took (ms): the log-rate benchmark prints them.
  var stats = { message: 0, render: 0 };
  function note(kind, ms) { if (ms > stats[kind]) stats[kind] = ms; }

  var encoder = new TextEncoder();
  var decoder = new TextDecoder("utf-8");

  function byteLength(text) {  // in UTF-8
    return /[^\x00-\x7f]/.test(text) ? encoder.encode(text).length : text.length;
  }

  // --- ANSI colours: SGR codes become spans with classes; every other escape sequence is dropped -------------

  function AnsiRenderer() {
    this.carry = "";
    this.reset();
  }

  AnsiRenderer.prototype.reset = function () {
    this.fg = null; this.bg = null; this.fgRGB = null; this.bgRGB = null;
    this.bold = false; this.dim = false; this.italic = false; this.underline = false; this.inverse = false;
    this.strike = false;
  };

  function xterm256(n) {
    if (n < 16) return null;
    if (n >= 232) { var g = 8 + (n - 232) * 10; return [g, g, g]; }
    n -= 16;
    var steps = [0, 95, 135, 175, 215, 255];
    return [steps[Math.floor(n / 36)], steps[Math.floor(n / 6) % 6], steps[n % 6]];
  }

  AnsiRenderer.prototype.extended = function (params, i, isFg) {
    // 38;5;n or 38;2;r;g;b (48 for the background). Returns how many extra parameters were used.
    var mode = params[i + 1];
    if (mode === 5 && params.length > i + 2) {
      var n = params[i + 2];
      if (n >= 0 && n < 16) {
        if (isFg) { this.fg = n; this.fgRGB = null; } else { this.bg = n; this.bgRGB = null; }
      } else if (n < 256) {
        if (isFg) { this.fgRGB = xterm256(n); this.fg = null; } else { this.bgRGB = xterm256(n); this.bg = null; }
      }
      return 2;
    }
    if (mode === 2 && params.length > i + 4) {
      var rgb = [params[i + 2], params[i + 3], params[i + 4]].map(function (v) { return Math.max(0, Math.min(255, v)); });
      if (isFg) { this.fgRGB = rgb; this.fg = null; } else { this.bgRGB = rgb; this.bg = null; }
      return 4;
    }
    return 1;
  };

  AnsiRenderer.prototype.sgr = function (text) {
    var params = text === "" ? [0] : text.split(";").map(function (p) { return p === "" ? 0 : parseInt(p, 10); });
    for (var i = 0; i < params.length; i++) {
      var p = params[i];
      if (isNaN(p)) continue;
      if (p === 0) this.reset();
      else if (p === 1) this.bold = true;
      else if (p === 2) this.dim = true;
      else if (p === 3) this.italic = true;
      else if (p === 4) this.underline = true;
      else if (p === 7) this.inverse = true;
      else if (p === 9) this.strike = true;
      else if (p === 22) { this.bold = false; this.dim = false; }
      else if (p === 23) this.italic = false;
      else if (p === 24) this.underline = false;
      else if (p === 27) this.inverse = false;
      else if (p === 29) this.strike = false;
      else if (p >= 30 && p <= 37) { this.fg = p - 30; this.fgRGB = null; }
      else if (p >= 90 && p <= 97) { this.fg = p - 90 + 8; this.fgRGB = null; }
      else if (p === 39) { this.fg = null; this.fgRGB = null; }
      else if (p >= 40 && p <= 47) { this.bg = p - 40; this.bgRGB = null; }
      else if (p >= 100 && p <= 107) { this.bg = p - 100 + 8; this.bgRGB = null; }
      else if (p === 49) { this.bg = null; this.bgRGB = null; }
      else if (p === 38 || p === 48) i += this.extended(params, i, p === 38);
    }
  };

  AnsiRenderer.prototype.styled = function () {
    return this.fg !== null || this.bg !== null || this.fgRGB || this.bgRGB || this.bold || this.dim ||
      this.italic || this.underline || this.inverse || this.strike;
  };

  AnsiRenderer.prototype.span = function (text) {
    var classes = [];
    var fg = this.fg, bg = this.bg, fgRGB = this.fgRGB, bgRGB = this.bgRGB;
    if (this.inverse) {
      classes.push("ansi-inverse");
      var t = fg; fg = bg; bg = t;
      var u = fgRGB; fgRGB = bgRGB; bgRGB = u;
    }
    if (fg !== null) classes.push("ansi-fg-" + fg);
    if (bg !== null) classes.push("ansi-bg-" + bg);
    if (this.bold) classes.push("ansi-bold");
    if (this.dim) classes.push("ansi-dim");
    if (this.italic) classes.push("ansi-italic");
    if (this.underline) classes.push("ansi-underline");
    if (this.strike) classes.push("ansi-strike");
    var node = el("span", classes.join(" "), text);
    if (fgRGB) node.style.color = "rgb(" + fgRGB.join(",") + ")";
    if (bgRGB) node.style.backgroundColor = "rgb(" + bgRGB.join(",") + ")";
    return node;
  };

  // Escape sequences: CSI (ESC [ … final), OSC (ESC ] … BEL or ESC \), two-byte ESC x; one cut off waits for more.
  var ESCAPES = /\x1b\[([0-9;?:<=>]*)[ -\/]*([@-~])|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[()*+][A-Za-z0-9]|\x1b[@-Z\\-_]/g;
  var INCOMPLETE = /\x1b(\[[0-9;?:<=>]*[ -\/]*|\][^\x07\x1b]*|[()*+])?$/;

  AnsiRenderer.prototype.render = function (input) {
    var text = this.carry + input;
    this.carry = "";
    var cut = INCOMPLETE.exec(text);
    if (cut && text.length - cut.index < 256) {
      this.carry = text.slice(cut.index);
      text = text.slice(0, cut.index);
    }
    text = text.replace(/\r\n/g, "\n").replace(/\r/g, "\n");
    var out = document.createDocumentFragment();
    var self = this;
    var last = 0;
    var emit = function (piece) {
      if (!piece) return;
      piece = piece.replace(/[\x00-\x08\x0b\x0c\x0e-\x1a\x1c-\x1f\x7f]/g, "");
      if (!piece) return;
      out.appendChild(self.styled() ? self.span(piece) : document.createTextNode(piece));
    };
    if (text.indexOf("\x1b") < 0) {  // the common case: no escapes at all
      emit(text);
      return out;
    }
    ESCAPES.lastIndex = 0;
    var match;
    while ((match = ESCAPES.exec(text)) !== null) {
      emit(text.slice(last, match.index));
      if (match[2] === "m") this.sgr(match[1] || "");
      last = ESCAPES.lastIndex;
    }
    emit(text.slice(last));
    return out;
  };

  // --- byte ranges of a log, from the API -------------------------------------------------------------------

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

  // --- the socket of a job's logs -------------------------------------------------------------------------

  function LogSocket(jobId) {
    this.path = "/ws/jobs/" + jobId + "/logs/";
    this.viewers = {};
    this.attempts = 0;
    this.finished = null;
    this.connect();
  }

  LogSocket.prototype.connect = function () {
    var self = this;
    var scheme = location.protocol === "https:" ? "wss://" : "ws://";
    var ws = new WebSocket(scheme + location.host + this.path);
    this.ws = ws;
    ws.onopen = function () {
      self.attempts = 0;
      for (var key in self.viewers) self.viewers[key].resubscribe();
    };
    ws.onmessage = function (event) {
      var began = performance.now();
      try { self.onMessage(event); } finally { note("message", performance.now() - began); }
    };
    ws.onclose = function (event) {
      self.ws = null;
      if (event.code === 4401 || event.code === 4403) return;
      var delay = Math.min(30000, 1000 * Math.pow(2, self.attempts)) * (0.75 + Math.random() * 0.5);
      self.attempts += 1;
      setTimeout(function () { self.connect(); }, delay);
    };
  };

  LogSocket.prototype.onMessage = function (event) {
    var m;
    try { m = JSON.parse(event.data); } catch (e) { return; }
    if (m.type === "job.phase") {
      this.finished = !!m.finished;
      for (var k in this.viewers) this.viewers[k].onPhase(this.finished);
      return;
    }
    var viewer = this.viewers[Number(m.attempt) + "-" + Number(m.rank)];
    if (viewer) viewer.onMessage(m);
  };

  LogSocket.prototype.send = function (message) {
    if (this.ws && this.ws.readyState === WebSocket.OPEN) {
      this.ws.send(JSON.stringify(message));
      return true;
    }
    return false;
  };

  // --- the viewer of one replica's log ----------------------------------------------------------------------

  function LogViewer(root, socket) {
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

  // rendering: a few hundred lines per frame; at most MAX_LINES lines in the page

  LogViewer.prototype.clear = function (offset, skipped) {  // skipped: [from, to), the queue's head replaces
    this.generation += 1;
    if (skipped) this.skipped = skipped; else this.queue = [];
    this.pre.textContent = "";
    this.lines = 0;
    this.start = this.end = offset;
    this.renderer = new AnsiRenderer();
    this.match = null;
  };

  LogViewer.prototype.enqueue = function (item) {
    item.done = 0;  // characters of item.text rendered so far
    item.at = item.start;  // and the byte offset they reach
    this.queue.push(item);
    this.schedule();
  };

  LogViewer.prototype.schedule = function () {
    if (this.frame) return;
    var self = this;
    this.frame = requestAnimationFrame(function () {
      self.frame = null;
      self.renderSome();
    });
  };

  LogViewer.prototype.renderSome = function () {
    var began = performance.now();
    try { this.renderFrame(began); } finally { note("render", performance.now() - began); }
  };

  LogViewer.prototype.renderFrame = function (began) {
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

  // Up to LINES_PER_PIECE lines of ``text`` from index ``from``: [the index they end at, how many].
  function takeLines(text, from) {
    var cut = from, n = 0;
    for (; n < LINES_PER_PIECE && cut < text.length; n++) {
      var nl = text.indexOf("\n", cut);
      cut = nl < 0 ? text.length : nl + 1;
    }
    return [cut, n];
  }

  LogViewer.prototype.addPiece = function (text, start, end, lines, className, before) {
    // A block of its own (appending one lays out that one only); its last line break is the block's end.
    var piece = el("span", "log-piece" + (className ? " " + className : ""));
    piece.setAttribute("data-start", start);
    piece.setAttribute("data-end", end);
    piece.setAttribute("data-lines", lines);
    piece.appendChild(this.renderer.render(text.replace(/\r?\n$/, "")));
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

  LogViewer.prototype.trimAbove = function () {
    while (this.lines > MAX_LINES && this.pre.childNodes.length > 1) {
      var first = this.pre.firstChild;
      this.lines -= Number(first.getAttribute("data-lines")) || 0;
      this.pre.removeChild(first);
      this.start = Number(this.pre.firstChild.getAttribute("data-start"));
    }
  };

  LogViewer.prototype.trimBelow = function () {
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

  LogViewer.prototype.updateBars = function () {
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

  // moving around: everything shown is one byte range of the log

  LogViewer.prototype.show = function (range, pieces, then) {
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

  LogViewer.prototype.request = function (params, headCut, tailCut) {
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

  LogViewer.prototype.jumpToStart = function () {
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

  LogViewer.prototype.jumpToEnd = function () {
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

  LogViewer.prototype.loadEarlier = function () {
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

  LogViewer.prototype.loadLater = function () {
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

  // search: the server searches the whole log; a match is shown with the lines around it

  LogViewer.prototype.search = function (direction) {
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

  LogViewer.prototype.showMatch = function (m, query) {
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

  ns.logview = { AnsiRenderer: AnsiRenderer, viewers: function () { return viewers; }, stats: stats };
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
