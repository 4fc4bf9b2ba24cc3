/* prudent's report and dashboard: draws a page from its JSON (see render.py, pages.py).
 * Every string from the store reaches the page through textContent, or through plotText()
 * for Plotly (which reads a little HTML in labels): none is ever parsed as markup. */
(function () {
  'use strict';
  const SETTINGS = JSON.parse(document.getElementById('prudent-settings').textContent);
  const BLOB = document.getElementById('prudent-data').textContent;
  const APP = document.getElementById('app');
  const COLORS = {checkpoint: '#2ca02c', rule: '#d62728', restart: '#9467bd', preemption: '#ff7f0e',
    budget: '#8c564b', capture: '#e377c2', finding: '#17becf', stop: '#7f7f7f'};
  const LINE_EVENTS = new Set(['rule', 'restart', 'preemption', 'budget', 'stop']);
  const STATES = {complete: '#1f77b4', pruned: '#d62728', failed: '#7f7f7f', running: '#2ca02c'};
  const PLOT_CONFIG = {displaylogo: false, responsive: true};
  const PALETTE = ['#1f77b4', '#ff7f0e', '#2ca02c', '#d62728', '#9467bd', '#8c564b', '#e377c2', '#7f7f7f',
    '#bcbd22', '#17becf'];
  // how the curves are drawn, chosen on the page: kept across live updates and redraws
  const VIEW = {smooth: 0, x: 'step', filter: '', log: 'auto'};
  let SHOWN = null;  // the run page's newest data, which the curve tools redraw from
  // Plotly's 4.8 MB bundle is parsed off the main thread, while the page shows its text: the
  // dashboard loads it async; the report keeps it as text and runs it from a blob: URL.
  const PLOTLY = new Promise((resolve, reject) => {
    if (window.Plotly) { resolve(); return; }
    let script = document.getElementById('plotly-js');
    const source = document.getElementById('plotly-src');
    if (!script && source) {
      script = document.createElement('script');
      script.src = URL.createObjectURL(new Blob([source.textContent], {type: 'text/javascript'}));
      document.head.append(script);
    }
    if (!script) { reject(new Error('Plotly is missing')); return; }
    script.addEventListener('load', () => { performance.mark('prudent-plotly-ready'); resolve(); });
    script.addEventListener('error', () => reject(new Error('Plotly did not load')));
  });

  // --- small helpers ------------------------------------------------------------------------
  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(props || {})) {
      if (value === undefined || value === null) continue;
      if (key === 'text') node.textContent = String(value);
      else if (key === 'cls') node.className = value;
      else if (key.startsWith('data-')) node.setAttribute(key, String(value));
      else if (key === 'on') for (const [ev, fn] of Object.entries(value)) node.addEventListener(ev, fn);
      else node[key] = value;
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }
  function plotText(s) {
    return String(s).replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');
  }
  function num(v, digits) {
    if (v === null || v === undefined) return '';
    if (typeof v !== 'number') return String(v);
    return Number.isInteger(v) ? String(v) : v.toPrecision(digits || 4).replace(/\.?0+(e|$)/, '$1');
  }
  function usd(v) { return v === null || v === undefined ? '' : '$' + Number(v).toFixed(2); }
  function duration(s) {
    if (s === null || s === undefined) return '';
    s = Math.round(s);
    const h = Math.floor(s / 3600), m = Math.floor(s / 60) % 60, r = s % 60;
    return `${h}:${String(m).padStart(2, '0')}:${String(r).padStart(2, '0')}`;
  }
  function when(ts) {
    if (!ts) return '';
    const d = new Date(ts * 1000), p = (n) => String(n).padStart(2, '0');
    return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
  }
  function runLink(id, label) {
    return SETTINGS.links ? el('a', {href: '/runs/' + encodeURIComponent(id), text: label || id})
      : el('span', {text: label || id});
  }
  function section(title, ...children) {
    return el('section', {cls: 'card'}, el('h2', {text: title}), ...children);
  }
  function table(headers, rows, props) {
    return el('table', props || {}, el('thead', {}, el('tr', {}, headers.map((h) => el('th', {text: h})))),
      el('tbody', {}, rows));
  }
  function setTitle(text) {
    document.title = text + ' · prudent';
    document.getElementById('title').textContent = text;
  }
  function chartBox(props) {
    return el('div', Object.assign({cls: 'chart'}, props || {}));
  }
  function shortId(id) {  // "tiny-20261205-203324-ab12": the random tail tells two runs apart
    const tail = /-\d{8}-\d{6}-([0-9a-f]+)$/.exec(id);
    return tail ? tail[1] : id;
  }
  function runName(run) { return `${run.name} (${shortId(run.id)})`; }
  function finite(values) { return values.filter((v) => typeof v === 'number' && Number.isFinite(v)); }
  function steadyRange(values) {  // a series within ±1% of its level is drawn flat, not as a climb
    const v = finite(values);
    if (!v.length) return undefined;
    const lo = Math.min(...v), hi = Math.max(...v), mid = (lo + hi) / 2, pad = 0.01 * Math.abs(mid);
    return pad > 0 && hi - lo < 2 * pad ? [mid - pad, mid + pad] : undefined;
  }
  function yAxis(values, log, extra) {  // log: ticks at powers of ten only (1, 0.1, 0.01 ...)
    if (log) {
      const v = finite(values).filter((x) => x > 0);
      const decades = v.length ? Math.log10(Math.max(...v) / Math.min(...v)) : 0;
      return Object.assign({type: 'log', dtick: decades >= 1 ? 1 : undefined}, extra);
    }
    const range = steadyRange(values);
    return Object.assign({type: 'linear'}, range ? {range, autorange: false} : {}, extra);
  }
  function ema(values, weight) {  // TensorBoard's smoothing: debiased, gaps stay gaps
    let last = 0, n = 0;
    return values.map((v) => {
      if (v === null || v === undefined) return null;
      last = last * weight + (1 - weight) * v;
      n += 1;
      return last / (1 - Math.pow(weight, n));
    });
  }
  function singleValue(title, series) {  // one point is a number, not an empty chart
    const s = series.find((x) => finite(x.values).length) || series[0];
    const i = s.values.findIndex((v) => v !== null);
    return [el('div', {cls: 'stat-name', text: title}), el('div', {cls: 'stat-value', text: num(s.values[i])}),
      el('div', {cls: 'muted', text: `at step ${s.steps[i]} (one point)`})];
  }
  function plot(div, traces, layout) {
    const full = Object.assign({margin: {l: 55, r: 20, t: 30, b: 40}, height: 300,
      hovermode: 'closest', legend: {orientation: 'h', y: -0.2}}, layout);
    return PLOTLY.then(() => (div.dataset.drawn ? Plotly.react : Plotly.newPlot)(div, traces, full, PLOT_CONFIG))
      .then(() => { div.dataset.drawn = '1'; });
  }

  // --- runs -------------------------------------------------------------------------------
  function runsPage(data, state) {
    setTitle('runs');
    state = state || {sort: 'started_at', desc: true, filter: '', status: '', metric: null};
    const metricNames = [...new Set(data.runs.flatMap((r) => Object.keys(r.metrics || {})))].sort();
    if (state.metric === null) state.metric = metricNames.includes('val_acc') ? 'val_acc'
      : (metricNames.includes('loss') ? 'loss' : (metricNames[0] || ''));
    const columns = [['name', 'name'], ['status', 'status'], ['stop_reason', 'stop reason'],
      ['started_at', 'started'], ['duration_s', 'duration'], ['step', 'steps'],
      ['restarts', 'restarts'], ['cost_usd', 'cost'], ['metric', state.metric || 'metric']];
    const value = (r, key) => key === 'metric' ? (r.metrics || {})[state.metric] : r[key];
    const body = el('tbody');
    const selected = new Set();
    function fill() {
      const text = state.filter.toLowerCase();
      const rows = data.runs.filter((r) => (!state.status || r.status === state.status) &&
        (!text || (r.name + ' ' + r.id + ' ' + (r.stop_reason || '')).toLowerCase().includes(text)));
      rows.sort((a, b) => {
        const x = value(a, state.sort), y = value(b, state.sort);
        const c = (x === null || x === undefined) - (y === null || y === undefined) ||
          (typeof x === 'number' && typeof y === 'number' ? x - y : String(x).localeCompare(String(y)));
        return state.desc ? -c : c;
      });
      body.replaceChildren(...rows.map((r) => el('tr', {'data-status': r.status, 'data-id': r.id},
        SETTINGS.links ? el('td', {}, el('input', {type: 'checkbox', checked: selected.has(r.id),
          on: {change: (e) => { e.target.checked ? selected.add(r.id) : selected.delete(r.id); }}})) : null,
        el('td', {}, runLink(r.id, r.name), el('div', {cls: 'muted', text: r.id})),
        el('td', {}, el('span', {cls: 'status status-' + r.status, text: r.status})),
        el('td', {text: r.stop_reason || ''}), el('td', {text: when(r.started_at)}),
        el('td', {text: duration(r.duration_s)}), el('td', {text: r.step}),
        el('td', {text: r.restarts}), el('td', {text: usd(r.cost_usd)}),
        el('td', {text: num(value(r, 'metric'))}))));
      count.textContent = `${rows.length} of ${data.runs.length} runs`;
    }
    const count = el('span', {cls: 'muted', id: 'runs-count'});
    const head = el('tr', {}, SETTINGS.links ? el('th') : null, columns.map(([key, label]) =>
      el('th', {cls: 'sortable', 'data-key': key, text: label + (state.sort === key ? (state.desc ? ' ▾' : ' ▴') : ''),
        on: {click: () => { state.desc = state.sort === key ? !state.desc : false; state.sort = key; redraw(); }}})));
    const statuses = [...new Set(data.runs.map((r) => r.status))].sort();
    const tools = el('div', {cls: 'tools'},
      el('input', {type: 'search', id: 'runs-filter', placeholder: 'filter by name, id, reason', value: state.filter,
        on: {input: (e) => { state.filter = e.target.value; fill(); }}}),
      el('select', {id: 'runs-status', on: {change: (e) => { state.status = e.target.value; fill(); }}},
        el('option', {value: '', text: 'any status'}),
        statuses.map((s) => el('option', {value: s, text: s, selected: s === state.status}))),
      el('label', {}, ' metric ', el('select', {id: 'runs-metric', on: {change: (e) => { state.metric = e.target.value; redraw(); }}},
        metricNames.map((m) => el('option', {value: m, text: m, selected: m === state.metric})))),
      SETTINGS.links ? el('button', {id: 'compare', text: 'compare selected', on: {click: () => {
        if (selected.size >= 2) location.href = '/compare?ids=' + [...selected].map(encodeURIComponent).join(',');
      }}}) : null, count);
    function redraw() { runsPage(data, state); }
    const parts = [section('Runs', tools, el('table', {id: 'runs'}, el('thead', {}, head), body))];
    if (data.studies && data.studies.length) {
      parts.push(section('Studies', el('ul', {id: 'studies'}, data.studies.map((s) => el('li', {},
        SETTINGS.links ? el('a', {href: '/studies/' + encodeURIComponent(s), text: s}) : el('span', {text: s}))))));
    }
    APP.replaceChildren(...parts);
    fill();
    return state;
  }

  // --- run --------------------------------------------------------------------------------
  function runSummary(run, verdict) {
    const fields = [['status', el('span', {cls: 'status status-' + run.status, text: run.status})],
      ['stop reason', run.stop_reason || '—'], ['started', when(run.started_at)],
      ['duration', duration(run.duration_s)], ['steps', run.step], ['epoch', run.epoch],
      ['restarts', run.restarts], ['cost', usd(run.cost_usd)], ['host', run.host || ''],
      ['exit code', run.exit_code === null ? '' : run.exit_code]].filter(([k, v]) => !(k === 'epoch' && v === null));
    return el('section', {cls: 'card', id: 'summary'},
      el('p', {id: 'verdict', text: verdict}),
      el('dl', {cls: 'fields'}, fields.map(([k, v]) => el('div', {}, el('dt', {text: k}), el('dd', {}, v)))));
  }
  function curveGroups(series) {
    const loss = series.filter((s) => /loss/i.test(s.name));
    const groups = loss.length ? [{title: 'loss', series: loss}] : [];
    for (const s of series) if (!/loss/i.test(s.name)) groups.push({title: s.name, series: [s]});
    return groups.slice(0, 16);
  }
  function markerTraces(markers) {
    const byKind = {};
    for (const m of markers) (byKind[m.kind] = byKind[m.kind] || []).push(m);
    // one row per kind, so that a rule, its capture and its stop at one step are each hoverable
    return Object.entries(byKind).map(([kind, items], row) => ({
      type: 'scatter', mode: 'markers', name: kind, yaxis: 'y2', x: items.map((m) => (m.x === undefined ? m.step : m.x)),
      y: items.map(() => 0.97 - 0.075 * row), hoverinfo: 'text',
      hovertext: items.map((m) => plotText(`${kind} at step ${m.step}: ${m.message}`).replace(/(.{90}\S*)\s/g, '$1<br>')),
      marker: {color: COLORS[kind] || '#333', size: kind === 'checkpoint' ? 7 : 12,
        symbol: kind === 'checkpoint' ? 'line-ns-open' : 'triangle-down'},
    }));
  }
  function markerLines(markers) {
    return markers.filter((m) => LINE_EVENTS.has(m.kind)).map((m) => ({type: 'line', xref: 'x', yref: 'paper',
      x0: m.x === undefined ? m.step : m.x, x1: m.x === undefined ? m.step : m.x, y0: 0, y1: 1, line: {color: COLORS[m.kind], width: 1, dash: 'dot'}}));
  }
  function logScale(series) {  // a loss that falls over decades reads better on a log axis
    const values = series.flatMap((s) => s.values).filter((v) => v !== null);
    return values.length > 0 && values.every((v) => v > 0) && Math.max(...values) / Math.min(...values) > 100;
  }
  function stepToWall(data) {  // the series carry steps: a step's time from the run's events and samples
    const run = data.run, anchors = [[0, run.started_at]];
    for (const e of (data.events || {}).rows || []) if (e.step !== null && e.wall) anchors.push([e.step, e.wall]);
    for (const s of data.timeline || []) if (s.step !== undefined && s.t !== undefined) anchors.push([s.step, run.started_at + s.t]);
    anchors.push([run.step, run.ended_at || Date.now() / 1000]);
    anchors.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
    for (let i = 1; i < anchors.length; i++) anchors[i][1] = Math.max(anchors[i][1], anchors[i - 1][1]);
    return (step) => {
      let lo = 0, hi = anchors.length;  // the first anchor at or after the step
      while (lo < hi) { const mid = (lo + hi) >> 1; if (anchors[mid][0] < step) lo = mid + 1; else hi = mid; }
      const i = lo;
      if (i === anchors.length) return new Date(anchors[i - 1][1] * 1000);
      if (i === 0 || anchors[i][0] === step) return new Date(anchors[i][1] * 1000);
      const [s0, w0] = anchors[i - 1], [s1, w1] = anchors[i];
      return new Date((w0 + (w1 - w0) * (step - s0) / (s1 - s0)) * 1000);
    };
  }
  function curveTools(redraw, options) {
    const shown = el('span', {cls: 'muted', id: 'smoothing-value', text: VIEW.smooth.toFixed(2)});
    return el('div', {cls: 'tools', id: 'curve-tools'},
      el('input', {type: 'search', id: 'metric-filter', placeholder: 'filter metrics by name', value: VIEW.filter,
        on: {input: (e) => { VIEW.filter = e.target.value; filterCharts(); }}}),
      el('label', {}, 'smoothing ', el('input', {type: 'range', id: 'smoothing', min: 0, max: 0.99, step: 0.01,
        value: VIEW.smooth, on: {input: (e) => { VIEW.smooth = Number(e.target.value); shown.textContent = VIEW.smooth.toFixed(2); redraw(); }}}), ' ', shown),
      options.wall ? el('label', {}, 'x axis ', el('select', {id: 'x-axis', on: {change: (e) => { VIEW.x = e.target.value; redraw(); }}},
        el('option', {value: 'step', text: 'step', selected: VIEW.x === 'step'}),
        el('option', {value: 'wall', text: 'wall time', selected: VIEW.x === 'wall'}))) : null,
      options.log ? el('label', {}, 'y axis ', el('select', {id: 'y-scale', on: {change: (e) => { VIEW.log = e.target.value; redraw(); }}},
        [['auto', 'log for losses'], ['linear', 'linear'], ['log', 'log']].map(([value, text]) =>
          el('option', {value, text, selected: VIEW.log === value})))) : null);
  }
  function filterCharts() {
    const text = VIEW.filter.trim().toLowerCase();
    for (const div of document.querySelectorAll('#curves [data-metric]')) {
      div.hidden = Boolean(text) && !div.dataset.names.toLowerCase().includes(text);
    }
  }
  function lineTraces(name, x, y, color, extra) {  // smoothed: the raw line stays, faint, behind
    const hover = plotText(name) + (VIEW.x === 'wall' ? ' %{y}<br>%{x}' : ' %{y}<br>step %{x}') + '<extra></extra>';
    const line = Object.assign({type: 'scatter', name: plotText(name), x, y, connectgaps: false, line: {color},
      marker: {color}, hovertemplate: hover}, extra);
    if (!VIEW.smooth) return [line];
    return [Object.assign({}, line, {opacity: 0.25, showlegend: false, hoverinfo: 'skip', hovertemplate: undefined, meta: 'raw'}),
      Object.assign({}, line, {y: ema(y, VIEW.smooth), mode: 'lines', meta: 'smoothed'})];
  }
  function curveBoxes(container, groups) {  // kept while they stay the same: live charts keep their zoom
    const keyOf = (g) => g.title + (g.single ? ' value' : ' chart');
    const known = [...container.children].map((d) => d.dataset.key);
    if (known.length !== groups.length || groups.some((g, i) => known[i] !== keyOf(g))) {
      container.replaceChildren(...groups.map((g) => g.single
        ? el('div', {cls: 'stat', 'data-key': keyOf(g), 'data-metric': g.title})
        : chartBox({cls: 'chart curve', 'data-key': keyOf(g), 'data-metric': g.title})));
    }
    groups.forEach((g, i) => { container.children[i].dataset.names = [g.title, ...g.series.map((s) => s.name)].join(' '); });
    return [...container.children];
  }
  function drawCurves(container, data) {
    const groups = curveGroups(data.series);
    if (!groups.length) {
      container.replaceChildren(el('p', {cls: 'muted', text: 'no metrics recorded yet'}));
      return Promise.resolve();
    }
    for (const g of groups) g.single = g.series.every((s) => finite(s.values).length <= 1);
    const boxes = curveBoxes(container, groups);
    const wall = VIEW.x === 'wall' ? stepToWall(data) : null;
    const xOf = (steps) => (wall ? steps.map(wall) : steps);
    const drawn = [];
    groups.forEach((g, i) => {
      const div = boxes[i];
      if (g.single) { div.replaceChildren(...singleValue(g.title, g.series)); return; }
      const traces = g.series.flatMap((s, j) => lineTraces(
        s.name + (s.downsampled ? ` (${s.count.toLocaleString()} points, min/max per bucket)` : ''),
        xOf(s.steps), s.values, PALETTE[j % PALETTE.length], {mode: s.steps.length < 60 ? 'lines+markers' : 'lines'}));
      const points = g.series.reduce((n, s) => n + s.count, 0);
      div.dataset.points = String(points);
      div.dataset.lastStep = String(Math.max(...g.series.map((s) => s.steps.length ? s.steps[s.steps.length - 1] : 0)));
      const markers = wall ? data.markers.map((m) => Object.assign({}, m, {x: new Date(m.wall * 1000)})) : data.markers;
      drawn.push(plot(div, traces.concat(markerTraces(markers)), {
        title: {text: plotText(g.title), x: 0.01, font: {size: 14}},
        xaxis: {title: {text: wall ? 'wall time' : 'step'}, type: wall ? 'date' : 'linear'},
        yaxis: yAxis(g.series.flatMap((s) => s.values), logScale(g.series)),
        yaxis2: {overlaying: 'y', range: [0, 1], visible: false, fixedrange: true},
        shapes: markerLines(markers)}));
    });
    filterCharts();
    return Promise.all(drawn);
  }
  function profileSection(data) {
    const p = data.profile;
    const parts = [];
    if (p && p.breakdown) {
      const names = Object.keys(p.breakdown);
      const div = chartBox({id: 'breakdown', cls: 'chart small'});
      parts.push(div);
      requestAnimationFrame(() => plot(div, names.map((n) => ({type: 'bar', orientation: 'h', name: n,
        y: ['step time'], x: [p.breakdown[n].pct], hovertemplate: `${n}: %{x}% (${p.breakdown[n].s} s)<extra></extra>`})),
      {barmode: 'stack', height: 170, xaxis: {title: {text: '% of training time'}, range: [0, 100]},
        yaxis: {automargin: true}, margin: {l: 80, r: 20, t: 10, b: 40}, legend: {orientation: 'h', y: -0.6}}));
      const t = p.throughput || {}, st = p.step_time_ms || {};
      parts.push(el('p', {text: `${p.num_steps} steps in ${duration(p.wall_s)}; ${num(t.steps_per_s)} steps/s` +
        (t.samples_per_s ? `, ${num(t.samples_per_s)} samples/s` : '') + (t.tokens_per_s ? `, ${num(t.tokens_per_s)} tokens/s` : '') +
        (st.median ? `; step time median ${num(st.median)} ms, p90 ${num(st.p90)} ms` : '') + `; device ${p.device || '?'}`}));
      const tries = data.profile_attempts || [];
      if (tries.length > 1) {  // a resumed run: the split above is its last attempt's
        const last = tries[tries.length - 1];
        parts.push(el('p', {id: 'attempt-note', text: `The split covers attempt ${last.attempt} of ${tries.length} (steps ${last.first_step}–${last.last_step}); each attempt:`}));
        parts.push(table(['attempt', 'steps', 'time', ...SPLIT.map((n) => n + ' %')], tries.map((a) => el('tr', {},
          [a.attempt, `${a.first_step}–${a.last_step}`, duration(a.wall_s), ...SPLIT.map((n) => num(a[n + '_pct']))].map((v) => el('td', {text: String(v)})))),
        {id: 'attempts', cls: 'compact'}));
      }
      if (p.data_measured === false) {
        parts.push(el('p', {cls: 'muted', id: 'data-not-measured', text: 'data not measured: the loop fetches its own batches (not through run.batches), so their loading time is counted in compute'}));
      }
    } else {
      parts.push(el('p', {cls: 'muted', text: 'no profile yet: the profiler writes its summary when the run ends'}));
    }
    if (data.timeline && data.timeline.length) parts.push(...timelineParts(data.timeline));
    return section('Where the time went', ...parts);
  }
  const RATES = ['steps_per_s', 'samples_per_s', 'tokens_per_s'];
  const SPLIT = ['data', 'compute', 'checkpoint', 'eval', 'other'];
  function timelineParts(timeline) {
    const samples = timeline.map((s) => {  // each GPU's use as keys of its own
      const flat = Object.assign({}, s);
      (s.gpus || []).forEach((g, i) => { flat[`gpu${i}_util_pct`] = g.util_pct; flat[`gpu${i}_mem_used_mb`] = g.mem_used_mb; });
      return flat;
    });
    const keys = [...new Set(samples.flatMap(Object.keys))]
      .filter((k) => /^(cpu_pct|system_cpu_pct|rss_mb|gpu\d+_(util_pct|mem_used_mb))$/.test(k));
    const rates = RATES.filter((k) => samples.some((s) => s[k]));
    const split = SPLIT.filter((k) => samples.some((s) => s[`${k}_pct`] !== undefined));
    if (samples.length === 1) {  // a short run: one sample is a row of numbers, not empty charts
      const only = samples[0], unit = (k) => (/_pct$/.test(k) ? '%' : (/_mb$/.test(k) ? ' MB' : ''));
      const shown = [...rates, ...keys, ...split.map((k) => `${k}_pct`)].filter((k) => only[k] !== undefined && only[k] !== null);
      return [el('p', {cls: 'muted', text: `one profiler sample, at ${num(only.t)} s:`}),
        el('dl', {cls: 'fields', id: 'machine'}, shown.map((k) => el('div', {}, el('dt', {text: k}), el('dd', {text: num(only[k]) + unit(k)}))))];
    }
    const t = samples.map((s) => s.t);
    const column = (k) => samples.map((s) => s[k]);
    const rate = chartBox({id: 'throughput', cls: 'chart'});
    const system = chartBox({id: 'system', cls: 'chart'});
    const parts = [rate, system];
    const side = {overlaying: 'y', side: 'right'};
    if (split.length) {  // where each interval's time went, over the run
      const over = chartBox({id: 'split', cls: 'chart'});
      parts.push(over);
      requestAnimationFrame(() => plot(over, split.map((k) => ({type: 'scatter', mode: 'lines', stackgroup: 'split', name: k,
        x: t, y: samples.map((s) => s[`${k}_pct`] || 0), hovertemplate: `${k}: %{y:.1f}%<extra></extra>`})),
      {title: {text: 'step time split over the run', x: 0.01, font: {size: 14}}, xaxis: {title: {text: 'seconds'}},
        yaxis: {title: {text: '% of wall time'}}, margin: {l: 55, r: 20, t: 30, b: 40}}));
    }
    requestAnimationFrame(() => {
      const second = rates.filter((k) => k !== 'steps_per_s');
      plot(rate, rates.map((k) => ({type: 'scatter', name: k, x: t, y: column(k), yaxis: k === 'steps_per_s' ? 'y' : 'y2'})),
        {title: {text: 'throughput', x: 0.01, font: {size: 14}}, xaxis: {title: {text: 'seconds'}},
          margin: {l: 55, r: 70, t: 30, b: 40}, yaxis: yAxis(column('steps_per_s'), false, {title: {text: 'steps/s'}}),
          yaxis2: yAxis(second.flatMap(column), false, Object.assign({title: {text: 'samples or tokens/s'}}, side))});
      const mb = keys.filter((k) => /_mb/.test(k)), pct = keys.filter((k) => !/_mb/.test(k));
      plot(system, keys.map((k) => ({type: 'scatter', name: k, x: t, y: column(k), yaxis: /_mb/.test(k) ? 'y2' : 'y'})),
        {title: {text: 'CPU / GPU / memory', x: 0.01, font: {size: 14}}, xaxis: {title: {text: 'seconds'}},
          yaxis: yAxis(pct.flatMap(column), false, {title: {text: '%'}}), margin: {l: 55, r: 70, t: 30, b: 40},
          yaxis2: yAxis(mb.flatMap(column), false, Object.assign({title: {text: 'MB'}}, side))});
    });
    return parts;
  }
  function findingsSection(findings) {
    return section('Findings', findings.length ? el('ul', {id: 'findings'}, findings.map((f) =>
      el('li', {}, el('b', {text: f.id}), ` (step ${f.step}): `, el('span', {text: f.message}))))
      : el('p', {cls: 'muted', text: 'none'}));
  }
  function costSection(data) {
    const c = data.cost || {};
    const parts = [el('p', {text: `total ${usd(c.total_usd)}` + (c.hourly_usd !== undefined ? ` at ${usd(c.hourly_usd)}/h` : '') +
      (c.instance ? ` on ${c.instance}${c.spot ? ' (spot)' : ''}` : '') + (c.saved_usd ? `; saved ${usd(c.saved_usd)} against on-demand` : '')})];
    const spent = data.cost_over_time.some((p) => p.usd);
    if (!spent) {  // a flat $0 line says nothing
      parts.push(el('p', {cls: 'muted', id: 'no-cost', text: c.hourly_usd ? 'no cost recorded yet'
        : 'no cost chart: no instance price known, so this run cost $0 as far as prudent knows'}));
    } else if (data.cost_over_time.length > 1) {
      const div = chartBox({id: 'cost', cls: 'chart small'});
      parts.push(div);
      requestAnimationFrame(() => plot(div, [{type: 'scatter', mode: 'lines+markers', name: 'cost',
        x: data.cost_over_time.map((p) => new Date(p.wall * 1000)), y: data.cost_over_time.map((p) => p.usd)}],
      {height: 220, yaxis: {title: {text: 'USD'}}}));
    }
    const attempts = c.by_attempt || [];
    parts.push(table(['attempt', 'host', 'instance', '$/h', 'time', 'cost'], attempts.map((a) => el('tr', {},
      el('td', {text: a.attempt}), el('td', {text: a.host || ''}), el('td', {text: a.instance || ''}),
      el('td', {text: usd(a.hourly_usd)}), el('td', {text: duration(a.seconds)}), el('td', {text: usd(a.usd)}))), {id: 'attempts'}));
    return section('Cost', ...parts);
  }
  function configSection(run) {
    const rows = Object.entries(flatten(run.config)).map(([k, v]) => el('tr', {}, el('td', {text: k}), el('td', {text: JSON.stringify(v)})));
    return section('Config and command', table(['key', 'value'], rows, {id: 'config'}),
      el('pre', {id: 'command', text: run.command || ''}));
  }
  function eventsSection(events) {
    const kinds = [...new Set(events.rows.map((e) => e.kind))].sort();
    const body = el('tbody');
    const fill = (kind) => body.replaceChildren(...events.rows.filter((e) => !kind || e.kind === kind).map((e) =>
      el('tr', {'data-kind': e.kind}, el('td', {text: e.step}), el('td', {text: e.kind, title: e.kind}), el('td', {text: e.name, title: e.name}),
        el('td', {text: e.message}))));
    fill('');
    const note = events.total > events.rows.length ? `the newest ${events.rows.length} of ${events.total}` : `${events.total}`;
    return section('Events', el('div', {cls: 'tools'}, el('select', {on: {change: (e) => fill(e.target.value)}},
      el('option', {value: '', text: 'all kinds'}), kinds.map((k) => el('option', {value: k, text: k}))),
    el('span', {cls: 'muted', text: ` ${note} events`})),
    el('table', {id: 'events'}, el('thead', {}, el('tr', {}, ['step', 'kind', 'name', 'message'].map((h) => el('th', {text: h})))), body));
  }
  function flatten(obj, prefix, out) {
    out = out || {};
    for (const [k, v] of Object.entries(obj || {})) {
      const key = prefix ? prefix + '.' + k : k;
      if (v && typeof v === 'object' && !Array.isArray(v) && Object.keys(v).length) flatten(v, key, out);
      else out[key] = v;
    }
    return out;
  }
  function runPage(data) {
    setTitle(`${data.run.name} (${data.run.id})`);
    const curves = el('div', {id: 'curves'});
    SHOWN = data;
    const redraw = () => { if (SHOWN.series !== null) curvesDrawn(drawCurves(curves, SHOWN)); };
    APP.replaceChildren(runSummary(data.run, data.verdict),
      section('Curves and events', el('p', {cls: 'muted', text: 'markers on top: ' + Object.keys(COLORS).join(', ') +
        '; hover one to read it'}), curveTools(redraw, {wall: true}), curves),
      profileSection(data), findingsSection(data.findings), costSection(data), configSection(data.run),
      eventsSection(data.events));
    if (data.series === null) {  // a quick first answer: the curves follow from the full one
      curves.replaceChildren(el('p', {cls: 'muted', id: 'curves-loading', text: 'drawing the curves…'}));
    } else {
      curvesDrawn(drawCurves(curves, data));
    }
    APP.dataset.lastStep = String(data.run.step);
  }
  function curvesDrawn(promise) {
    promise.then(() => { APP.dataset.curvesDrawnMs = performance.now().toFixed(1); });
  }
  function updateRun(data) {  // live: new points and events, the charts keep their zoom
    SHOWN = data;
    const summary = document.getElementById('summary');
    summary.replaceWith(runSummary(data.run, data.verdict));
    curvesDrawn(drawCurves(document.getElementById('curves'), data));
    document.getElementById('events').closest('section').replaceWith(eventsSection(data.events));
    APP.dataset.lastStep = String(data.run.step);
    APP.dataset.updates = String(Number(APP.dataset.updates || 0) + 1);
  }
  function poll(data, apply, everyMs) {
    let token = data.token;
    let busy = false;
    const timer = setInterval(() => {
      if (busy) return;
      busy = true;
      fetch(SETTINGS.data_url + (SETTINGS.data_url.includes('?') ? '&' : '?') + 'since=' + encodeURIComponent(token))
        .then((r) => r.json()).then((fresh) => {
          if (fresh.unchanged) return;
          token = fresh.token;
          apply(fresh);
          if (fresh.page === 'run' && fresh.run.status !== 'running') clearInterval(timer);
        }).catch(() => {}).finally(() => { busy = false; });
    }, everyMs);
  }

  // --- compare ----------------------------------------------------------------------------
  function comparePage(data) {
    setTitle('compare ' + data.runs.map((r) => runName(r.run)).join(', '));
    const names = [...new Set(data.runs.flatMap((r) => r.series.map((s) => s.name)))].sort();
    const single = (n) => data.runs.every((r) => finite((r.series.find((s) => s.name === n) || {values: []}).values).length <= 1);
    const curves = el('div', {id: 'curves'}, names.map((n) => (single(n)
      ? el('div', {cls: 'stat', 'data-metric': n, 'data-names': n}, el('div', {cls: 'stat-name', text: n}),
        data.runs.map((r) => { const s = r.series.find((x) => x.name === n); const v = s ? finite(s.values)[0] : undefined;
          return el('div', {}, `${runName(r.run)}: `, el('b', {text: v === undefined ? '—' : num(v)})); }))
      : chartBox({cls: 'chart curve', 'data-metric': n, 'data-names': n}))));
    const head = ['key', ...data.runs.map((r) => runName(r.run))];
    const rows = data.config.map((row) => el('tr', {cls: row.differs ? 'diff' : ''}, el('td', {text: row.key}),
      row.values.map((v) => el('td', {text: v === undefined ? '' : JSON.stringify(v)}))));
    const redraw = () => drawCompare(curves, data, names);
    APP.replaceChildren(section('Runs', el('ul', {}, data.runs.map((r) => el('li', {}, runLink(r.run.id, runName(r.run)),
      ` ${r.run.status}, ${r.run.step} steps, ${usd(r.run.cost_usd)}`)))),
    section('Curves', curveTools(redraw, {log: true}), curves),
    section('Config (differences highlighted)', table(head, rows, {id: 'config'})));
    redraw();
  }
  function drawCompare(curves, data, names) {
    names.forEach((n, i) => {
      if (!curves.children[i].classList.contains('curve')) return;
      const found = data.runs.map((r) => r.series.find((s) => s.name === n));
      const traces = found.flatMap((s, j) => (s ? lineTraces(runName(data.runs[j].run), s.steps, s.values,
        PALETTE[j % PALETTE.length], {mode: 'lines'}) : []));
      const values = found.flatMap((s) => (s ? s.values : []));
      const positive = finite(values).length > 0 && finite(values).every((v) => v > 0);  // a log axis needs it
      const log = positive && (VIEW.log === 'log' || (VIEW.log === 'auto' && (/loss/i.test(n) || logScale(found.filter(Boolean)))));
      // the legend (run names) below the axis title, not on it
      plot(curves.children[i], traces, {title: {text: plotText(n), x: 0.01, font: {size: 14}}, showlegend: true,
        xaxis: {title: {text: 'step'}}, yaxis: yAxis(values, log), height: 340,
        margin: {l: 55, r: 20, t: 30, b: 90}, legend: {orientation: 'h', y: -0.3, yanchor: 'top'}});
    });
    filterCharts();
  }

  // --- study ------------------------------------------------------------------------------
  function studyPage(data) {
    const s = data.summary;
    setTitle('study ' + s.study);
    const history = chartBox({id: 'history'}), inter = chartBox({id: 'intermediate'});
    const parallel = chartBox({id: 'parallel'}), importance = chartBox({id: 'importances', cls: 'chart small'});
    const unit = s.unit || 'epoch';
    const counts = Object.entries(s.counts).map(([k, v]) => `${v} ${k}`).join(', ');
    const best = s.best_params ? `best ${s.objective} = ${num(s.best_value, 6)} (trial ${s.best_trial}) with ${JSON.stringify(s.best_params)}` : 'no completed trial yet';
    const rows = s.trials.map((t) => el('tr', {'data-state': t.state, 'data-number': t.number},
      el('td', {text: t.number}), el('td', {}, el('span', {cls: 'status status-' + t.state, text: t.state})),
      el('td', {text: num(t.value)}), el('td', {text: t[unit + 's']}), el('td', {text: '$' + Number(t.cost_usd).toFixed(4)}),
      el('td', {cls: 'pruned-by', text: t.pruned_by || (t.error || '').slice(0, 60)}),
      el('td', {text: Object.entries(t.params).map(([k, v]) => `${k}=${num(v, 3)}`).join(' ')}),
      el('td', {}, t.run_id ? runLink(t.run_id) : '')));
    APP.replaceChildren(section(`Study ${s.study}`, el('p', {id: 'study-summary', text:
      `${s.direction === 'max' ? 'maximise' : 'minimise'} ${s.objective}; pruner ${s.pruner || 'none'}; trials: ${counts}; ` +
      `${s[unit + 's_total']} ${unit}s used` + (s[unit + 's_without_pruning'] ? ` (${s[unit + 's_without_pruning']} without pruning)` : '') +
      `; cost $${Number(s.cost_usd_total).toFixed(4)}`}), el('p', {id: 'best', text: best})),
    section('Optimisation history', history), section(`Intermediate values (per ${unit}; pruned trials dashed, with who pruned them)`, inter),
    section('Parallel coordinates', parallel), section('Parameter importances (fANOVA)', s.importances ? importance
      : el('p', {cls: 'muted', text: 'shown from 5 completed trials on'})),
    section('Trials', table(['#', 'state', s.objective || 'value', unit + 's', 'cost', 'pruned by', 'params', 'run'], rows, {id: 'trials'})));
    drawStudy(s, data.params, {history, inter, parallel, importance});
  }
  function drawStudy(s, params, divs) {
    const done = s.trials.filter((t) => t.value !== null);
    let bestSoFar = null;
    const better = (a, b) => b === null || (s.direction === 'max' ? a > b : a < b);
    const complete = done.filter((t) => t.state === 'complete');
    const bestLine = complete.map((t) => (bestSoFar = better(t.value, bestSoFar) ? t.value : bestSoFar));
    plot(divs.history, Object.keys(STATES).map((state) => {
      const ts = done.filter((t) => t.state === state);
      return {type: 'scatter', mode: 'markers', name: state, x: ts.map((t) => t.number), y: ts.map((t) => t.value),
        marker: {color: STATES[state], size: 9}};
    }).filter((t) => t.x.length).concat([{type: 'scatter', mode: 'lines', name: 'best so far', x: complete.map((t) => t.number),
      y: bestLine, line: {shape: 'hv', color: '#555'}}]), {xaxis: {title: {text: 'trial'}, dtick: 1}, yaxis: {title: {text: plotText(s.objective || 'value')}}});
    plot(divs.inter, s.trials.filter((t) => t.intermediate.steps.length).map((t) => ({
      type: 'scatter', mode: 'lines+markers', x: t.intermediate.steps, y: t.intermediate.values,
      name: plotText(`trial ${t.number}` + (t.state === 'pruned' ? ` (pruned by ${t.pruned_by || '?'})` : ` (${t.state})`)),
      line: {dash: t.state === 'pruned' ? 'dash' : 'solid', color: t.state === 'pruned' ? undefined : undefined},
      marker: {symbol: t.state === 'pruned' ? 'x' : 'circle'},
    })), {xaxis: {title: {text: s.unit || 'epoch'}, tickformat: 'd', dtick: s.unit === 'step' ? undefined : 1}, yaxis: {title: {text: plotText(s.objective || 'value')}}, height: 360});
    if (complete.length && params.length) {
      const dims = params.map((p) => {
        const vals = complete.map((t) => (p in t.params ? t.params[p] : '—'));  // conditional ones
        if (vals.every((v) => typeof v === 'number')) return {label: plotText(p), values: vals};
        const label = (v) => (typeof v === 'number' ? num(v, 3) : String(v));
        const cats = [...new Set(vals.map(label))].sort();
        return {label: plotText(p), values: vals.map((v) => cats.indexOf(label(v))), tickvals: cats.map((_, i) => i), ticktext: cats.map(plotText)};
      });
      dims.push({label: plotText(s.objective || 'value'), values: complete.map((t) => t.value)});
      plot(divs.parallel, [{type: 'parcoords', dimensions: dims, line: {color: complete.map((t) => t.value), colorscale: 'Viridis', showscale: true}}],
        {margin: {l: 60, r: 60, t: 40, b: 30}});
    } else {
      divs.parallel.replaceChildren(el('p', {cls: 'muted', text: 'no completed trial yet'}));
    }
    if (s.importances) {
      const names = Object.keys(s.importances).reverse();
      plot(divs.importance, [{type: 'bar', orientation: 'h', y: names.map(plotText), x: names.map((n) => s.importances[n])}],
        {height: 60 + 30 * names.length, margin: {l: 120, r: 20, t: 10, b: 30}});
    }
  }

  // --- start ------------------------------------------------------------------------------
  function render(data) {
    if (data.error) { APP.replaceChildren(el('p', {cls: 'error', text: data.error})); return; }
    if (data.page === 'runs') {
      let state = runsPage(data);
      if (SETTINGS.live) poll(data, (fresh) => { data = fresh; state = runsPage(fresh, state); }, 2000);
    } else if (data.page === 'run') {
      runPage(data);
      const full = data.series === null && window.prudentFull ? window.prudentFull : Promise.resolve(data);
      full.then((fresh) => {
        performance.mark('prudent-full-data');
        if (fresh.error) throw new Error(fresh.error);
        if (fresh !== data) updateRun(fresh);
        if (SETTINGS.live && fresh.run.status === 'running') poll(fresh, updateRun, 1000);
      }).catch(failed);
    } else if (data.page === 'compare') comparePage(data);
    else if (data.page === 'study') {
      studyPage(data);
      let last = JSON.stringify(data);  // a running study: redrawn when a trial moves on
      if (SETTINGS.live) poll(data, (fresh) => { const now = JSON.stringify(fresh); if (now !== last) { last = now; studyPage(fresh); } }, 3000);
    }
    APP.dataset.page = data.page;
    APP.dataset.openMs = performance.now().toFixed(1);
    APP.dataset.ready = '1';
  }
  function failed(error) { APP.replaceChildren(el('p', {cls: 'error', text: 'could not load: ' + error})); }
  try {
    if (BLOB.trim()) render(JSON.parse(BLOB));
    else if (window.prudentFetch) window.prudentFetch.then(render).catch(failed);
  } catch (error) { failed(error); }
})();
