// Draws the backend page's charts with the vendored uPlot, from the JSON the page embeds
// (<script type="application/json" id="chart-data">: the same rows as /api/backends/{name}).
(function () {
  "use strict";
  function draw() {
    var holder = document.getElementById("chart-data");
    if (!holder || typeof uPlot === "undefined") return;
    var rows = JSON.parse(holder.textContent || "[]");
    var xs = [], rate = [], queue = [], exec = [];
    rows.forEach(function (r) {
      xs.push(Date.parse(r.dispatched_at) / 1000);
      rate.push(r.pass_rate === null ? null : Math.round(r.pass_rate * 1000) / 10);
      queue.push(r.queue_seconds === null ? null : r.queue_seconds / 60);
      exec.push(r.execution_seconds === null ? null : r.execution_seconds / 60);
    });
    var base = { width: 560, height: 260, legend: { show: true } };
    var pass = document.getElementById("chart-pass-rate");
    var times = document.getElementById("chart-times");
    if (pass) {
      new uPlot(Object.assign({}, base, {
        scales: { y: { range: [0, 100] } },
        series: [{}, { label: "pass rate %", stroke: "#1a7f37", width: 2, points: { show: true } }],
      }), [xs, rate], pass);
    }
    if (times) {
      new uPlot(Object.assign({}, base, {
        series: [{}, { label: "queue min", stroke: "#0969da", width: 2, points: { show: true } },
                     { label: "execution min", stroke: "#9a6700", width: 2, points: { show: true } }],
      }), [xs, queue, exec], times);
    }
    document.body.setAttribute("data-charts", "drawn");
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", draw); else draw();
})();
