// The socket of a job's logs (ws/jobs/<id>/logs/): one per job, shared by its viewers, reconnecting with backoff;
// it hands each message to the viewer of its attempt and rank.

import { note } from "./stats.js";

export function LogSocket(jobId) {
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
