(function () {
  'use strict';
  var D = JSON.parse(document.getElementById('report-data').textContent);
  function el(tag, attrs, kids) {
    var n = document.createElement(tag);
    if (attrs) { Object.keys(attrs).forEach(function (k) {
      if (k === 'text') { n.textContent = attrs[k]; } else if (k === 'cls') { n.className = attrs[k]; }
      else { n.setAttribute(k, attrs[k]); } }); }
    (kids || []).forEach(function (c) { if (c !== null && c !== undefined) {
      n.appendChild(typeof c === 'string' ? document.createTextNode(c) : c); } });
    return n;
  }
  function num(v) { return v === 'inf' ? Infinity : (v === '-inf' ? -Infinity : v); }
  function fmt(v, col) {
    if (v === null || v === undefined || v === '') { return ''; }
    v = num(v);
    if (typeof v !== 'number') { return String(v); }
    if (!isFinite(v)) { return v > 0 ? 'inf' : '-inf'; }
    if (col === 'cosine') { return v.toFixed(6); }
    if (col === 'n') { return String(v); }
    if (v === 0) { return '0'; }
    if (Math.abs(v) < 1e-3 || Math.abs(v) >= 1e6) { return v.toExponential(2); }
    return Number(v.toPrecision(3)).toString();
  }
  function pct(x) { return (100 * x).toFixed(0) + '%'; }
  function section(id) { return document.getElementById(id); }

  function drawHeader() {
    var s = section('sources');
    s.appendChild(el('div', {cls: 'mono'}, ['target:   ' + D.target + '  (' + D.frameworks[0] + ', ' + D.tasks[0] + ')']));
    s.appendChild(el('div', {cls: 'mono'}, ['baseline: ' + D.baseline + '  (' + D.frameworks[1] + ', ' + D.tasks[1] + ')']));
    s.appendChild(el('div', {cls: 'mono'}, ['mapping:  ' + (D.mapping.length ? D.mapping.join(', ') : 'none')]));
    s.appendChild(el('div', {cls: 'muted'}, [D.tool + ', ' + D.generated + '; every pair: ' + D.csv]));
    var v = section('verdict');
    var cls = D.verdict === 'diverged' ? 'v-diverged' : (D.verdict === 'within thresholds' ? 'v-ok' : 'v-warn');
    v.appendChild(el('div', {cls: 'verdict ' + cls, id: 'headline', text: D.headline}));
    D.findings.forEach(function (a) { v.appendChild(el('div', {cls: 'verdict v-diverged', text: a})); });
    D.advice.forEach(function (a) { v.appendChild(el('div', {cls: 'note', text: 'Check: ' + a})); });
    (D.warnings || []).forEach(function (a) { v.appendChild(el('div', {cls: 'note warning', text: 'Warning: ' + a})); });
    D.notes.forEach(function (a) { v.appendChild(el('p', {cls: 'muted', text: a})); });
    if (D.unpaired.length) { v.appendChild(el('div', {cls: 'note', text: 'No baseline partner for: ' + D.unpaired.join(', ')})); }
  }

  function drawCoverage() {
    var c = D.coverage, s = section('coverage');
    s.appendChild(el('p', {cls: 'muted', text: 'A verdict needs ' + pct(c.minimum) +
      ' of the comparable activations compared in each direction (comparable: all but the tensors the mapping ' +
      'or the model gives no counterpart).'}));
    var head = ['part', 'compared', 'of the target', 'of the comparable', 'on statistics', 'no partner',
                'by design', 'not comparable', 'baseline used'];
    var t = el('table', {id: 'coverage-table'}, [el('thead', null, [el('tr', null, head.map(function (h) { return el('th', {text: h}); }))])]);
    var body = el('tbody');
    c.parts.forEach(function (p) {
      var bar = el('span', {cls: 'barbg'}, [el('span', {cls: 'bar', style: 'width:' + Math.round(120 * p.fraction) + 'px'})]);
      body.appendChild(el('tr', null, [el('td', {text: p.label}), el('td', null, [bar, p.compared + ' of ' + p.target_tensors]),
        el('td', {cls: 'num', text: pct(p.fraction)}), el('td', {cls: 'num', text: p.comparable ? pct(p.comparable_fraction) : ''}),
        el('td', {cls: 'num', text: String(p.on_statistics)}), el('td', {cls: 'num', text: String(p.no_partner)}),
        el('td', {cls: 'num', text: String(p.by_design)}), el('td', {cls: 'num', text: String(p.not_comparable)}),
        el('td', {cls: 'num', text: p.baseline_tensors ? p.baseline_used + ' of ' + p.baseline_tensors + ' (' + pct(p.baseline_fraction) + ')' : ''})]));
    });
    t.appendChild(body); s.appendChild(t);
    var reasons = c.not_compared.concat(c.statistics_fallback);
    if (reasons.length) {
      s.appendChild(el('h3', {text: 'Not compared, by reason'}));
      var ul = el('ul');
      reasons.forEach(function (r) {
        var cls = r['class'].replace(/_/g, ' ');
        ul.appendChild(el('li', null, [el('b', {text: String(r.count)}), ' [' + cls + ', ' + r.kind + '] ' + r.reason]));
      });
      s.appendChild(ul);
    }
  }

  function tensorTable(rows) {
    var cols = ['slot', 'kind', 'status', 'basis', 'cosine', 'rel_err', 'max_abs_err', 'stat_rel', 'baseline_slot', 'baseline_transform', 'reason'];
    var t = el('table', {cls: 'tensors'}, [el('thead', null, [el('tr', null, cols.map(function (h) { return el('th', {text: h}); }))])]);
    var body = el('tbody');
    rows.forEach(function (r) {
      body.appendChild(el('tr', null, cols.map(function (c) {
        var isNum = ['cosine', 'rel_err', 'max_abs_err', 'stat_rel'].indexOf(c) >= 0;
        return el('td', {cls: isNum ? 'num' : (c === 'status' ? 's-' + r[c] : ''), text: fmt(r[c], c)});
      })));
    });
    t.appendChild(body);
    return t;
  }

  function drawFirst() {
    var f = D.first, s = section('first');
    if (!f) { s.appendChild(el('p', {id: 'first-text', text: 'No activation diverged.'})); return; }
    s.appendChild(el('p', {id: 'first-text'}, [el('b', {text: f.cell}), ' (' + f.direction + ', step ' +
      (f.step === null ? '-' : f.step) + ', ' + f.rank_text + ', ' + f.folder + ')']));
    s.appendChild(el('div', {cls: 'mono', text: 'entry:    ' + f.name}));
    s.appendChild(el('div', {cls: 'mono', text: 'baseline: ' + (f.baseline || '-')}));
    if (f.cause) { s.appendChild(el('div', {cls: 'note', id: 'cause', text: f.cause})); }
    if (f.inputs_differ && f.last_ok) { s.appendChild(el('div', {cls: 'muted', text: 'Last cell within thresholds before it: ' + f.last_ok})); }
    if (f.inputs_differ && f.upstream_unpaired.length) {
      s.appendChild(el('h3', {text: 'Not compared between the last cell within thresholds and this one'}));
      var ul = el('ul', {id: 'upstream'});
      f.upstream_unpaired.forEach(function (u) { ul.appendChild(el('li', null, [el('span', {cls: 'mono', text: u.name}), ' - ' + u.reason])); });
      s.appendChild(ul);
    }
    s.appendChild(el('h3', {text: 'Its tensors (inputs, outputs, own weights)'}));
    s.appendChild(tensorTable(f.tensors));
    if (f.parents.length) {
      s.appendChild(el('h3', {text: 'Parents'}));
      var pl = el('ul', {id: 'parents'});
      f.parents.forEach(function (p) { pl.appendChild(el('li', null, [el('b', {text: p.cell}), ' ', el('span', {cls: 's-' + (p.status === 'not compared' ? 'skipped' : p.status), text: p.status}), ': ' + p.why])); });
      s.appendChild(pl);
    }
    if (f.next.length) {
      s.appendChild(el('h3', {text: 'Next divergent cells'}));
      var nl = el('ul');
      f.next.forEach(function (x) {
        var m = x.basis === 'statistics' ? 'stat_rel ' + fmt(x.stat_rel) : 'cosine ' + fmt(x.cosine, 'cosine') + ', rel_err ' + fmt(x.rel_err);
        nl.appendChild(el('li', null, [x.direction + ' ', el('span', {cls: 'mono', text: x.name}), ' - ' + m]));
      });
      s.appendChild(nl);
    }
  }

  function drawWeights() {
    var s = section('weights');
    s.appendChild(el('p', {cls: 'muted', text: 'A weight that differs when the step starts is a different diagnosis ' +
      '(conversion, loading, an optimizer step) from a computation that differs.'}));
    [['weight', 'Weights'], ['weight_grad', 'Weight gradients']].forEach(function (k) {
      var w = D.weights[k[0]];
      if (!w) { return; }
      var compared = w.ok + w.diverged;
      var line = k[1] + ': ' + compared + ' compared, ' + w.diverged + ' differ, ' + w.skipped + ' not compared';
      s.appendChild(el('p', {cls: w.diverged ? 's-diverged' : '', text: line}));
      if (w.first) {
        s.appendChild(el('div', {cls: 'mono', text: 'first: ' + w.first.cell + ' ' + w.first.metrics.slot + '  (' + w.first.name + ')'}));
        s.appendChild(tensorTable(w.first.tensors.filter(function (t) { return t.kind === k[0]; })));
      }
    });
  }

  var SVGNS = 'http://www.w3.org/2000/svg';
  function svg(tag, attrs) { var n = document.createElementNS(SVGNS, tag);
    Object.keys(attrs || {}).forEach(function (k) { n.setAttribute(k, attrs[k]); }); return n; }
  function drawChart() {
    var s = section('chart'), L = D.chart.layers, lim = D.limits;
    if (!L.labels.length) { s.appendChild(el('p', {text: 'No compared activation belongs to a depth group.'})); return; }
    var series = [['1 - cosine', function (r) { return r.cosine === null ? null : 1 - r.cosine; }, '#2f6fd6', 1 - lim.cosine],
                  ['rel_err', function (r) { return r.rel_err; }, '#e07b00', lim.rel_err],
                  ['stat_rel (statistics)', function (r) { return r.stat_rel; }, '#1f9d55', lim.stat_rel]];
    var leg = el('div', {cls: 'legend'});
    series.forEach(function (sr) { leg.appendChild(el('span', {style: 'color:' + sr[2], text: '\u25cf ' + sr[0] + ' (dashed: ' + lim.dtype + ' threshold ' + fmt(sr[3]) + ')'})); });
    s.appendChild(leg);
    ['forward', 'backward'].forEach(function (dir) { s.appendChild(chartPanel(dir, L, series)); });
  }
  function chartPanel(dir, L, series) {
    // Rotated x-axis labels need room below the axis and, for the first, left of it: from their length
    // (about 6 px a character at font size 10), so none is clipped; a label is cut at 48 characters.
    var n = L.labels.length, every = Math.max(1, Math.ceil(n / 40));
    var names = L.labels.map(function (lab) { return lab.length > 48 ? lab.slice(0, 22) + '\u2026' + lab.slice(-25) : lab; });
    var longest = names.reduce(function (m, lab) { return Math.max(m, lab.length); }, 0);
    var W = 1200, right = 12, top = 14, bottom = Math.max(70, Math.ceil(longest * 6 * 0.643) + 24), left = 110;
    var step = n > 1 ? (W - left - right) / (n - 1) : 0;
    names.forEach(function (lab, i) { if (i % every === 0) { left = Math.max(left, Math.ceil(lab.length * 6 * 0.766 - i * step) + 8); } });
    var H = 160 + bottom;
    var pts = L[dir] || [], lo = 1e-9, hi = 1;
    series.forEach(function (sr) { if (sr[3] > 0) { lo = Math.min(lo, sr[3] / 10); hi = Math.max(hi, sr[3]); }
      pts.forEach(function (r) { var v = num(sr[1](r)); if (v !== null && isFinite(v) && v > 0) { lo = Math.min(lo, v); hi = Math.max(hi, v); } }); });
    lo = Math.pow(10, Math.floor(Math.log10(Math.max(lo, 1e-12)))); hi = Math.pow(10, Math.ceil(Math.log10(hi)));
    var decades = Math.round(Math.log10(hi) - Math.log10(lo)), tick = Math.max(1, Math.ceil(decades / 6));
    function X(i) { return left + (n === 1 ? (W - left - right) / 2 : i * (W - left - right) / (n - 1)); }
    function Y(v) { v = Math.max(v, lo); return top + (Math.log10(hi) - Math.log10(v)) * (H - top - bottom) / (Math.log10(hi) - Math.log10(lo)); }
    var g = svg('svg', {viewBox: '0 0 ' + W + ' ' + H, width: '100%', role: 'img', 'aria-label': dir + ' per-layer chart', 'class': 'chart', 'data-direction': dir});
    for (var e = Math.round(Math.log10(hi)); e >= Math.round(Math.log10(lo)); e -= tick) {
      g.appendChild(svg('line', {x1: left, x2: W - right, y1: Y(Math.pow(10, e)), y2: Y(Math.pow(10, e)), stroke: '#eceef1'}));
      var t = svg('text', {x: left - 6, y: Y(Math.pow(10, e)) + 4, 'text-anchor': 'end', 'font-size': 10, fill: '#5b6670'}); t.textContent = '1e' + e; g.appendChild(t);
    }
    var title = svg('text', {x: left, y: 11, 'font-size': 12, 'font-weight': 600}); title.textContent = dir; g.appendChild(title);
    var f = D.first;
    if (f && f.direction === dir && f.step === D.chart.step && (f.group === null ? f.rank : f.group) === D.chart.rank) {
      var li = -1; L.labels.forEach(function (lab, i) { if (f.cell === lab || f.cell.indexOf(lab + '.') === 0) { li = i; } });
      if (li >= 0) { g.appendChild(svg('line', {x1: X(li), x2: X(li), y1: top, y2: H - bottom, stroke: '#c62828', 'stroke-dasharray': '5,3'}));
        var m = svg('text', {x: X(li) + 4, y: top + 10, 'font-size': 11, fill: '#c62828'}); m.textContent = 'first divergence: ' + f.cell; g.appendChild(m); }
    }
    series.forEach(function (sr) {
      if (sr[3] > 0) { g.appendChild(svg('line', {x1: left, x2: W - right, y1: Y(sr[3]), y2: Y(sr[3]), stroke: sr[2], 'stroke-dasharray': '6,4', 'class': 'threshold'})); }
      var d = '', first = true;
      pts.forEach(function (r) { var v = num(sr[1](r)); if (v === null || !isFinite(v)) { return; }
        d += (first ? 'M' : 'L') + X(r.x).toFixed(1) + ',' + Y(Math.max(v, lo)).toFixed(1); first = false;
        var c = svg('circle', {cx: X(r.x), cy: Y(Math.max(v, lo)), r: 3, fill: sr[2]});
        var tt = svg('title', {}); tt.textContent = r.layer + ': ' + sr[0] + ' ' + fmt(v); c.appendChild(tt); g.appendChild(c); });
      if (d) { g.appendChild(svg('path', {d: d, fill: 'none', stroke: sr[2], 'stroke-width': 1.2})); }
    });
    L.labels.forEach(function (lab, i) { if (i % every) { return; }
      var t = svg('text', {x: X(i), y: H - bottom + 12, 'font-size': 10, 'text-anchor': 'end', 'class': 'xlabel', transform: 'rotate(-40 ' + X(i) + ',' + (H - bottom + 12) + ')'});
      t.textContent = names[i]; var full = svg('title', {}); full.textContent = lab; t.appendChild(full); g.appendChild(t); });
    return g;
  }

  function heatColor(v) {
    if (v === null || v === undefined) { return '#e9ecef'; }
    v = num(v);
    if (v > 1) { var a = Math.min(1, 0.35 + Math.log10(v) / 3); return 'rgba(198,40,40,' + a.toFixed(2) + ')'; }
    var g = Math.max(0, Math.min(1, (Math.log10(Math.max(v, 1e-6)) + 6) / 6));
    return 'rgba(30,123,58,' + (0.15 + 0.5 * g).toFixed(2) + ')';
  }
  function drawHeatmap() {
    var s = section('heatmap'), H = D.heatmap;
    if (!H) { s.style.display = 'none'; return; }
    s.appendChild(el('p', {cls: 'muted', text: 'Per rank folder and depth group: ' + H.metric + '. Grey: not compared.'}));
    H.panels.forEach(function (p) {
      s.appendChild(el('h3', {text: p.title}));
      var t = el('table', {cls: 'heat'});
      t.appendChild(el('tr', null, [el('th')].concat(H.columns.map(function (c) { return el('th', {title: c, text: c.split('.').pop()}); }))));
      H.rows.forEach(function (r, i) {
        t.appendChild(el('tr', null, [el('td', {cls: 'rowlabel', text: r})].concat(p.values[i].map(function (v, j) {
          return el('td', {style: 'background:' + heatColor(v), title: r + ' ' + H.columns[j] + ': ' + fmt(v)});
        }))));
      });
      s.appendChild(el('div', {style: 'overflow:auto'}, [t]));
    });
  }

  // sortCol -1: the first order, diverged pairs first (the first divergence on top), each part in execution order
  var T = D.table, view = [], sortCol = -1, sortDir = 1, shown = 500;
  var texts = T.rows.map(function (r) { return r.join(' ').toLowerCase(); });
  function cmp(a, b) {
    a = num(a); b = num(b);
    if (a === null || a === undefined || a === '') { return 1; }
    if (b === null || b === undefined || b === '') { return -1; }
    if (typeof a === 'number' && typeof b === 'number') { return sortDir * (a - b); }
    return sortDir * String(a).localeCompare(String(b));
  }
  var fi = T.columns.indexOf('folder'), ei = T.columns.indexOf('entry');
  function firstRank(r) {  // the first divergence's diverged rows, then its others; other diverged pairs; the rest
    var diverged = r[T.columns.indexOf('status')] === 'diverged';
    if (D.first && r[ei] === D.first.name && r[fi] === D.first.folder) { return diverged ? 0 : 1; }
    return diverged ? 2 : 3;
  }
  function applyFilter() {
    var words = document.getElementById('filter').value.toLowerCase().split(/\s+/).filter(Boolean);
    var st = document.getElementById('status-filter').value, kind = document.getElementById('kind-filter').value;
    var si = T.columns.indexOf('status'), ki = T.columns.indexOf('kind');
    view = [];
    T.rows.forEach(function (r, i) {
      if (st && r[si] !== st) { return; }
      if (kind && r[ki] !== kind) { return; }
      for (var w = 0; w < words.length; w++) { if (texts[i].indexOf(words[w]) < 0) { return; } }
      view.push(r);
    });
    view.sort(function (a, b) {
      if (sortCol >= 0) { return cmp(a[sortCol], b[sortCol]); }
      var da = firstRank(a), db = firstRank(b);
      return da !== db ? da - db : a[0] - b[0];
    });
    shown = 500;
    renderRows();
  }
  function renderRows() {
    var body = document.getElementById('pairs-body');
    while (body.firstChild) { body.removeChild(body.firstChild); }
    var frag = document.createDocumentFragment();
    view.slice(0, shown).forEach(function (r) {
      frag.appendChild(el('tr', null, r.map(function (v, j) {
        var c = T.columns[j];
        var cls = typeof num(v) === 'number' ? 'num' : (c === 'status' ? 's-' + v : (c === 'entry' || c === 'baseline_entry' ? 'mono' : (c === 'reason' ? 'wrap' : '')));
        return el('td', {cls: cls, text: fmt(v, c)});
      })));
    });
    body.appendChild(frag);
    document.getElementById('count').textContent = view.length + ' matching pairs' + (view.length > shown ? ' (first ' + shown + ' shown)' : '') +
      '; this table holds ' + T.rows.length + ' of ' + T.total + ' pairs (every diverged one), the CSV all of them';
    document.getElementById('more').style.display = view.length > shown ? '' : 'none';
  }
  function drawTable() {
    var head = document.getElementById('pairs-head');
    var tr = el('tr');
    T.columns.forEach(function (c, j) {
      var th = el('th', {text: c, title: 'sort by ' + c});
      th.addEventListener('click', function () { sortDir = sortCol === j ? -sortDir : 1; sortCol = j; applyFilter(); });
      tr.appendChild(th);
    });
    head.appendChild(tr);
    var params = new URLSearchParams(location.hash.replace(/^#/, ''));
    document.getElementById('filter').value = params.get('filter') || '';
    document.getElementById('status-filter').value = params.get('status') || '';
    document.getElementById('kind-filter').value = params.get('kind') || '';
    ['input', 'change'].forEach(function (ev) {
      document.getElementById('filter').addEventListener(ev, applyFilter);
      document.getElementById('status-filter').addEventListener(ev, applyFilter);
      document.getElementById('kind-filter').addEventListener(ev, applyFilter);
    });
    document.getElementById('more').addEventListener('click', function () { shown += 2000; renderRows(); });
    applyFilter();
  }

  drawHeader(); drawCoverage(); drawFirst(); drawWeights(); drawChart(); drawHeatmap(); drawTable();
  document.body.setAttribute('data-ready', '1');
})();
