// The report page's script (octlm_analysis.page): sortable and filterable tables, the sweep
// picker, the plots, and the reload of a live page (--watch). Its data: the JSON blocks
// report-data and report-catalogs.
const DATA = JSON.parse(document.getElementById('report-data').textContent);
const KEY = 'octlm-report:' + location.pathname;
let catalogs = null;  // every sweep's points, parsed when first needed
function catalog(experiment) {
  catalogs ??= JSON.parse(document.getElementById('report-catalogs').textContent);
  return catalogs[experiment] || {};
}

function number(text) {
  const value = parseFloat(text.replace(/,/g, ''));
  return isNaN(value) || !/^[\s\d.,eE+-]+$/.test(text) ? null : value;
}

function sortable(table) {
  table.querySelectorAll('th').forEach((head, column) => head.addEventListener('click', () => {
    const body = table.tBodies[0];
    const down = head.classList.contains('asc');
    table.querySelectorAll('th').forEach(h => h.classList.remove('asc', 'desc'));
    head.classList.add(down ? 'desc' : 'asc');
    const rows = [...body.rows].map(row => [row.cells[column]?.textContent ?? '', row]);
    rows.sort(([a], [b]) => {
      const x = number(a), y = number(b);
      const order = x !== null && y !== null ? x - y
        : a.localeCompare(b, undefined, {numeric: true});
      return down ? -order : order;
    });
    rows.forEach(([, row]) => body.appendChild(row));
  }));
}

function filterable(table) {
  // Each word must hold: NAME=VALUE, the cell of column NAME is VALUE; any other word appears
  // somewhere in the row.
  const box = document.createElement('input');
  box.className = 'filter';
  box.placeholder = 'filter: length=1024 sdpa (every word must hold)';
  const names = [...table.rows[0].cells].map(cell => cell.textContent.trim());
  box.addEventListener('input', () => {
    const tests = box.value.trim().split(/\s+/).filter(Boolean).map(word => {
      const [name, ...rest] = word.split('='), column = names.indexOf(name);
      if (rest.length && column >= 0) {
        const value = rest.join('=');
        return row => (row.cells[column]?.textContent ?? '').trim() === value;
      }
      return row => row.textContent.toLowerCase().includes(word.toLowerCase());
    });
    for (const row of table.tBodies[0].rows) row.hidden = !tests.every(test => test(row));
  });
  table.before(box);
}

function enhance(root) {
  root.querySelectorAll('table.data').forEach(table => { sortable(table); filterable(table); });
}

function element(tag, text) {
  const made = document.createElement(tag);
  if (text !== undefined) made.textContent = text;
  return made;
}

function showSweep(picker) {
  const experiment = picker.dataset.experiment;
  const box = document.querySelector(`.picked[data-experiment="${CSS.escape(experiment)}"]`);
  box.replaceChildren();
  const entry = catalog(experiment)[picker.value];
  if (!entry) return;
  const header = element('p');
  header.className = 'provenance';
  header.innerHTML = entry.header;
  const table = element('table');
  table.className = 'data';
  const head = table.createTHead().insertRow();
  entry.columns.forEach(column => head.appendChild(element('th', column)));
  const body = table.createTBody();
  entry.rows.forEach(values => {
    const row = body.insertRow();
    values.forEach(value => {
      const cell = row.insertCell();
      cell.textContent = value;
      if (value.length > 40) { cell.className = 'long'; cell.title = value; }  // LONG_TEXT
    });
  });
  box.append(header, table);
  enhance(box);
}

function state() {
  const pickers = {}, filters = [];
  document.querySelectorAll('select.sweep-picker')
    .forEach(p => { pickers[p.dataset.experiment] = p.value; });
  document.querySelectorAll('input.filter').forEach(f => filters.push(f.value));
  return {y: window.scrollY, pickers, filters};
}

function restore() {
  const saved = JSON.parse(sessionStorage.getItem(KEY) || 'null');
  if (!saved) return;
  sessionStorage.removeItem(KEY);
  document.querySelectorAll('select.sweep-picker').forEach(p => {
    const value = saved.pickers[p.dataset.experiment];
    if (value && catalog(p.dataset.experiment)[value]) { p.value = value; showSweep(p); }
  });
  document.querySelectorAll('input.filter').forEach((f, i) => {
    if (saved.filters[i]) { f.value = saved.filters[i]; f.dispatchEvent(new Event('input')); }
  });
  window.scrollTo(0, saved.y);
}

function poll() {
  const probe = document.createElement('script');
  probe.src = 'stamp.js?' + Date.now();
  probe.onload = () => {
    probe.remove();
    if (window.reportStamp && window.reportStamp !== DATA.stamp) {
      sessionStorage.setItem(KEY, JSON.stringify(state()));
      location.reload();
    }
  };
  probe.onerror = () => probe.remove();
  document.head.appendChild(probe);
}

enhance(document);
document.querySelectorAll('select.sweep-picker')
  .forEach(p => p.addEventListener('change', () => showSweep(p)));
function runFilter(div) {
  // A figure of runs' curves (octlm_analysis.curves; each trace's meta names its run): a box
  // above it that shows only the runs whose names hold every word (lr=0.01: a setting exactly).
  const box = document.createElement('input');
  box.className = 'filter runs';
  box.placeholder = 'show runs: lr=0.01 width=8 (every word must hold)';
  box.addEventListener('input', () => {
    const words = box.value.trim().toLowerCase().split(/\s+/).filter(Boolean);
    const visible = div.data.map(trace => {
      const name = String(trace.meta ?? '').toLowerCase(), said = name.split(/[\s·]+/);
      return !trace.meta || words.every(w => w.includes('=') ? said.includes(w) : name.includes(w));
    });
    Plotly.restyle(div, {visible});
  });
  const cell = document.createElement('div');
  div.before(cell);
  cell.append(box, div);
}

const config = {responsive: true, displaylogo: false};
const drawn = [...document.querySelectorAll('div.plot')].map(div => {
  const figure = DATA.figures[+div.dataset.figure];
  if (figure.layout.meta?.runs > 1) runFilter(div);
  return Plotly.newPlot(div, figure.data, figure.layout, config);
});
Promise.allSettled(drawn).then(() => {
  restore();
  document.body.dataset.drawn = 'yes';
  if (DATA.stamp) setInterval(poll, DATA.poll_ms);
});
