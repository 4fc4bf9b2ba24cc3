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
      ['exit code', run.exit_code === null ? '' : run.exit_code]];
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
      type: 'scatter', mode: 'markers', name: kind, yaxis: 'y2', x: items.map((m) => m.step),
      y: items.map(() => 0.97 - 0.075 * row), hoverinfo: 'text',
      hovertext: items.map((m) => plotText(`${kind} at step ${m.step}: ${m.message}`).replace(/(.{90}\S*)\s/g, '$1<br>')),
      marker: {color: COLORS[kind] || '#333', size: kind === 'checkpoint' ? 7 : 12,
        symbol: kind === 'checkpoint' ? 'line-ns-open' : 'triangle-down'},
    }));
  }
  function markerLines(markers) {
    return markers.filter((m) => LINE_EVENTS.has(m.kind)).map((m) => ({type: 'line', xref: 'x', yref: 'paper',
      x0: m.step, x1: m.step, y0: 0, y1: 1, line: {color: COLORS[m.kind], width: 1, dash: 'dot'}}));
  }
  function logScale(series) {  // a loss that falls over decades reads better on a log axis
    const values = series.flatMap((s) => s.values).filter((v) => v !== null);
    return values.length > 0 && values.every((v) => v > 0) && Math.max(...values) / Math.min(...values) > 100;
  }
  function drawCurves(container, data) {
    const groups = curveGroups(data.series);
    if (!groups.length) {
      container.replaceChildren(el('p', {cls: 'muted', text: 'no metrics recorded yet'}));
      return Promise.resolve();
    }
    const known = new Map([...container.querySelectorAll('.curve')].map((d) => [d.dataset.metric, d]));
    if (known.size !== groups.length || groups.some((g) => !known.has(g.title))) {
      container.replaceChildren(...groups.map((g) => chartBox({cls: 'chart curve', 'data-metric': g.title})));
    }
    const drawn = [];
    for (const g of groups) {
      const div = container.querySelector(`.curve[data-metric="${CSS.escape(g.title)}"]`);
      const traces = g.series.map((s) => ({type: 'scatter', mode: s.steps.length < 60 ? 'lines+markers' : 'lines',
        name: plotText(s.name + (s.downsampled ? ` (${s.count.toLocaleString()} points, min/max per bucket)` : '')),
        x: s.steps, y: s.values, connectgaps: false, hovertemplate: plotText(s.name) + ' %{y}<br>step %{x}<extra></extra>'}));
      const points = g.series.reduce((n, s) => n + s.count, 0);
      div.dataset.points = String(points);
      div.dataset.lastStep = String(Math.max(...g.series.map((s) => s.steps.length ? s.steps[s.steps.length - 1] : 0)));
      drawn.push(plot(div, traces.concat(markerTraces(data.markers)), {
        title: {text: plotText(g.title), x: 0.01, font: {size: 14}}, xaxis: {title: {text: 'step'}},
        yaxis: {type: logScale(g.series) ? 'log' : 'linear'},
        yaxis2: {overlaying: 'y', range: [0, 1], visible: false, fixedrange: true},
        shapes: markerLines(data.markers)}));
    }
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
      {barmode: 'stack', height: 170, xaxis: {title: {text: '% of training time'}, range: [0, 100]}}));
      const t = p.throughput || {}, st = p.step_time_ms || {};
      parts.push(el('p', {text: `${p.num_steps} steps in ${duration(p.wall_s)}; ${num(t.steps_per_s)} steps/s` +
        (t.samples_per_s ? `, ${num(t.samples_per_s)} samples/s` : '') + (t.tokens_per_s ? `, ${num(t.tokens_per_s)} tokens/s` : '') +
        (st.median ? `; step time median ${num(st.median)} ms, p90 ${num(st.p90)} ms` : '') + `; device ${p.device || '?'}`}));
    } else {
      parts.push(el('p', {cls: 'muted', text: 'no profile yet: the profiler writes its summary when the run ends'}));
    }
    if (data.timeline && data.timeline.length) {
      const samples = data.timeline.map((s) => {  // each GPU's use as keys of its own
        const flat = Object.assign({}, s);
        (s.gpus || []).forEach((g, i) => { flat[`gpu${i}_util_pct`] = g.util_pct; flat[`gpu${i}_mem_used_mb`] = g.mem_used_mb; });
        return flat;
      });
      const t = samples.map((s) => s.t);
      const rate = chartBox({id: 'throughput', cls: 'chart'});
      const system = chartBox({id: 'system', cls: 'chart'});
      parts.push(rate, system);
      const split = ['data', 'compute', 'checkpoint', 'eval', 'other'].filter((k) => samples.some((s) => s[`${k}_pct`] !== undefined));
      if (split.length) {  // where each interval's time went, over the run
        const over = chartBox({id: 'split', cls: 'chart'});
        parts.push(over);
        requestAnimationFrame(() => plot(over, split.map((k) => ({type: 'scatter', mode: 'lines', stackgroup: 'split', name: k,
          x: t, y: samples.map((s) => s[`${k}_pct`] || 0), hovertemplate: `${k}: %{y:.1f}%<extra></extra>`})),
        {title: {text: 'step time split over the run', x: 0.01, font: {size: 14}}, xaxis: {title: {text: 'seconds'}},
          yaxis: {title: {text: '% of wall time'}}, margin: {l: 55, r: 20, t: 30, b: 40}}));
      }
      const keys = [...new Set(samples.flatMap(Object.keys))]
        .filter((k) => /^(cpu_pct|system_cpu_pct|rss_mb|gpu\d+_(util_pct|mem_used_mb))$/.test(k));
      requestAnimationFrame(() => {
        plot(rate, ['steps_per_s', 'samples_per_s', 'tokens_per_s'].filter((k) => samples.some((s) => s[k])).map((k) => ({type: 'scatter', name: k, x: t, y: samples.map((s) => s[k]), yaxis: k === 'steps_per_s' ? 'y' : 'y2'})),
          {title: {text: 'throughput', x: 0.01, font: {size: 14}}, xaxis: {title: {text: 'seconds'}},
            margin: {l: 55, r: 70, t: 30, b: 40}, yaxis: {title: {text: 'steps/s'}},
            yaxis2: {overlaying: 'y', side: 'right', title: {text: 'samples or tokens/s'}}});
        plot(system, keys.map((k) => ({type: 'scatter', name: k, x: t, y: samples.map((s) => s[k]),
          yaxis: /_mb/.test(k) ? 'y2' : 'y'})), {title: {text: 'CPU / GPU / memory', x: 0.01, font: {size: 14}},
          xaxis: {title: {text: 'seconds'}}, yaxis: {title: {text: '%'}}, margin: {l: 55, r: 70, t: 30, b: 40},
          yaxis2: {overlaying: 'y', side: 'right', title: {text: 'MB'}}});
      });
    }
    return section('Where the time went', ...parts);
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
    if (data.cost_over_time.length > 1) {
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
      el('tr', {'data-kind': e.kind}, el('td', {text: e.step}), el('td', {text: e.kind}), el('td', {text: e.name}),
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
    APP.replaceChildren(runSummary(data.run, data.verdict),
      section('Curves and events', el('p', {cls: 'muted', text: 'markers on top: ' + Object.keys(COLORS).join(', ') +
        '; hover one to read it'}), curves),
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
    setTitle('compare ' + data.runs.map((r) => r.run.name).join(', '));
    const names = [...new Set(data.runs.flatMap((r) => r.series.map((s) => s.name)))].sort();
    const charts = names.map((n) => chartBox({cls: 'chart curve', 'data-metric': n}));
    const head = ['key', ...data.runs.map((r) => `${r.run.name} (${r.run.id})`)];
    const rows = data.config.map((row) => el('tr', {cls: row.differs ? 'diff' : ''}, el('td', {text: row.key}),
      row.values.map((v) => el('td', {text: v === undefined ? '' : JSON.stringify(v)}))));
    APP.replaceChildren(section('Runs', el('ul', {}, data.runs.map((r) => el('li', {}, runLink(r.run.id, r.run.name),
      ` ${r.run.status}, ${r.run.step} steps, ${usd(r.run.cost_usd)}`)))),
    section('Curves', ...charts), section('Config (differences highlighted)', table(head, rows, {id: 'config'})));
    names.forEach((n, i) => plot(charts[i], data.runs.map((r) => r.series.find((s) => s.name === n)).map((s, j) => s && ({
      type: 'scatter', mode: 'lines', name: plotText(`${data.runs[j].run.name} (${data.runs[j].run.id})`), x: s.steps, y: s.values,
    })).filter(Boolean), {title: {text: plotText(n), x: 0.01, font: {size: 14}}, xaxis: {title: {text: 'step'}}}));
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
