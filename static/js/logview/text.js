// Text helpers of the log viewer: elements that hold text only (never HTML), sizes in words, UTF-8 lengths and
// decoding, and a text's whole lines taken a piece at a time.

export var LINES_PER_PIECE = 200;  // one element, rendered in one step

export function el(tag, className, text) {
  var node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

export function formatBytes(n) {
  var units = [["GiB", 1 << 30], ["MiB", 1 << 20], ["KiB", 1 << 10]];
  for (var i = 0; i < units.length; i++) {
    if (n >= units[i][1]) return (n / units[i][1]).toPrecision(3).replace(/\.?0+$/, "") + " " + units[i][0];
  }
  return n + " B";
}

var encoder = new TextEncoder();
export var decoder = new TextDecoder("utf-8");

export function byteLength(text) {  // in UTF-8
  return /[^\x00-\x7f]/.test(text) ? encoder.encode(text).length : text.length;
}

// Up to LINES_PER_PIECE lines of ``text`` from index ``from``: [the index they end at, how many].
export function takeLines(text, from) {
  var cut = from, n = 0;
  for (; n < LINES_PER_PIECE && cut < text.length; n++) {
    var nl = text.indexOf("\n", cut);
    cut = nl < 0 ? text.length : nl + 1;
  }
  return [cut, n];
}
