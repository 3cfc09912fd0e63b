// tkcc ui: live progress of running runs. Every element .progress[data-run-id] whose run is still
// "running" is refreshed from /api/runs/{id} every <body data-poll-ms> ms (the board is read-only;
// nothing is written). Text goes through textContent, never innerHTML.
(function () {
  "use strict";
  var pollMs = parseInt(document.body.getAttribute("data-poll-ms"), 10) || 2000;

  function speedup(s) { return (typeof s === "number" && isFinite(s)) ? s.toFixed(3) + "x" : "-"; }
  function duration(s) {
    if (typeof s !== "number" || s < 0) { return "-"; }
    s = Math.floor(s);
    var pad = function (n) { return (n < 10 ? "0" : "") + n; };
    return s >= 3600 ? Math.floor(s / 3600) + "h" + pad(Math.floor(s % 3600 / 60)) + "m"
                     : Math.floor(s / 60) + "m" + pad(s % 60) + "s";
  }
  function set(el, sel, text) { var n = el.querySelector(sel); if (n) { n.textContent = text; } }

  function update(el, p) {
    el.setAttribute("data-status", p.status);
    var st = el.querySelector(".p-status .status");
    if (st) { st.textContent = p.status; st.className = "status st-" + p.status; }
    set(el, ".p-phase", p.phase || "-");
    set(el, ".p-tried", String(p.tried));
    set(el, ".p-accepted", String(p.accepted));
    set(el, ".p-best", speedup(p.best_speedup));
    set(el, ".p-kept", p.kept === null || p.kept === undefined ? "-" : String(p.kept));
    set(el, ".p-plan", speedup(p.plan_speedup));
    set(el, ".p-restarts", String(p.restarts));
    set(el, ".p-elapsed", duration(p.elapsed_s));
    var bar = el.querySelector("progress.bar");
    if (bar) { bar.value = p.fraction || 0; }
  }

  function poll() {
    var live = document.querySelectorAll('.progress[data-run-id][data-status="running"]');
    if (!live.length) { return; }
    Array.prototype.forEach.call(live, function (el) {
      fetch("/api/runs/" + encodeURIComponent(el.getAttribute("data-run-id")), {cache: "no-store"})
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (p) { if (p) { update(el, p); } })
        .catch(function () { /* the server may be restarting; try again next tick */ });
    });
    window.setTimeout(poll, pollMs);
  }
  window.setTimeout(poll, pollMs);
})();
