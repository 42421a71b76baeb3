// Spillway dashboard: plain JavaScript over the /v1 API, with the token the
// person pasted (kept in sessionStorage, never in a cookie). Every value
// from the API is put on the page as text, never as markup.
'use strict';

const TOKEN_KEY = 'spillway.token';
const REFRESH_MS = 10000;
const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === 'class') e.className = v;
    else if (k === 'title') e.title = v;
    else e.setAttribute(k, v);
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

class APIError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

async function api(path) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  const resp = await fetch(path, { headers: { Authorization: 'Bearer ' + token } });
  if (!resp.ok) {
    let msg = resp.statusText;
    try { msg = (await resp.json()).error.message; } catch (e) { /* not JSON */ }
    throw new APIError(resp.status, msg);
  }
  return resp.json();
}

// optional returns null when the endpoint does not exist (404/501) or the
// role may not read it (403), so a section can say so instead of failing.
async function optional(path) {
  try { return await api(path); } catch (e) {
    if (e.status === 404 || e.status === 403 || e.status === 501) return null; // absent here, or not for this role
    throw e;
  }
}

function dur(ms) {
  const s = Math.max(0, Math.floor(ms / 1000));
  if (s < 60) return s + 's';
  const m = Math.floor(s / 60);
  if (m < 60) return m + 'm';
  const h = Math.floor(m / 60);
  if (h < 48) return h + 'h' + (m % 60 ? ' ' + (m % 60) + 'm' : '');
  return Math.floor(h / 24) + 'd ' + (h % 24) + 'h';
}

const gib = (b) => (b / 2 ** 30).toFixed(1) + ' GiB';
const short = (id) => id.length > 12 ? id.slice(-8) : id;

function enteredQueue(j) {
  const h = j.history || [];
  for (let i = h.length - 1; i >= 0; i--) if (h[i].to === 'pending') return new Date(h[i].at);
  return new Date(j.submittedAt);
}

function tile(value, label) {
  return el('div', { class: 'tile' }, el('div', { class: 'v' }, value), el('div', { class: 'k' }, label));
}

function renderSummary(jobs, nodes) {
  let gpus = 0, free = 0, held = 0, ready = 0;
  for (const n of nodes || []) {
    if (n.state === 'ready') ready++;
    for (const c of n.cards || []) {
      gpus++;
      if ((c.jobs || []).length) held++;
    }
    free += n.freeGpus || 0;
  }
  const pending = jobs ? jobs.filter((j) => j.state === 'pending').length : '–';
  const running = jobs ? jobs.filter((j) => j.state !== 'pending').length : '–';
  $('summary').replaceChildren(
    tile(gpus, 'GPUs'), tile(free, 'free GPUs'), tile(held, 'GPUs held'),
    tile(ready + '/' + (nodes || []).length, 'nodes ready'), tile(pending, 'jobs waiting'), tile(running, 'jobs running'));
}

// jobName is a job's name, with its index when it is an array's element
// (eval[7]), as the CLI shows it.
function jobName(j) {
  return (j.spec.name || '') + (j.arrayIndex != null ? '[' + j.arrayIndex + ']' : '');
}

function renderQueue(jobs, now) {
  const body = $('pending').tBodies[0];
  const rows = [];
  const pending = (jobs || []).filter((j) => j.state === 'pending');
  pending.sort((a, b) => (a.spec.queue.localeCompare(b.spec.queue)) ||
    ((a.pendingReason?.position || 1e9) - (b.pendingReason?.position || 1e9)));
  for (const j of pending) {
    const r = j.pendingReason;
    const reason = r
      ? el('span', {}, el('span', { class: 'badge ' + r.code }, r.code), r.message)
      : el('span', { class: 'muted' }, 'not scheduled yet');
    const name = el('span', {}, el('code', { title: j.id }, short(j.id)), ' ', jobName(j));
    const gpus = j.spec.resources.gpus * (j.spec.resources.nodes || 1);
    rows.push(el('tr', { 'data-job': j.id },
      el('td', { class: 'num' }, r?.position || ''), el('td', {}, name), el('td', {}, j.spec.team),
      el('td', {}, j.spec.queue), el('td', {}, j.spec.priority), el('td', { class: 'num' }, gpus),
      el('td', {}, dur(now - enteredQueue(j))), el('td', { class: 'reason' }, reason)));
  }
  body.replaceChildren(...rows);
  $('pending-empty').hidden = rows.length > 0 || jobs === null;
  if (jobs === null) body.replaceChildren(el('tr', {}, el('td', { colspan: 8, class: 'muted' }, 'Your role may not list jobs.')));

  const rb = $('running').tBodies[0];
  const run = (jobs || []).filter((j) => j.state !== 'pending');
  rb.replaceChildren(...run.map((j) => {
    let where = (j.placements || []).map((p) => p.node + ' [' + p.gpus.join(',') + ']').join('; ');
    if (!where && j.machine) where = 'burst machine ' + j.machine;
    const note = j.idleSince
      ? el('span', { class: 'badge idle' }, 'idle since ' + new Date(j.idleSince).toLocaleTimeString())
      : (j.stop ? el('span', { class: 'badge' }, 'stopping: ' + j.stop.reason) : '');
    return el('tr', { 'data-job': j.id },
      el('td', {}, el('code', { title: j.id }, short(j.id)), ' ', jobName(j)), el('td', {}, j.spec.team),
      el('td', {}, j.spec.queue), el('td', {}, j.state), el('td', { class: 'mono' }, where),
      el('td', {}, j.startedAt ? dur(now - new Date(j.startedAt)) : ''), el('td', {}, note));
  }));
  $('running-empty').hidden = run.length > 0;
}

// color maps a fraction 0..1 to a pale-blue → green → strong-green scale.
function color(f) {
  f = Math.max(0, Math.min(1, f));
  return `hsl(${210 - 115 * f}, ${30 + 40 * f}%, ${92 - 50 * f}%)`;
}

function renderHeat(nodes) {
  const mk = (kind) => (nodes || []).map((n) => {
    const cells = (n.cards || []).map((c) => {
      const t = c.telemetry;
      let f = null, label = '–';
      if (t) {
        f = kind === 'compute' ? t.smUtil / 100 : (c.memoryBytes ? t.memoryUsedBytes / c.memoryBytes : 0);
        label = Math.round(f * 100) + '%';
      }
      const cls = ['cell'];
      if ((c.jobs || []).length) cls.push('held');
      if (c.unhealthy) cls.push('bad');
      if (n.state !== 'ready') cls.push('off');
      const tip = [`${n.name} GPU ${c.index} ${c.model}`,
        t ? `compute ${t.smUtil}%, memory ${gib(t.memoryUsedBytes)} of ${gib(c.memoryBytes)}` : 'no telemetry',
        (c.jobs || []).length ? 'held by ' + c.jobs.map((j, i) => j + ' (' + (c.teams || [])[i] + ')').join(', ') : 'free',
        c.unhealthy ? 'unhealthy: ' + c.unhealthy : ''].filter(Boolean).join('\n');
      const cell = el('div', { class: cls.join(' '), title: tip }, label);
      if (f !== null && !c.unhealthy) cell.style.background = color(f);
      return cell;
    });
    return el('div', { class: 'row' }, el('div', { class: 'name', title: n.name + ' (' + n.state + ')' }, n.name), el('div', { class: 'cells' }, ...cells));
  });
  $('heat-compute').replaceChildren(...mk('compute'));
  $('heat-memory').replaceChildren(...mk('memory'));
  if (!(nodes || []).length) $('heat-compute').replaceChildren(el('p', { class: 'muted' }, 'No node has registered.'));
}

function list(v, key) {
  if (!v) return [];
  if (Array.isArray(v)) return v;
  return v[key] || [];
}

function renderInstances(data) {
  const items = list(data, 'instances').filter((m) => !['terminated', 'failed'].includes(m.state));
  if (!items.length) { $('instances').replaceChildren(el('p', { class: 'muted' }, 'No burst machines.')); return; }
  const now = Date.now();
  $('instances').replaceChildren(el('table', {},
    el('thead', {}, el('tr', {}, ...['Machine', 'Provider', 'Type', 'State', 'Age', 'Cost', 'Jobs'].map((h) => el('th', {}, h)))),
    el('tbody', {}, ...items.map((m) => el('tr', {},
      el('td', {}, el('code', {}, m.id)), el('td', {}, m.provider || ''),
      el('td', {}, (m.offer && m.offer.instanceType) || ''),
      el('td', {}, el('span', { class: 'badge' }, m.state)),
      el('td', {}, m.age || (m.createdAt ? dur(now - new Date(m.createdAt)) : '')),
      el('td', { class: 'num' }, m.costSoFar !== undefined ? money(m.costSoFar).toFixed(2) + ' ' + (m.currency || '') : ''),
      el('td', {}, [...(m.runningJobs || []), ...(m.waitingJobs || [])].concat(m.runningJobs || m.waitingJobs ? [] : (m.jobs || [])).map(short).join(', ')))))));
}

function money(v) {
  if (v === null || v === undefined) return 0;
  return typeof v === 'number' ? v : parseFloat(v);
}

function renderBudgets(data) {
  const items = list(data, 'budgets');
  if (!items.length) { $('budgets').replaceChildren(el('p', { class: 'muted' }, 'No burst budgets are set.')); return; }
  $('budgets').replaceChildren(...items.map((b) => {
    const limit = money(b.limit);
    const spent = money(b.spent);
    const committed = money(b.committed ?? (spent + money(b.reserved)));
    const f = limit > 0 ? committed / limit : 1;
    const bar = el('div', { class: 'bar' + (f >= 0.8 ? ' hot' : '') }, el('span', {}));
    bar.firstChild.style.width = Math.min(100, f * 100).toFixed(1) + '%';
    const cur = b.currency || data.currency || '';
    return el('div', {}, el('div', {}, el('strong', {}, b.scope || b.team || 'global'), ' ',
      el('span', { class: 'muted' }, `${spent.toFixed(2)} spent, ${committed.toFixed(2)} committed of ${limit.toFixed(2)} ${cur} this month`)), bar);
  }));
}

const SVG = 'http://www.w3.org/2000/svg';
function svg(tag, attrs) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  return e;
}

// chart draws one series of [time ms, value] over the last 24 h.
function chart(target, pts, max, fmt, now) {
  const w = 600, h = 160, l = 44, b = 18;
  const root = svg('svg', { viewBox: `0 0 ${w} ${h}`, preserveAspectRatio: 'none', role: 'img' });
  const t0 = now - 24 * 3600e3;
  const x = (t) => l + (w - l - 4) * (t - t0) / (24 * 3600e3);
  const y = (v) => 4 + (h - b - 8) * (1 - v / (max || 1));
  root.append(svg('line', { class: 'axis', x1: l, y1: y(0), x2: w, y2: y(0) }), svg('line', { class: 'axis', x1: l, y1: y(max), x2: w, y2: y(max) }));
  const top = svg('text', { x: 2, y: y(max) + 8 }); top.textContent = fmt(max); root.append(top);
  const zero = svg('text', { x: 2, y: y(0) }); zero.textContent = fmt(0); root.append(zero);
  for (const hAgo of [24, 18, 12, 6, 0]) {
    const tx = svg('text', { x: Math.min(x(now - hAgo * 3600e3), w - 30), y: h - 4 });
    tx.textContent = hAgo ? `-${hAgo}h` : 'now';
    root.append(tx);
  }
  if (pts.length === 1) {
    root.append(svg('circle', { class: 'dot', cx: x(pts[0][0]).toFixed(1), cy: y(pts[0][1]).toFixed(1), r: 4 }));
    const tx = svg('text', { x: x(pts[0][0]) - 90, y: y(pts[0][1]) + 4 }); tx.textContent = 'now ' + fmt(pts[0][1]); root.append(tx);
  } else if (pts.length) {
    const d = pts.map(([t, v], i) => (i ? 'L' : 'M') + x(t).toFixed(1) + ',' + y(v).toFixed(1)).join('');
    root.append(svg('path', { class: 'area', d: d + `L${x(pts[pts.length - 1][0]).toFixed(1)},${y(0)}L${x(pts[0][0]).toFixed(1)},${y(0)}Z` }));
    root.append(svg('path', { class: 'line', d }));
  } else {
    const tx = svg('text', { x: w / 2 - 40, y: h / 2 }); tx.textContent = 'no telemetry yet'; root.append(tx);
  }
  target.replaceChildren(root);
}

// renderCharts draws the stored points of the last 24 h and, as the last
// point, the cards' latest samples (the minute in progress is not stored
// yet).
async function renderCharts(now, nodes) {
  const to = new Date(now).toISOString().replace(/\.\d+Z$/, 'Z');
  const from = new Date(now - 24 * 3600e3).toISOString().replace(/\.\d+Z$/, 'Z');
  let page = await api(`/v1/telemetry?resolution=m&from=${from}&to=${to}`);
  if (page.truncated) page = await api(`/v1/telemetry?resolution=h&from=${from}&to=${to}`);
  const by = new Map();
  for (const p of page.points) {
    const t = Date.parse(p.start);
    const a = by.get(t) || { util: 0, mem: 0, n: 0 };
    a.util += p.smUtil; a.mem += p.memoryUsedBytes; a.n++;
    by.set(t, a);
  }
  const live = { util: 0, mem: 0, n: 0 };
  let capacity = 0;
  for (const n of nodes || []) for (const c of n.cards || []) {
    capacity += c.memoryBytes || 0;
    if (c.telemetry) { live.util += c.telemetry.smUtil; live.mem += c.telemetry.memoryUsedBytes; live.n++; }
  }
  if (live.n) by.set(now, live);
  const times = [...by.keys()].sort((a, b) => a - b);
  const util = times.map((t) => [t, by.get(t).util / by.get(t).n]);
  const mem = times.map((t) => [t, by.get(t).mem / 2 ** 30]);
  const memMax = Math.max(1, capacity / 2 ** 30, ...mem.map((p) => p[1]));
  chart($('chart-util'), util, 100, (v) => Math.round(v) + '%', now);
  chart($('chart-mem'), mem, memMax, (v) => v.toFixed(0) + ' GiB', now);
}

async function refresh() {
  const now = Date.now();
  try {
    const [jobsPage, nodesPage, instances, budgets] = await Promise.all([
      optional('/v1/jobs?state=pending,provisioning,starting,running&limit=1000'),
      api('/v1/nodes'),
      optional('/v1/instances'),
      optional('/v1/budgets'),
    ]);
    const jobs = jobsPage ? jobsPage.jobs : null;
    renderSummary(jobs, nodesPage.nodes);
    renderQueue(jobs, now);
    renderHeat(nodesPage.nodes);
    renderInstances(instances);
    renderBudgets(budgets);
    await renderCharts(now, nodesPage.nodes);
    $('updated').textContent = 'updated ' + new Date(now).toLocaleTimeString();
  } catch (e) {
    if (e.status === 401) { signOut('Your token was refused.'); return; }
    $('updated').textContent = 'update failed: ' + e.message;
  }
}

let timer = null;

async function start() {
  try {
    const me = await api('/v1/whoami');
    $('who').textContent = me.name + ' (' + me.role + (me.team ? ', team ' + me.team : '') + ')';
  } catch (e) {
    signOut(e.status === 401 ? 'That token was refused.' : 'Cannot reach the broker: ' + e.message);
    return;
  }
  $('login').hidden = true;
  $('app').hidden = false;
  $('logout').hidden = false;
  await refresh();
  clearInterval(timer);
  timer = setInterval(refresh, REFRESH_MS);
}

function signOut(message) {
  sessionStorage.removeItem(TOKEN_KEY);
  clearInterval(timer);
  $('app').hidden = true;
  $('logout').hidden = true;
  $('login').hidden = false;
  $('who').textContent = '';
  $('login-error').textContent = message || '';
}

document.addEventListener('DOMContentLoaded', () => {
  $('login-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $('token').value.trim());
    $('token').value = '';
    start();
  });
  $('logout').addEventListener('click', () => signOut(''));
  // Back from the OIDC login (/v1/login/start): the session is in the
  // fragment, which no server saw; keep it in this tab only.
  if (location.hash.startsWith('#session=')) {
    sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(location.hash.slice('#session='.length)));
    history.replaceState(null, '', location.pathname);
  }
  if (sessionStorage.getItem(TOKEN_KEY)) start();
});
