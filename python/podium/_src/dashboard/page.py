"""The dashboard's page: one HTML document whose script polls ``/api/state`` (state.py) every
second and redraws its tables. No external resources: it works on a machine with no network."""

PAGE = r"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>podium dashboard</title>
<style>
  body { font-family: system-ui, sans-serif; margin: 1.2em; color: #222; background: #fafafa; }
  h1 { font-size: 1.4em; margin: 0 0 .2em 0; }
  h2 { font-size: 1.1em; margin: 1.2em 0 .4em 0; border-bottom: 1px solid #ccc; }
  table { border-collapse: collapse; font-size: .9em; margin-bottom: .6em; }
  th, td { border: 1px solid #ddd; padding: 2px 8px; text-align: left; vertical-align: top; }
  th { background: #eee; }
  .meta { color: #666; font-size: .9em; }
  .ok { background: #d8f5d8; } .failed, .exited { background: #f8d0d0; }
  .stopped { background: #e4e4e4; } .debugger { background: #fff2b3; }
  .ranks span { display: inline-block; min-width: 1.6em; margin: 1px; padding: 1px 3px;
                border-radius: 3px; text-align: center; font-size: .85em; }
  pre { margin: 0; white-space: pre-wrap; font-size: .85em; max-width: 70em; }
  .empty { color: #888; font-style: italic; }
  #error { color: #b00; }
</style>
</head>
<body>
<h1>podium dashboard</h1>
<div class="meta">controller <span id="controller">-</span> &middot; updated
  <span id="updated">never</span> <span id="error"></span></div>
<h2>Hosts</h2><div id="hosts"></div>
<h2>Proc meshes</h2><div id="proc-meshes"></div>
<h2>Actor meshes</h2><div id="actor-meshes"></div>
<h2>Stopped in the debugger</h2><div id="stopped"></div>
<h2>Recent failures</h2><div id="failures"></div>
<script>
"use strict";
const api = "/api/state";
function esc(v) {
  return String(v).replace(/[&<>"]/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;",
                                            '"': "&quot;"}[c]));
}
function extent(e) {
  return "{" + Object.entries(e).map(([k, v]) => esc(k) + ": " + v).join(", ") + "}";
}
function table(cols, rows, id) {
  if (!rows.length) return '<div class="empty">none</div>';
  return '<table' + (id ? ' id="' + id + '"' : '') + '><tr>' +
    cols.map(c => "<th>" + esc(c) + "</th>").join("") + "</tr>" +
    rows.map(r => "<tr" + (r.cls ? ' class="' + r.cls + '"' : "") + ">" +
      r.cells.map(c => "<td>" + c + "</td>").join("") + "</tr>").join("") + "</table>";
}
function chips(list, label) {
  return '<div class="ranks">' + list.map(x => '<span class="' + esc(x.health) +
    '" title="' + esc(label(x)) + '">' + x.rank + "</span>").join("") + "</div>";
}
function draw(s) {
  document.getElementById("controller").textContent =
    s.controller.host + " pid " + s.controller.pid +
    (s.controller.debug_server ? " (debug address " + s.controller.debug_server + ")" : "");
  document.getElementById("updated").textContent = new Date(s.time * 1000).toLocaleTimeString();
  document.getElementById("hosts").innerHTML = table(["host", "procs", "alive"],
    s.hosts.map(h => ({cls: h.alive < h.procs ? "failed" : "ok",
                       cells: [esc(h.host), h.procs, h.alive]})));
  document.getElementById("proc-meshes").innerHTML = table(
    ["mesh", "extent", "state", "procs (rank: health)", "exits"],
    s.proc_meshes.map(p => p.error ? {cls: "failed", cells: [p.id, "", esc(p.error), "", ""]} : {
      cls: p.stopped ? "stopped" : "",
      cells: ["proc mesh " + p.id, extent(p.extent), p.stopped ? "stopped" : "running",
              chips(p.procs, x => extent(x.coords) + " " + x.host + " pid " + x.pid),
              p.procs.filter(x => x.exit).map(x => "rank " + x.rank + " pid " + x.pid +
                  ": " + esc(x.exit)).join("<br>")]}), "proc-mesh-table");
  document.getElementById("actor-meshes").innerHTML = table(
    ["actor mesh", "class", "extent", "procs", "messages sent", "msgs/s", "in-flight calls",
     "ranks (health)"],
    s.actor_meshes.map(a => a.error ? {cls: "failed", cells: [esc(a.name), esc(a.error)]} : {
      cells: [esc(a.name), esc(a.class), extent(a.extent),
              a.proc_mesh === null ? "-" : "proc mesh " + a.proc_mesh, a.sent,
              a.rate === null || a.rate === undefined ? "-" : a.rate.toFixed(1),
              a.in_flight, chips(a.ranks, x => a.name + " rank " + x.rank + " " + x.point +
                  " on " + x.host + " pid " + x.pid + ": " + x.health + ", " + x.in_flight +
                  " call(s) in flight")]}), "actor-mesh-table");
  document.getElementById("stopped").innerHTML = table(
    ["actor", "rank", "coords", "host", "function", "line"],
    s.stopped.map(d => ({cls: "debugger", cells: [esc(d.actor), d.rank, extent(d.coords),
                         esc(d.host), esc(d.function || "-"), d.line === null ? "-" : d.line]})),
    "stopped-table");
  document.getElementById("failures").innerHTML = table(
    ["time", "mesh", "rank", "host", "pid", "kind", "report"],
    s.failures.map(f => ({cls: "failed", cells: [
      new Date(f.time * 1000).toLocaleTimeString(), esc(f.mesh), f.rank + " " + esc(f.point),
      esc(f.host), f.pid, esc(f.kind) + (f.signal ? " (" + esc(f.signal) + ")" : ""),
      "<pre>" + esc(f.report) + "</pre>"]})), "failure-table");
  document.body.dataset.snapshots = String(Number(document.body.dataset.snapshots || 0) + 1);
}
async function poll() {
  try {
    const r = await fetch(api, {cache: "no-store"});
    if (!r.ok) throw new Error(r.status + " " + (await r.text()));
    draw(await r.json());
    document.getElementById("error").textContent = "";
  } catch (e) {
    document.getElementById("error").textContent = "(" + e + ")";
  }
  setTimeout(poll, 1000);
}
poll();
</script>
</body>
</html>
"""
