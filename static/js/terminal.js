// The Terminal section of a running job's page: xterm.js (@xterm/xterm, served from node_modules) on the exec
// WebSocket /ws/jobs/<id>/exec/?tty=1 (binary frames, a channel byte first: 0 stdin, 1 stdout, 2 stderr,
// 3 status, 4 resize). The session's cookie authenticates it, as for every page.
const STDIN = 0, STDOUT = 1, STDERR = 2, STATUS = 3, RESIZE = 4;

function frame(channel, bytes) {
  const out = new Uint8Array(bytes.length + 1);
  out[0] = channel;
  out.set(bytes, 1);
  return out;
}

function open(section) {
  const box = section.querySelector("[data-terminal]");
  const button = section.querySelector("[data-terminal-open]");
  const state = section.querySelector("[data-terminal-state]");
  const encoder = new TextEncoder();
  const term = new window.Terminal({ cursorBlink: true, convertEol: false, fontSize: 14, scrollback: 5000 });
  const fit = new window.FitAddon.FitAddon();
  term.loadAddon(fit);
  box.hidden = false;
  button.hidden = true;
  term.open(box);
  fit.fit();
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const query = new URLSearchParams({ tty: "1", rows: term.rows, cols: term.cols, rank: section.dataset.rank || "0" });
  const ws = new WebSocket(`${scheme}://${location.host}/ws/jobs/${section.dataset.job}/exec/?${query}`);
  ws.binaryType = "arraybuffer";
  state.textContent = "Connecting…";
  ws.onopen = () => { state.textContent = "Connected"; term.focus(); };
  ws.onmessage = (event) => {
    const data = new Uint8Array(event.data);
    if (data[0] === STDOUT || data[0] === STDERR) {
      term.write(data.subarray(1));
    } else if (data[0] === STATUS) {
      const status = JSON.parse(new TextDecoder().decode(data.subarray(1)));
      state.textContent = status.status === "Success" ? "Session ended" : `Session ended: ${status.message}`;
    }
  };
  ws.onclose = () => {
    if (state.textContent === "Connected" || state.textContent === "Connecting…") state.textContent = "Disconnected";
    button.hidden = false;
    button.textContent = "Reconnect";
  };
  term.onData((text) => { if (ws.readyState === WebSocket.OPEN) ws.send(frame(STDIN, encoder.encode(text))); });
  term.onResize(({ cols, rows }) => {
    if (ws.readyState === WebSocket.OPEN) {
      ws.send(frame(RESIZE, encoder.encode(JSON.stringify({ Width: cols, Height: rows }))));
    }
  });
  const refit = () => fit.fit();
  window.addEventListener("resize", refit);
  button.onclick = () => {
    window.removeEventListener("resize", refit);
    term.dispose();
    box.replaceChildren();
    open(section);
  };
}

for (const section of document.querySelectorAll("[data-terminal-section]")) {
  section.querySelector("[data-terminal-open]").addEventListener("click", () => open(section), { once: true });
}
