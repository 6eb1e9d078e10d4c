// ANSI colours of log text: SGR codes become spans with classes; every other escape sequence is dropped.

import { el } from "./text.js";

export function AnsiRenderer() {
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
