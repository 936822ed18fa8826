// The report page's markup and script (diag/report.h); the data and
// Chart.js are inlined between them by report_html.
#include <algorithm>
#include <cctype>
#include <string>

#include "brigade/core/error.h"
#include "brigade/diag/report.h"

namespace brigade::diag {
namespace {

constexpr char kHead[] = R"html(<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Brigade run report</title>
<style>
body { font-family: system-ui, sans-serif; margin: 24px; color: #222; max-width: 1400px; }
h1 { font-size: 22px; margin-bottom: 4px; }
h2 { font-size: 18px; border-bottom: 1px solid #ddd; padding-bottom: 4px; margin-top: 28px; }
h3 { font-size: 14px; margin: 0 0 6px 0; }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(560px, 1fr)); gap: 18px; }
.chart { border: 1px solid #e4e4e4; border-radius: 6px; padding: 10px; }
.plot { position: relative; height: 280px; }
table { border-collapse: collapse; font-size: 13px; }
td, th { border: 1px solid #ddd; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f4f4f4; }
.kpi { display: inline-block; margin: 6px 24px 6px 0; }
.kpi b { display: block; font-size: 22px; }
pre { background: #f7f7f7; padding: 10px; font-size: 12px; overflow: auto; }
#brigade-errors:empty { display: none; }
#brigade-errors { color: #b00; border: 1px solid #b00; }
.muted { color: #777; }
</style>
<script>
// Script errors, listed on the page (and counted on <body>) for the reader and the tests.
window.brigadeErrors = [];
function brigadeError(message) {
  window.brigadeErrors.push(String(message));
  const list = document.getElementById('brigade-errors');
  if (list) list.textContent = window.brigadeErrors.join('\n');
}
window.addEventListener('error', e => brigadeError(e.message || 'error loading ' + e.target));
window.addEventListener('unhandledrejection', e => brigadeError(e.reason));
const brigadeConsoleError = console.error.bind(console);
console.error = (...args) => { brigadeError(args.join(' ')); brigadeConsoleError(...args); };
</script>
)html";

constexpr char kBody[] = R"html(</head><body>
<h1>Brigade run report</h1>
<div class="muted" id="run-dir"></div>
<pre id="brigade-errors"></pre>
<section><h2>Summary</h2><div id="summary"></div></section>
<section><h2>Training</h2><div class="grid" id="charts"></div></section>
<section><h2>Per rank</h2><div class="grid" id="rank-charts"></div>
<p class="muted" id="rank-none"></p></section>
<section><h2>Incidents</h2><div id="incidents"></div></section>
<section><h2>Stragglers</h2><div id="stragglers"></div></section>
<section><h2>Layout and config</h2><div id="mesh"></div><pre id="config"></pre></section>
)html";

constexpr char kMain[] = R"js(
(function () {
  const run = JSON.parse(document.getElementById('brigade-data').textContent);
  const palette = ['#1f77b4', '#d62728', '#2ca02c', '#ff7f0e', '#9467bd', '#8c564b', '#e377c2',
                   '#17becf', '#bcbd22', '#7f7f7f'];
  const el = (tag, text, cls) => {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  };
  const fixed = (v, digits) => (v === null || v === undefined) ? '-' : Number(v).toFixed(digits);
  const points = (xs, ys, scale) => {
    const out = [];
    for (let i = 0; i < xs.length; i++) {
      if (ys[i] !== null && ys[i] !== undefined) out.push({x: xs[i], y: ys[i] * (scale || 1)});
    }
    return out;
  };
  const rgba = (hex, alpha) => {
    const n = parseInt(hex.slice(1), 16);
    return 'rgba(' + (n >> 16) + ',' + ((n >> 8) & 255) + ',' + (n & 255) + ',' + alpha + ')';
  };
  // Pixels of the plot area in `hex` (any opacity): how much of a series got
  // drawn. Only the plot area: the legend shows each colour too.
  const seriesPixels = (c, hex) => {
    const n = parseInt(hex.slice(1), 16);
    const rgb = [n >> 16, (n >> 8) & 255, n & 255];
    const a = c.chartArea;
    const scale = c.currentDevicePixelRatio || 1;
    const data = c.ctx.getImageData(a.left * scale, a.top * scale, (a.right - a.left) * scale,
                                    (a.bottom - a.top) * scale).data;
    let count = 0;
    for (let i = 0; i < data.length; i += 4) {
      if (data[i + 3] > 0 && Math.abs(data[i] - rgb[0]) <= 12 &&
          Math.abs(data[i + 1] - rgb[1]) <= 12 && Math.abs(data[i + 2] - rgb[2]) <= 12) count++;
    }
    return count;
  };
  const line = (label, data, colour, extra) => Object.assign({
    label: label, data: data, borderColor: colour, backgroundColor: rgba(colour, 0.25),
    borderWidth: 2, pointRadius: data.length > 60 ? 0 : 2, tension: 0,
  }, extra || {});
  const axes = (yTitle, extra) => Object.assign({
    x: {type: 'linear', title: {display: true, text: 'step'}},
    y: {title: {display: true, text: yTitle}},
  }, extra || {});
  let charts = 0;
  function chart(parent, id, title, datasets, scales, extraOptions) {
    const box = el('div', null, 'chart');
    box.appendChild(el('h3', title));
    const plot = el('div', null, 'plot');
    const canvas = el('canvas');
    canvas.id = 'chart-' + id;
    plot.appendChild(canvas);
    box.appendChild(plot);
    document.getElementById(parent).appendChild(box);
    const c = new Chart(canvas, {
      type: 'line',
      data: {datasets: datasets},
      options: Object.assign({
        animation: false, responsive: true, maintainAspectRatio: false, parsing: false,
        interaction: {mode: 'nearest', intersect: false}, scales: scales,
        plugins: {legend: {display: datasets.length > 1}},
      }, extraOptions || {}),
    });
    c.draw();
    canvas.dataset.seriesPixels = seriesPixels(c, datasets[0].borderColor);
    canvas.classList.add('brigade-chart');
    charts++;
  }

  document.getElementById('run-dir').textContent =
      run.run_dir + ' - ' + run.step_count + ' steps recorded, last step ' + run.last_step;
  const s = run.steps;

  // Summary figures.
  const summary = document.getElementById('summary');
  const kpi = (label, value) => {
    const k = el('span', null, 'kpi');
    k.appendChild(el('b', value));
    k.appendChild(document.createTextNode(label));
    summary.appendChild(k);
  };
  const last = arr => { for (let i = arr.length - 1; i >= 0; i--) if (arr[i] !== null) return arr[i]; return null; };
  kpi('last step', run.last_step);
  kpi('final training loss', fixed(last(s.loss), 4));
  if (run.validation.val_loss.length) kpi('final validation loss', fixed(last(run.validation.val_loss), 4));
  kpi('tokens/s (last)', fixed(last(s.tokens_per_s), 0));
  if (last(s.mfu) !== null) kpi('MFU (last)', fixed(100 * last(s.mfu), 1) + ' %');
  kpi('incidents', run.incidents.length);
  kpi('straggler episodes', run.stragglers.filter(e => e.kind === 'straggler').length);
  if (run.rejoins.length) kpi('rejoins', run.rejoins.length);
  if (run.summary) {
    kpi('ETTR', fixed(100 * run.summary.ettr, 1) + ' %');
    kpi('restarts', run.summary.restarts);
    kpi('wall time', fixed(run.summary.wall_s, 1) + ' s');
    kpi('lost to failures', fixed(run.summary.lost_s, 1) + ' s');
  }

  // The charts of the whole job.
  const loss = [line('training loss', points(s.step, s.loss), palette[0])];
  if (run.validation.val_loss.length) {
    loss.push(line('validation loss', points(run.validation.step, run.validation.val_loss),
                   palette[1], {pointRadius: 3}));
  }
  chart('charts', 'loss', 'Loss', loss, axes('loss'));
  chart('charts', 'throughput', 'Throughput and MFU', [
    line('tokens/s', points(s.step, s.tokens_per_s), palette[2], {yAxisID: 'y'}),
    line('MFU %', points(s.step, s.mfu, 100), palette[3], {yAxisID: 'y1'}),
  ], axes('tokens/s', {y1: {position: 'right', title: {display: true, text: 'MFU %'},
                            grid: {drawOnChartArea: false}}}));
  const other = s.step_ms.map((t, i) => (t === null || s.compute_ms[i] === null) ? null :
      Math.max(0, t - s.compute_ms[i] - (s.exposed_comm_ms[i] || 0)));
  chart('charts', 'breakdown', 'Step time: where it went (rank 0)', [
    line('compute', points(s.step, s.compute_ms), palette[4], {fill: 'origin'}),
    line('exposed communication', points(s.step, s.exposed_comm_ms), palette[5], {fill: '-1'}),
    line('other (data, checkpoint stalls, idle)', points(s.step, other), palette[6], {fill: '-1'}),
  ], axes('ms', {y: {stacked: true, title: {display: true, text: 'ms'}}}));
  chart('charts', 'grad-norm', 'Gradient norm (before clipping) and learning rate', [
    line('grad norm', points(s.step, s.grad_norm), palette[7], {yAxisID: 'y'}),
    line('lr', points(s.step, s.lr), palette[8], {yAxisID: 'y1'}),
  ], axes('grad norm', {y1: {position: 'right', title: {display: true, text: 'lr'},
                              grid: {drawOnChartArea: false}}}));

  // Every per-rank series metrics.jsonl has.
  const rankKeys = Object.keys(run.per_rank);
  if (!rankKeys.length) {
    document.getElementById('rank-none').textContent = 'metrics.jsonl has no per-rank series ' +
        '(a run on one process, or before per-rank metrics).';
  }
  for (const key of rankKeys) {
    const series = run.per_rank[key];
    const bytes = key.includes('bytes');
    const name = key.replace(/_per_rank$/, '').replace(/_/g, ' ');
    chart('rank-charts', key, name + (bytes ? ' (MB)' : '') + ' per rank',
          series.ranks.map((values, r) => line('rank ' + r, points(series.step, values,
                                                bytes ? 1e-6 : 1), palette[r % palette.length])),
          axes(bytes ? 'MB' : name), {plugins: {legend: {display: true}}});
  }

  // Incidents: what failed, how long detection and recovery took.
  const incidents = document.getElementById('incidents');
  if (!run.incidents.length) {
    incidents.appendChild(el('p', 'No incidents.', 'muted'));
  } else {
    const table = el('table');
    table.id = 'incident-table';
    const cols = [['#', i => i.number], ['kind', i => i.kind], ['rank', i => i.rank],
                  ['generation', i => i.generation], ['what', i => i.what],
                  ['injected', i => i.injected ? 'yes' : 'no'],
                  ['detected after (ms)', i => fixed(i.detected_after_ms, 0)],
                  ['recovered after (ms)', i => fixed(i.recovered_after_ms, 0)],
                  ['last step', i => i.last_step], ['resumed from step', i => i.resumed_from_step],
                  ['steps lost', i => i.steps_lost]];
    const head = el('tr');
    for (const [title] of cols) head.appendChild(el('th', title));
    table.appendChild(head);
    run.incidents.forEach((incident, n) => {
      const row = el('tr');
      row.className = 'incident';
      for (const [, get] of cols) {
        const v = get(incident, n);
        row.appendChild(el('td', v === null || v === undefined ? '-' : v));
      }
      table.appendChild(row);
    });
    incidents.appendChild(table);
  }
  // Nodes that joined (the job grew back): pauses, no failures.
  if (run.rejoins.length) {
    const list = el('ul');
    list.id = 'rejoin-list';
    for (const e of run.rejoins) list.appendChild(el('li', e.what));
    incidents.appendChild(list);
  }
  // Slow ranks named and recovered (no restart): their own list.
  const stragglers = document.getElementById('stragglers');
  if (!run.stragglers.length) {
    stragglers.appendChild(el('p', 'No straggler named.', 'muted'));
  } else {
    const list = el('ul');
    list.id = 'straggler-list';
    for (const e of run.stragglers) list.appendChild(el('li', e.what));
    stragglers.appendChild(list);
  }
  if (run.summary) {
    incidents.appendChild(el('p', 'ETTR ' + fixed(100 * run.summary.ettr, 1) + ' %: ' +
        fixed(run.summary.productive_s, 1) + ' s of kept training time of ' +
        fixed(run.summary.wall_s, 1) + ' s wall time; ' + fixed(run.summary.lost_s, 1) +
        ' s lost to failures (detection, restart, redone steps).'));
  }

  // Layout and config.
  const mesh = document.getElementById('mesh');
  if (run.mesh) {
    const t = el('table');
    t.id = 'mesh-table';
    for (const k of ['world_size', 'dp', 'tp', 'pp', 'zero', 'backend']) {
      const row = el('tr');
      row.appendChild(el('th', k));
      row.appendChild(el('td', run.mesh[k]));
      t.appendChild(row);
    }
    mesh.appendChild(t);
  }
  if (run.config_files.length > 1) {
    mesh.appendChild(el('p', 'configs: ' + run.config_files.join(', ') + ' (config.toml below)',
                        'muted'));
  }
  document.getElementById('config').textContent = run.config === null ? '(no config.toml)' :
                                                                          run.config;
  document.body.dataset.charts = charts;
  document.body.dataset.ready = 'yes';
})();
)js";

}  // namespace

std::string report_html(const nlohmann::json& run, const std::string& chart_js) {
  std::string lower = chart_js;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lower.find("</script") != std::string::npos) {
    throw_error("the Chart.js file contains \"</script\" and cannot be inlined into the page");
  }
  std::string html = kHead;
  html += "<script>\n";
  html += chart_js;
  html += "\n</script>\n";
  html += kBody;
  html += "<script type=\"application/json\" id=\"brigade-data\">";
  html += json_for_script(run);
  html += "</script>\n<script>";
  html += kMain;
  html += "</script>\n</body></html>\n";
  return html;
}

}  // namespace brigade::diag
