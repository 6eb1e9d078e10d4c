// jobsite: small progressive enhancements; every page works without them.
//
// Live pages listen on WebSockets (jobs/consumers.py) and change in place: the job list's rows, the job detail
// (status, events, attempts, logs in follow mode), a group's queue and the utilisation page. Text from the
// server (statuses, messages, logs) is only ever set with textContent; HTML comes only from our own partials.
(function () {
  "use strict";

  var live = (window.jobsite = window.jobsite || { received: 0, opened: 0, closed: 0 });

  // <form data-confirm="Question?">: ask before submitting (e.g. cancelling a job).
  document.addEventListener("submit", function (event) {
    var form = event.target;
    var question = form.getAttribute && form.getAttribute("data-confirm");
    if (question && !window.confirm(question)) {
      event.preventDefault();
    }
  });

  // --- helpers ---------------------------------------------------------------------------------------------

  function debounce(fn, ms) {
    var timer = null;
    return function () {
      if (timer) clearTimeout(timer);
      timer = setTimeout(function () { timer = null; fn(); }, ms);
    };
  }

  function el(tag, className, text) {
    var node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function parseHTML(html) {
    var template = document.createElement("template");
    template.innerHTML = html;  // our own server-rendered, escaped partials only
    return template.content;
  }

  function fetchPartial(url) {
    return fetch(url, {
      credentials: "same-origin",
      headers: { "HX-Request": "true", "X-Requested-With": "XMLHttpRequest" },
    }).then(function (response) {
      if (!response.ok) throw new Error(response.status + " " + url);
      return response.text();
    });
  }

  function time(iso) {
    var t = iso ? Date.parse(iso) : NaN;
    return isNaN(t) ? null : t;
  }

  // --- durations (as jobs/templatetags/jobsite.py::_human_seconds) ----------------------------------------

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

  function renderDuration(cell) {
    var start = time(cell.getAttribute("data-start"));
    if (start === null) { cell.textContent = "—"; return; }
    var end = time(cell.getAttribute("data-end"));
    if (end !== null && end < start) end = null;
    cell.textContent = humanSeconds(((end === null ? Date.now() : end) - start) / 1000);
  }

  setInterval(function () {
    var cells = document.querySelectorAll(".duration[data-start]");
    for (var i = 0; i < cells.length; i++) {
      if (cells[i].getAttribute("data-start") && !cells[i].getAttribute("data-end")) renderDuration(cells[i]);
    }
  }, 1000);

  // --- the socket: reconnects with backoff, tells the page when it (re)opens --------------------------------

  var statusBadge = document.getElementById("live-status");

  function showStatus(state, text) {
    if (!statusBadge) return;
    statusBadge.hidden = false;
    statusBadge.className = "live-status live-" + state;
    statusBadge.textContent = text;
    statusBadge.title = state === "on" ? "Updates arrive as they happen" : "Not receiving updates right now";
  }

  function LiveSocket(path, handlers) {
    this.path = path;
    this.handlers = handlers;
    this.attempts = 0;
    this.everOpened = false;
    this.ws = null;
    this.stopped = false;
    this.connect();
  }

  LiveSocket.prototype.connect = function () {
    var self = this;
    var scheme = location.protocol === "https:" ? "wss://" : "ws://";
    var ws;
    try {
      ws = new WebSocket(scheme + location.host + this.path);
    } catch (e) {
      this.retry();
      return;
    }
    this.ws = ws;
    ws.onopen = function () {
      var first = !self.everOpened;
      self.everOpened = true;
      self.attempts = 0;
      live.opened += 1;
      showStatus("on", "Live");
      if (self.handlers.open) self.handlers.open(first);
    };
    ws.onmessage = function (event) {
      var message;
      try { message = JSON.parse(event.data); } catch (e) { return; }
      live.received += 1;
      if (self.handlers.message) self.handlers.message(message);
    };
    ws.onclose = function (event) {
      live.closed += 1;
      self.ws = null;
      if (self.stopped) return;
      if (event.code === 4401 || event.code === 4403) {
        showStatus("off", "Not live: log in again");
        return;
      }
      self.retry();
    };
  };

  LiveSocket.prototype.retry = function () {
    var self = this;
    // 1 s, 2 s, 4 s … up to 30 s, with jitter so a restarted server is not hit by every browser at once.
    var delay = Math.min(30000, 1000 * Math.pow(2, this.attempts)) * (0.75 + Math.random() * 0.5);
    this.attempts += 1;
    showStatus("off", "Reconnecting…");
    setTimeout(function () { self.connect(); }, delay);
  };

  LiveSocket.prototype.send = function (message) {
    if (this.ws && this.ws.readyState === WebSocket.OPEN) {
      this.ws.send(JSON.stringify(message));
      return true;
    }
    return false;
  };

  // --- status badges --------------------------------------------------------------------------------------

  var COLOR_NAMES = ["green", "orange", "blue", "grey", "red", "lightgrey"];

  function applyBadge(badge, m) {
    var name = COLOR_NAMES.indexOf(m.color_name) >= 0 ? m.color_name : "grey";
    badge.className = "badge badge-" + name;
    badge.setAttribute("data-color", m.color);
    badge.title = "Phase: " + m.phase_label;
    badge.textContent = m.status;
  }

  function truncate(text, length) {
    return text.length > length ? text.slice(0, length - 1) + "…" : text;
  }

  function overQuotaMark() {
    var mark = el("span", "over-quota", "over quota");
    mark.title = "Runs beyond its group's quota on idle resources: the first to be preempted";
    return mark;
  }

  function isNewer(m, node) {
    var shown = time(node.getAttribute("data-updated"));
    var incoming = time(m.updated_at);
    return shown === null || incoming === null || incoming >= shown;
  }

  // --- the job list ---------------------------------------------------------------------------------------

  function JobList(root) {
    this.root = root;
    this.tbody = root.querySelector("#job-rows");
    this.latest = {};  // job id -> newest message seen
    this.pending = {};  // ids of new jobs to fetch rows for
    this.page = parseInt(root.getAttribute("data-page"), 10) || 1;
    this.pageSize = parseInt(root.getAttribute("data-page-size"), 10) || 50;
    var filters = document.getElementById("live-filters");
    this.filters = filters ? JSON.parse(filters.textContent) : {};
    var self = this;
    this.fetchNew = debounce(function () { self.loadNewRows(); }, 60);
    this.socket = new LiveSocket("/ws/jobs/", {
      open: function () { self.catchUp(); },
      message: function (m) { if (m.type === "job.updated") self.onJob(m); },
    });
  }

  JobList.prototype.matches = function (m) {
    var f = this.filters;
    if (f.group && f.group !== m.group) return false;
    if (f.user && f.user !== m.user) return false;
    if (f.phase && f.phase.length && f.phase.indexOf(m.phase) < 0) return false;
    return true;
  };

  JobList.prototype.row = function (id) {
    return this.tbody.querySelector('tr[data-job="' + Number(id) + '"]');
  };

  JobList.prototype.onJob = function (m) {
    var known = this.latest[m.id];
    if (!known || time(m.updated_at) === null || time(m.updated_at) >= time(known.updated_at)) this.latest[m.id] = m;
    var row = this.row(m.id);
    if (row) {
      if (isNewer(m, row)) this.applyRow(row, m);
    } else if (this.page === 1 && this.matches(m)) {
      var first = this.tbody.querySelector("tr[data-job]");
      if (!first || m.id > Number(first.getAttribute("data-job"))) {
        this.pending[m.id] = true;
        this.fetchNew();
      }
    }
  };

  JobList.prototype.applyRow = function (row, m) {
    var badge = row.querySelector(".status .badge");
    if (badge) applyBadge(badge, m);
    var status = row.querySelector("td.status");
    var mark = status && status.querySelector(".over-quota");
    if (m.over_quota && !mark && status) status.appendChild(overQuotaMark());
    if (!m.over_quota && mark) mark.remove();
    var reason = row.querySelector("td.reason");
    if (reason) {
      reason.textContent = "";
      if (m.reason) reason.appendChild(el("span", "reason-code", m.reason));
      if (m.message) {
        if (m.reason) reason.appendChild(document.createTextNode(" "));
        var message = el("span", "muted reason-message", truncate(m.message, 80));
        message.title = m.message;
        reason.appendChild(message);
      }
    }
    var queue = row.querySelector("td.queue");
    if (queue) {
      queue.textContent = m.phase === "PENDING" && m.queue_position ? "#" + m.queue_position + " in " + m.group : "";
      if (queue.textContent && m.estimate) {
        queue.appendChild(document.createTextNode(" · "));
        queue.appendChild(el("span", "estimate", m.estimate));
      }
    }
    var duration = row.querySelector("td.duration");
    if (duration) {
      duration.setAttribute("data-start", m.admitted_at || m.started_at || "");
      duration.setAttribute("data-end", m.finished_at || "");
      renderDuration(duration);
    }
    row.setAttribute("data-updated", m.updated_at || "");
    row.classList.remove("row-flash");
    void row.offsetWidth;  // restart the highlight animation
    row.classList.add("row-flash");
  };

  JobList.prototype.reapply = function () {
    var rows = this.tbody.querySelectorAll("tr[data-job]");
    for (var i = 0; i < rows.length; i++) {
      var m = this.latest[rows[i].getAttribute("data-job")];
      if (m && time(m.updated_at) !== null && time(m.updated_at) > (time(rows[i].getAttribute("data-updated")) || 0)) {
        this.applyRow(rows[i], m);
      }
    }
  };

  JobList.prototype.loadNewRows = function () {
    var self = this;
    var ids = Object.keys(this.pending);
    this.pending = {};
    if (!ids.length) return;
    // The server applies the list's filters (all of them, also those this page cannot check) to the new ids.
    var params = new URLSearchParams(location.search);
    params.delete("page");
    params.set("ids", ids.join(","));
    var url = this.root.getAttribute("data-rows-url") + "?" + params.toString();
    fetchPartial(url).then(function (html) {
      var rows = Array.prototype.slice.call(parseHTML(html).querySelectorAll("tr[data-job]"));
      rows.sort(function (a, b) { return Number(b.getAttribute("data-job")) - Number(a.getAttribute("data-job")); });
      var added = 0;
      for (var i = rows.length - 1; i >= 0; i--) {
        if (self.row(rows[i].getAttribute("data-job"))) continue;
        self.tbody.insertBefore(rows[i], self.tbody.firstChild);
        rows[i].classList.add("row-new");
        added += 1;
      }
      while (self.tbody.querySelectorAll("tr[data-job]").length > self.pageSize) {
        self.tbody.removeChild(self.tbody.querySelector("tr[data-job]:last-of-type"));
      }
      self.countAdded(added);
      self.reapply();
    }).catch(function () { /* the next reconnect catches up */ });
  };

  JobList.prototype.countAdded = function (added) {
    if (!added) return;
    var wrap = this.root.querySelector(".table-wrap");
    if (wrap) wrap.hidden = false;
    var empty = this.root.querySelector("[data-empty]");
    if (empty) empty.hidden = true;
    var total = this.root.querySelector("[data-total]");
    if (total) total.textContent = String(Number(total.textContent) + added);
    var noun = this.root.querySelector("[data-noun]");
    if (noun && total) noun.textContent = Number(total.textContent) === 1 ? "job" : "jobs";
    var range = this.root.querySelector("[data-range]");
    if (range) range.textContent = "1–" + this.tbody.querySelectorAll("tr[data-job]").length;
  };

  JobList.prototype.catchUp = function () {
    // Whatever changed while the socket was down (or before it first opened): this page's rows, once.
    var self = this;
    var url = this.root.getAttribute("data-rows-url") + location.search;
    fetchPartial(url).then(function (html) {
      var fresh = parseHTML(html);
      var before = self.tbody.querySelectorAll("tr[data-job]").length;
      self.tbody.textContent = "";
      self.tbody.appendChild(fresh);
      self.countAdded(Math.max(0, self.tbody.querySelectorAll("tr[data-job]").length - before));
      self.reapply();
    }).catch(function () { /* keep what is shown */ });
  };

  // --- ANSI colours in logs: SGR codes become spans with classes; everything else is dropped ---------------

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

  // Escape sequences: CSI (ESC [ … final), OSC (ESC ] … BEL or ESC \), two-byte ESC x. A sequence cut at the end
  // of a piece waits for the next piece.
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

  // --- the log viewer of one replica ----------------------------------------------------------------------

  var LOG_DOM_MAX_CHARS = 4 * 1024 * 1024;  // beyond this the oldest pieces leave the page ("load earlier")

  function formatBytes(n) {
    var units = [["GiB", 1 << 30], ["MiB", 1 << 20], ["KiB", 1 << 10]];
    for (var i = 0; i < units.length; i++) {
      if (n >= units[i][1]) return (n / units[i][1]).toPrecision(4).replace(/\.?0+$/, "") + " " + units[i][0];
    }
    return n + " B";
  }

  function LogViewer(root, detail) {
    this.root = root;
    this.detail = detail;
    this.attempt = Number(root.getAttribute("data-attempt"));
    this.rank = Number(root.getAttribute("data-rank"));
    this.start = Number(root.getAttribute("data-start")) || 0;
    this.end = Number(root.getAttribute("data-end")) || 0;
    this.size = Number(root.getAttribute("data-size")) || 0;
    this.pre = root.querySelector("pre.log-text");
    this.follow = root.querySelector("[data-log-follow]");
    this.earlier = root.querySelector("[data-log-earlier]");
    this.state = root.querySelector(".log-state");
    this.renderer = new AnsiRenderer();
    this.chars = 0;
    this.following = false;
    if (!this.pre) return;  // an older attempt linked only
    var toolbar = root.querySelector(".log-toolbar");
    if (toolbar) toolbar.hidden = false;
    // Re-render the server's text with colours (it is plain text in the page for browsers without JS).
    var initial = this.pre.textContent;
    this.pre.textContent = "";
    if (initial) this.addPiece(initial, this.start, this.end, false);
    var self = this;
    if (this.earlier) this.earlier.addEventListener("click", function () { self.loadEarlier(); });
    var endButton = root.querySelector("[data-log-end]");
    if (endButton) endButton.addEventListener("click", function () { self.jumpToEnd(); });
    if (this.follow) this.follow.addEventListener("change", function () { if (self.follow.checked) self.scrollToEnd(); });
    this.pre.addEventListener("scroll", function () {
      if (self.follow && self.follow.checked && !self.atEnd() && !self.scrolling) self.follow.checked = false;
    });
    root.addEventListener("toggle", function () { self.subscribe(); });
    if (this.follow && this.follow.checked) this.scrollToEnd();
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

  LogViewer.prototype.jumpToEnd = function () {
    if (this.follow) this.follow.checked = true;
    this.root.open = true;
    this.scrollToEnd();
    this.pre.focus({ preventScroll: true });
  };

  LogViewer.prototype.subscribe = function () {
    if (!this.pre) return;
    var wanted = this.root.open;
    if (wanted === this.following) return;
    var message = { type: wanted ? "log.follow" : "log.unfollow", attempt: this.attempt, rank: this.rank, offset: this.end };
    if (this.detail.socket.send(message)) this.following = wanted;
  };

  LogViewer.prototype.showText = function () {
    this.pre.hidden = false;
    var empty = this.root.querySelector(".log-empty");
    if (empty) empty.remove();
    var link = this.root.querySelector(".log-link");
    if (link) link.hidden = false;
  };

  LogViewer.prototype.updateSize = function () {
    var size = this.root.querySelector(".log-size");
    if (!size) return;
    size.textContent = "(" + formatBytes(this.size) + (this.start > 0 ? ", from byte " + this.start.toLocaleString() : "") + ")";
    if (this.earlier) this.earlier.hidden = this.start <= 0;
  };

  LogViewer.prototype.addPiece = function (text, start, end, prepend) {
    var piece = el("span", "log-piece");
    piece.setAttribute("data-start", start);
    piece.setAttribute("data-end", end);
    if (prepend) {
      piece.appendChild(new AnsiRenderer().render(text));
      this.pre.insertBefore(piece, this.pre.firstChild);
    } else {
      piece.appendChild(this.renderer.render(text));
      this.pre.appendChild(piece);
    }
    this.chars += text.length;
    this.showText();
  };

  LogViewer.prototype.trim = function () {
    while (this.chars > LOG_DOM_MAX_CHARS && this.pre.childNodes.length > 1) {
      var first = this.pre.firstChild;
      this.chars -= first.textContent.length;
      this.pre.removeChild(first);
      this.start = Number(this.pre.firstChild.getAttribute("data-start")) || this.start;
    }
  };

  LogViewer.prototype.append = function (m) {
    if (m.end <= this.end) return;  // already shown
    var follow = this.follow && this.follow.checked;
    this.addPiece(m.text, m.offset, m.end, false);
    this.end = m.end;
    this.size = Math.max(this.size, m.end);
    this.trim();
    this.updateSize();
    if (follow) this.scrollToEnd();
  };

  LogViewer.prototype.resetLog = function () {
    this.pre.textContent = "";
    this.renderer = new AnsiRenderer();
    this.start = 0; this.end = 0; this.chars = 0;
    this.updateSize();
  };

  LogViewer.prototype.loadEarlier = function () {
    var self = this;
    if (this.start <= 0 || this.loading) return;
    this.loading = true;
    this.earlier.disabled = true;
    var url = this.root.getAttribute("data-range-url") + "?end=" + this.start + "&bytes=" + 256 * 1024;
    fetch(url, { credentials: "same-origin" }).then(function (r) {
      if (!r.ok) throw new Error(String(r.status));
      return r.json();
    }).then(function (data) {
      var height = self.pre.scrollHeight, top = self.pre.scrollTop;
      if (data.text) self.addPiece(data.text, data.start, data.end, true);
      self.start = data.start;
      self.pre.scrollTop = top + (self.pre.scrollHeight - height);  // keep the lines in view where they were
      self.updateSize();
    }).catch(function () {
      if (self.state) self.state.textContent = "Could not load earlier lines.";
    }).then(function () {
      self.loading = false;
      self.earlier.disabled = false;
    });
  };

  // --- the job detail -------------------------------------------------------------------------------------

  function JobDetail(root) {
    this.root = root;
    this.jobId = Number(root.getAttribute("data-job"));
    this.viewers = {};
    var self = this;
    this.socket = new LiveSocket("/ws/jobs/" + this.jobId + "/", {
      open: function () { self.onOpen(); },
      message: function (m) { self.onMessage(m); },
    });
    this.initViewers();
    this.refresh = debounce(function () { self.loadLive(); }, 120);
    // "replica N" of the attempts table unfolds that replica's log before the page scrolls to it.
    root.addEventListener("click", function (event) {
      var link = event.target.closest ? event.target.closest("a[data-open-log]") : null;
      var target = link && document.getElementById(link.getAttribute("href").slice(1));
      if (target && target.tagName === "DETAILS") target.open = true;
    });
  }

  JobDetail.prototype.initViewers = function () {
    var nodes = this.root.querySelectorAll("details[data-log]");
    for (var i = 0; i < nodes.length; i++) {
      if (!this.viewers[nodes[i].id] && !nodes[i].hasAttribute("data-static")) {
        this.viewers[nodes[i].id] = new LogViewer(nodes[i], this);
      }
    }
  };

  JobDetail.prototype.lastEvent = function () {
    var rows = this.root.querySelectorAll("#events [data-event]");
    var last = 0;
    for (var i = 0; i < rows.length; i++) last = Math.max(last, Number(rows[i].getAttribute("data-event")));
    return last;
  };

  JobDetail.prototype.onOpen = function () {
    this.socket.send({ type: "events.since", after: this.lastEvent() });
    for (var id in this.viewers) {
      this.viewers[id].following = false;
      this.viewers[id].subscribe();
    }
    this.loadLive();  // what changed before the socket (re)opened
  };

  JobDetail.prototype.onMessage = function (m) {
    if (m.type === "job.updated" && m.id === this.jobId) {
      var badges = this.root.querySelectorAll("#job-head .badge, #status-card .badge");
      for (var i = 0; i < badges.length; i++) applyBadge(badges[i], m);
      this.refresh();
    } else if (m.type === "event.created") {
      this.addEvent(m);
    } else if (m.type === "log.appended" || m.type === "log.reset") {
      var viewer = this.viewers["log-" + Number(m.attempt) + "-" + Number(m.rank)];
      if (viewer) (m.type === "log.appended" ? viewer.append(m) : viewer.resetLog());
    }
  };

  JobDetail.prototype.addEvent = function (m) {
    var tbody = this.root.querySelector("#events tbody");
    if (!tbody || tbody.querySelector('[data-event="' + Number(m.id) + '"]')) return;
    var placeholder = tbody.querySelector("[data-no-events]");
    if (placeholder) placeholder.remove();
    var row = el("tr", m.event_type === "Warning" ? "warning row-new" : "row-new");
    var when = el("td", "time", m.time_display);
    when.setAttribute("data-event", m.id);
    row.appendChild(when);
    row.appendChild(el("td", "", m.event_type));
    row.appendChild(el("td", "", m.reason));
    row.appendChild(el("td", "num", m.attempt === null ? "" : m.attempt));
    row.appendChild(el("td", "message-text", m.message));
    tbody.appendChild(row);
  };

  JobDetail.prototype.loadLive = function () {
    var self = this;
    if (this.loading) { this.again = true; return; }
    this.loading = true;
    fetchPartial(this.root.getAttribute("data-live-url")).then(function (html) {
      var fresh = parseHTML(html);
      ["job-head", "status-card", "attempts-card"].forEach(function (id) {
        var current = document.getElementById(id), next = fresh.getElementById ? fresh.getElementById(id) : fresh.querySelector("#" + id);
        if (current && next) current.replaceWith(next);
      });
      var list = document.getElementById("logs-list");
      var incoming = fresh.querySelectorAll("details[data-log]");
      var added = false;
      for (var i = incoming.length - 1; i >= 0; i--) {
        var node = incoming[i];
        var shown = document.getElementById(node.id);
        if (shown) {
          self.markFailed(shown, node);
          continue;
        }
        var placeholder = list.querySelector("[data-no-logs]");
        if (placeholder) placeholder.remove();
        // The current attempt's logs unfold: all of them, or only its failed replica once one failed.
        node.open = node.hasAttribute("data-current") && node.hasAttribute("open");
        list.insertBefore(node, list.firstChild);
        added = true;
      }
      if (added) {
        self.initViewers();
        for (var id in self.viewers) self.viewers[id].subscribe();
      }
    }).catch(function () { /* the next update tries again */ }).then(function () {
      self.loading = false;
      if (self.again) { self.again = false; self.loadLive(); }
    });
  };

  // A replica shown already turned out to be the first that failed: mark it as the server does, and unfold it
  // (its log says why the attempt failed). Nothing else the reader unfolded is folded.
  JobDetail.prototype.markFailed = function (shown, fresh) {
    if (!fresh.hasAttribute("data-failed") || shown.hasAttribute("data-failed")) return;
    var mark = fresh.querySelector("summary .failed-mark");
    var summary = shown.querySelector("summary");
    if (mark && summary) {
      var size = summary.querySelector(".log-size");
      summary.insertBefore(mark, size);
      summary.insertBefore(document.createTextNode(" "), size);
    }
    shown.setAttribute("data-failed", "");
    shown.open = true;
  };

  // --- pages refreshed by partial: a group's queue, utilisation -------------------------------------------

  function RefreshedBlock(root, path, wants) {
    var target = root.getAttribute("data-target");
    var url = root.getAttribute("data-refresh-url");
    var loading = false, again = false;
    var load = function () {
      if (loading) { again = true; return; }
      loading = true;
      fetchPartial(url).then(function (html) {
        var fresh = parseHTML(html).querySelector(target);
        var current = root.querySelector(target);
        if (fresh && current) current.replaceWith(fresh);
      }).catch(function () {}).then(function () {
        loading = false;
        if (again) { again = false; load(); }
      });
    };
    var refresh = debounce(load, 300);
    new LiveSocket(path, {
      open: function () { refresh(); },  // catch up with what changed before the socket (re)opened
      message: function (m) { if (wants(m)) refresh(); },
    });
  }

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

  // --- start ----------------------------------------------------------------------------------------------

  function start() {
    var list = document.querySelector('[data-live="jobs"]');
    if (list) live.page = new JobList(list);
    var detail = document.querySelector('[data-live="job"]');
    if (detail) live.page = new JobDetail(detail);
    var queue = document.querySelector('[data-live="refresh"]');
    if (queue) {
      var group = queue.getAttribute("data-live-group");
      RefreshedBlock(queue, "/ws/jobs/", function (m) { return m.type === "job.updated" && m.group === group; });
    }
    var util = document.querySelector('[data-live="utilisation"]');
    if (util) RefreshedBlock(util, "/ws/utilisation/", function (m) { return m.type === "utilisation.changed"; });
    yamlUpload();
    live.ready = true;
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
  live.AnsiRenderer = AnsiRenderer;  // for tests
})();
