// The longest each kind of work of the log viewer took (ms): the log-rate benchmark prints them
// (window.jobsite.logview.stats).

export var stats = { message: 0, render: 0 };
export function note(kind, ms) { if (ms > stats[kind]) stats[kind] = ms; }
