/* FisherAtlas dashboard: a single page over the public REST API (/v1), plain JS + SVG.
 *
 * Hash routes: #/atlas, #/matrix[?ids=1,2,3], #/task/{id}, #/route, #/jobs.
 * Every data request carries the X-API-Key header from the key field (sessionStorage: gone with the tab).
 * Job progress streams over server-sent events read with fetch() (EventSource cannot send the key header).
 * Stable data-testid attributes are used by tests/service/test_dashboard_browser.py.
 */
(() => {
  "use strict";

  // ------------------------------------------------------------------ constants
  const KEY_STORAGE = "fisherAtlas.apiKey";
  const SVGNS = "http://www.w3.org/2000/svg";
  const API_BASE = (() => {
    const p = window.location.pathname;
    const i = p.lastIndexOf("/dashboard");
    return (i >= 0 ? p.slice(0, i) : "") + "/v1";
  })();
  // Okabe–Ito (colour-blind safe) first, then a few extra distinct hues.
  const PALETTE = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#7A5CC4",
    "#8C8C3C", "#1B9E9E", "#B24A6B", "#5A7D2B", "#C28A2C"];
  const NO_GROUP = "#a9b1bb";
  const MATRIX_DEFAULT_MAX = 40;  // atlas.vocabulary.MATRIX_DEFAULT_TASKS: the CLI and the library take as many
  const POLL_MS = 1500;
  const RECONTACT_MS = 10 * 60 * 1000;  // how long an upload's panel asks again for a job it lost contact with
  const NEIGHBOUR_CHUNK = 127;  // other tasks per matrix of a task page's neighbours (max_matrix_tasks is 256)
  const SOURCES_SHOWN = 8;  // a task page's recommended sources (k)
  const SOURCE_CANDIDATES = 64;  // nearest tasks by signature compared for them (said on the page)
  const DELETE_ARMED_MS = 5000;  // how long "Delete …? Click again" waits for the second click

  // ------------------------------------------------------------------ DOM helpers
  function setAttrs(node, attrs) {
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") node.setAttribute("class", v);
      else if (k === "text") node.textContent = v;
      else if (k.startsWith("on") && typeof v === "function") node.addEventListener(k.slice(2), v);
      else if (k === "value" && "value" in node && !(node instanceof SVGElement)) node.value = v;
      else if (k === "checked" && "checked" in node) node.checked = !!v;
      else node.setAttribute(k, v === true ? "" : String(v));
    }
  }
  function addKids(node, kids) {
    for (const kid of kids.flat(Infinity)) {
      if (kid === null || kid === undefined || kid === false) continue;
      node.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
    }
  }
  function h(tag, attrs, ...kids) {
    const node = document.createElement(tag);
    setAttrs(node, attrs);
    addKids(node, kids);
    return node;
  }
  function s(tag, attrs, ...kids) {
    const node = document.createElementNS(SVGNS, tag);
    setAttrs(node, attrs);
    addKids(node, kids);
    return node;
  }
  const $ = (sel, root = document) => root.querySelector(sel);

  // ------------------------------------------------------------------ formatting
  function fmt(x, digits = 3) {
    if (x === null || x === undefined || Number.isNaN(Number(x))) return "—";
    return Number(x).toFixed(digits);
  }
  function fmtInt(x) {
    if (x === null || x === undefined || Number.isNaN(Number(x))) return "—";
    return Number(x).toLocaleString("en-US");
  }
  function fmtDate(x) {
    if (!x) return "—";
    const d = new Date(x);
    return Number.isNaN(d.getTime()) ? String(x) : d.toLocaleString();
  }
  function fmtDuration(seconds) {
    if (!Number.isFinite(seconds) || seconds < 0) return "—";
    if (seconds < 60) return `${Math.round(seconds)} s`;
    if (seconds < 3600) return `${Math.floor(seconds / 60)} min ${Math.round(seconds % 60)} s`;
    return `${Math.floor(seconds / 3600)} h ${Math.round((seconds % 3600) / 60)} min`;
  }
  const capitalise = (text) => text.charAt(0).toUpperCase() + text.slice(1);
  // A text's user-perceived characters (grapheme clusters: an emoji sequence joined by ZWJ, a letter with its
  // combining marks, a Devanagari conjunct where the browser's ICU knows them); code points where Intl.Segmenter is
  // missing. A cut in UTF-16 units split surrogate pairs ("��"); a cut between code points splits a 👩‍💻 or a क्ष.
  const GRAPHEMES = typeof Intl !== "undefined" && Intl.Segmenter ? new Intl.Segmenter(undefined, { granularity: "grapheme" }) : null;
  function graphemes(text) {
    const s = String(text ?? "");
    return GRAPHEMES ? Array.from(GRAPHEMES.segment(s), (g) => g.segment) : Array.from(s);
  }
  function truncate(text, n) {  // by graphemes
    const chars = graphemes(text);
    return chars.length > n ? chars.slice(0, n - 1).join("") + "…" : chars.join("");
  }
  // Text drawn in SVG at `px` pixels in the page's font: its width, and the text cut (by graphemes, with "…") to fit
  // `maxWidth` (a cut by a count of characters let wide names run out of the heatmap's label column).
  let measureCtx = null;
  function textWidth(text, px) {
    if (!measureCtx) measureCtx = document.createElement("canvas").getContext("2d");
    if (!measureCtx) return String(text).length * px * 0.6;
    measureCtx.font = `${px}px ${getComputedStyle(document.body).fontFamily}`;
    return measureCtx.measureText(String(text)).width;
  }
  function fitText(text, px, maxWidth) {
    const chars = graphemes(text);
    if (textWidth(chars.join(""), px) <= maxWidth) return chars.join("");
    let lo = 0; let hi = chars.length;  // the most graphemes that fit with the ellipsis
    while (lo < hi) {
      const mid = Math.ceil((lo + hi) / 2);
      if (textWidth(chars.slice(0, mid).join("") + "…", px) <= maxWidth) lo = mid; else hi = mid - 1;
    }
    return chars.slice(0, lo).join("") + "…";
  }
  function pick(obj, ...names) {
    if (!obj) return undefined;
    for (const n of names) if (obj[n] !== undefined && obj[n] !== null) return obj[n];
    return undefined;
  }
  const clamp01 = (x) => Math.max(0, Math.min(1, x));

  // ------------------------------------------------------------------ API
  class ApiError extends Error {
    constructor(code, message, status, detail) {
      super(message);
      this.code = code;
      this.status = status;
      this.detail = detail;
    }
  }
  // JSON.parse rounds an integer beyond 2^53 (a user's metadata: a catalogue number, a 64-bit id): such a value keeps
  // its digits as a string, read from the number's own source text where the browser gives it (JSON.parse source
  // text access; elsewhere it stays the rounded number).
  function exactIntegers(_key, value, context) {
    if (typeof value === "number" && Number.isInteger(value) && !Number.isSafeInteger(value) &&
        context && typeof context.source === "string" && /^-?\d+$/.test(context.source)) return context.source;
    return value;
  }
  function apiKey() {
    try { return window.sessionStorage.getItem(KEY_STORAGE) || ""; } catch (_) { return ""; }
  }
  // The scopes of the key in the key field (GET /v1/keys/current), asked once per key: write controls are disabled
  // for a key without the write scope, with a title saying why. null while unknown (no answer: every control
  // stays on and the API's 401/403 says what is missing).
  // `refused`: the service answered 401 for the key (unknown or revoked: the field said "saved" for a wrong key).
  // `unreachable`: no answer at all (asked again at the next page: the field said "saved" as if checked).
  // `malformed`: the key holds characters no key has (a pasted zero-width space, a letter outside ASCII): fetch
  // refused to send it and the field said the service could not be reached.
  let keyScopes = { key: null, scopes: null, refused: false, unreachable: false, malformed: false };
  async function loadKeyScopes() {
    const key = apiKey();
    if (keyScopes.key === key) return keyScopes.scopes;
    let scopes = null; let refused = false; let unreachable = false; let malformed = false;
    try {
      const me = await api("/keys/current");
      scopes = me && Array.isArray(me.scopes) ? me.scopes : null;
    } catch (err) {
      scopes = null;
      malformed = err instanceof ApiError && err.code === "malformed_key";
      refused = Boolean(key) && err instanceof ApiError && (err.status === 401 || malformed);
      // no answer, or a proxy's or a busy service's (502/503/504, 429): asked again, not shown as checked
      unreachable = !(err instanceof ApiError) || err.code === "network" || err.status >= 500 || err.status === 429;
    }
    keyScopes = { key: unreachable ? null : key, scopes, refused, unreachable, malformed };
    return scopes;
  }
  // A key refused by a later call (revoked while the page is open): the header says so at once (it kept "saved ·
  // read, write" while every call answered 401).
  function keyRefused(key) {
    if (!key || keyScopes.key !== key || keyScopes.refused) return;
    keyScopes = { key, scopes: null, refused: true, unreachable: false, malformed: false };
    showKeyScopes();
  }
  const canWrite = () => !Array.isArray(keyScopes.scopes) || keyScopes.scopes.includes("write") ||
    keyScopes.scopes.includes("admin");
  const READ_ONLY_TITLE = "This API key has the read scope only: enter a key with the write scope above.";
  // A control that calls a write endpoint: disabled, with the reason as its title, for a read-only key.
  function needsWrite(control) {
    if (!canWrite()) {
      control.disabled = true;
      control.title = READ_ONLY_TITLE;
      control.dataset.needsScope = "write";
    }
    return control;
  }
  function showKeyScopes() {
    const state = document.getElementById("keystate");
    if (!state || !apiKey()) return;
    const scopes = keyScopes.scopes;
    state.textContent = keyScopes.malformed ? "saved · not a key: it holds characters no key has"
      : keyScopes.refused ? "saved · not accepted: unknown or revoked key"
      : keyScopes.unreachable ? "saved · not checked: the service cannot be reached"
        : Array.isArray(scopes) ? `saved · ${canWrite() ? scopes.join(", ") : "read only"}` : "saved";
    state.dataset.scopes = Array.isArray(scopes) ? scopes.join(",") : "";
    state.dataset.refused = String(keyScopes.refused);
  }
  async function api(path, { method = "GET", body, signal } = {}) {
    const headers = { Accept: "application/json" };
    const key = apiKey();
    if (key && !/^[\x21-\x7e]+$/.test(key)) {  // a header carries printable ASCII only: fetch threw a TypeError
      throw new ApiError("malformed_key", "The API key holds characters no key has (a space, a letter outside "
        + "ASCII, an invisible character pasted with it): enter the key again in the API key field above.", 0);
    }
    if (key) headers["X-API-Key"] = key;
    if (body !== undefined) headers["Content-Type"] = "application/json";
    let res;
    try {
      res = await fetch(API_BASE + path, {
        method, headers, signal, body: body === undefined ? undefined : JSON.stringify(body),
      });
    } catch (err) {
      if (err && err.name === "AbortError") throw err;
      throw new ApiError("network", `Cannot reach the service (${err && err.message ? err.message : err}).`, 0);
    }
    const text = await res.text();
    let data = null;
    try { data = text ? JSON.parse(text, exactIntegers) : null; } catch (_) { data = null; }
    if (!res.ok) {
      let message = data && typeof data.message === "string" ? data.message : null;
      if (!message && data && typeof data.detail === "string") message = data.detail;
      if (!message) message = `${res.status} ${res.statusText || "error"}`;
      if (res.status === 401) {
        message += " — enter a valid key in the API key field above.";
        keyRefused(key);
      }
      if (res.status === 403) message += " — enter a key with that scope in the API key field above.";
      throw new ApiError((data && data.code) || String(res.status), message, res.status, data && data.detail);
    }
    return data;
  }
  function qs(params) {
    const parts = [];
    for (const [k, v] of Object.entries(params)) {
      if (v === undefined || v === null || v === "") continue;
      parts.push(`${encodeURIComponent(k)}=${encodeURIComponent(v)}`);
    }
    return parts.length ? `?${parts.join("&")}` : "";
  }
  async function listAllTasks(params = {}, cap = 2000) {
    const items = [];
    let offset = 0;
    const limit = 200;
    for (;;) {
      const page = await api(`/tasks${qs({ ...params, limit, offset })}`);
      const got = (page && page.items) || [];
      items.push(...got);
      const total = page && Number.isFinite(page.total) ? page.total : items.length;
      offset += got.length;
      if (!got.length || offset >= total || items.length >= cap) break;
    }
    return items;
  }
  // The tasks of these ids (the map's, at most 256; the list filtered by id, 200 a request).
  async function tasksByIds(ids) {
    const out = [];
    for (let i = 0; i < ids.length; i += 200) {
      const chunk = ids.slice(i, i + 200).map((id) => `id=${encodeURIComponent(id)}`).join("&");
      const page = await api(`/tasks?limit=200&${chunk}`);
      out.push(...((page && page.items) || []));
    }
    return out;
  }
  // What the atlas view shows of a space, read in a bounded number of requests whatever its size: the map, the tasks
  // on it, how many tasks the space has, and those still processing or failed (not on the map). Listing every task
  // (the first version) read only the 2,000 oldest, so past them points had no task and the page stopped refreshing.
  async function atlasData(space) {
    const atlas = await api(`/atlas${qs({ space })}`);
    const where = { space: (atlas && atlas.space_id) ?? space };
    const points = (atlas && atlas.points) || [];
    const [mapped, all, pending, failed] = await Promise.all([
      tasksByIds(points.map((p) => p.task_id)),
      api(`/tasks${qs({ ...where, limit: 1 })}`),
      api(`/tasks${qs({ ...where, status: "pending", limit: 200 })}`),
      api(`/tasks${qs({ ...where, status: "failed", limit: 1 })}`),
    ]);
    const total = (page) => (page && Number.isFinite(page.total) ? page.total : 0);
    return { atlas, mapped, pendingTasks: (pending && pending.items) || [],
      counts: { total: total(all), pending: total(pending), failed: total(failed) } };
  }
  const taskName = (t) => (t && (t.name ?? `task ${t.id}`)) || "";
  const taskSamples = (t) => pick(t, "n_samples", "sample_count", "samples");
  const taskTokens = (t) => pick(t, "n_tokens", "token_count", "tokens");
  const taskMeta = (t) => (t && (t.metadata || t.meta)) || {};
  const taskSpace = (t) => pick(t, "space_id", "space");

  // ------------------------------------------------------------------ page chrome
  const view = () => $("#view");
  // A short confirmation for the next page drawn (a deleted task), in a polite live region.
  let noticeNext = null;
  function showNotice(message) {
    const n = $("#notice");
    n.textContent = message || "";
    n.hidden = !message;
  }
  function showBanner(message) {
    const b = $("#banner");
    if (!message) { b.hidden = true; b.textContent = ""; return; }
    b.textContent = message;
    b.hidden = false;
  }
  function errorBox(err, what) {
    const msg = err instanceof Error ? err.message : String(err);
    return h("div", { class: "error", role: "alert", "data-testid": "error" },
      h("strong", {}, what ? `${what}: ` : "Error: "), msg);
  }
  function emptyState(title, ...lines) {
    return h("div", { class: "empty" }, h("h3", {}, title), lines.map((l) => h("p", { class: "muted" }, l)));
  }
  function statusBadge(status) {
    const st = String(status || "unknown");
    return h("span", { class: `badge st-${st}`, "data-testid": "status-badge" }, st);
  }

  const tooltip = {
    show(evt, content, anchor) {
      const tip = $("#tooltip");
      tip.replaceChildren(...(Array.isArray(content) ? content : [content]).filter((c) => c !== null && c !== undefined && c !== false));
      tip.hidden = false;
      let x; let y;
      if (evt && Number.isFinite(evt.clientX) && (evt.clientX || evt.clientY)) {
        x = evt.clientX; y = evt.clientY;
      } else if (anchor) {
        const r = anchor.getBoundingClientRect();
        x = r.left + r.width / 2; y = r.top + r.height / 2;
      } else { x = 0; y = 0; }
      const tw = tip.offsetWidth; const th = tip.offsetHeight;
      let left = x + 14; let top = y + 14;
      if (left + tw > window.innerWidth - 8) left = x - tw - 14;
      if (top + th > window.innerHeight - 8) top = y - th - 14;
      tip.style.left = `${Math.max(4, left) + window.scrollX}px`;
      tip.style.top = `${Math.max(4, top) + window.scrollY}px`;
    },
    hide() { $("#tooltip").hidden = true; },
  };
  // Escape dismisses the tooltip a focused or hovered mark opened (it covered the marks beside it: WCAG 1.4.13).
  document.addEventListener("keydown", (e) => { if (e.key === "Escape") tooltip.hide(); });
  function kv(rows) {
    return h("dl", { class: "kv" }, rows.filter(Boolean).map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
  }

  // ------------------------------------------------------------------ colour
  function colourGroups(values, { categorical = false } = {}) {
    // values: array of raw group values (null = no group). Returns {colourOf(v), legend:[{label,colour,count}], numeric}
    // categorical: numbers that name groups (cluster ids), never a ramp: more than 12 clusters were drawn from white
    // (cluster 0, invisible on the card) to navy, with neighbouring ids in one colour
    const present = values.filter((v) => v !== null && v !== undefined && v !== "");
    const numeric = !categorical && present.length > 0 && present.every((v) => typeof v === "number");
    const distinct = [...new Set(present.map((v) => (typeof v === "object" ? JSON.stringify(v) : v)))];
    if (numeric && distinct.length > PALETTE.length) {
      const lo = Math.min(...present); const hi = Math.max(...present);
      const f = (v) => (v === null || v === undefined ? NO_GROUP : seqColour(hi > lo ? (v - lo) / (hi - lo) : 0.5));
      return { colourOf: f, legend: [], numeric: { lo, hi } };
    }
    const counts = new Map();
    for (const v of present) {
      const key = typeof v === "object" ? JSON.stringify(v) : v;
      counts.set(key, (counts.get(key) || 0) + 1);
    }
    distinct.sort((a, b) => (typeof a === "number" && typeof b === "number" && distinct.length <= PALETTE.length ? a - b
      : (counts.get(b) - counts.get(a)) || (typeof a === "number" && typeof b === "number" ? a - b
        : String(a).localeCompare(String(b)))));
    const shown = distinct.slice(0, PALETTE.length - (distinct.length > PALETTE.length ? 1 : 0));
    const map = new Map(shown.map((v, i) => [v, PALETTE[i]]));
    const other = distinct.length > shown.length;
    const colourOf = (v) => {
      if (v === null || v === undefined || v === "") return NO_GROUP;
      const key = typeof v === "object" ? JSON.stringify(v) : v;
      return map.get(key) || "#6b7280";
    };
    // each entry's key tells it apart whatever its label (a metadata value "none" or "other", 1 and "1")
    const legend = shown.map((v, i) => ({ key: `v${i}`, label: String(v), colour: map.get(v), count: counts.get(v) }));
    if (other) {
      legend.push({ key: "other", label: "other", colour: "#6b7280",
        count: distinct.slice(shown.length).reduce((a, v) => a + counts.get(v), 0) });
    }
    const none = values.length - present.length;
    if (none) legend.push({ key: "none", label: "none", colour: NO_GROUP, count: none });
    const index = new Map(shown.map((v, i) => [v, `v${i}`]));
    const groupOf = (v) => {  // the key of a value's legend entry
      if (v === null || v === undefined || v === "") return "none";
      return index.get(typeof v === "object" ? JSON.stringify(v) : v) || "other";
    };
    return { colourOf, groupOf, legend, numeric: null };
  }
  // Sequential scale for alignments (0 → pale, 1 → deep blue), interpolated in RGB between stops.
  const SEQ_STOPS = [[247, 251, 255], [208, 225, 242], [148, 196, 223], [74, 152, 201], [23, 100, 171], [8, 48, 107]];
  function seqColour(t) {
    const x = clamp01(Number.isFinite(t) ? t : 0) * (SEQ_STOPS.length - 1);
    const i = Math.min(SEQ_STOPS.length - 2, Math.floor(x));
    const f = x - i;
    const c = SEQ_STOPS[i].map((a, k) => Math.round(a + (SEQ_STOPS[i + 1][k] - a) * f));
    return `rgb(${c[0]},${c[1]},${c[2]})`;
  }

  // ------------------------------------------------------------------ router
  let navSeq = 0;
  let cleanups = [];
  function currentCtx() {
    const id = navSeq;
    return {
      alive: () => id === navSeq,
      onCleanup: (fn) => cleanups.push(fn),
    };
  }
  const ROUTES = [
    [/^\/atlas$/, (ctx) => viewAtlas(ctx), "atlas"],
    [/^\/matrix$/, (ctx, m, q) => viewMatrix(ctx, q), "matrix"],
    [/^\/task\/([^/]+)$/, (ctx, m) => viewTask(ctx, decodedSegment(m[1])), "atlas"],
    [/^\/route$/, (ctx) => viewRoute(ctx), "route"],
    [/^\/jobs$/, (ctx) => viewJobs(ctx), "jobs"],
  ];
  // A task link's id as written ("%E0" is no valid escape: decodeURIComponent threw "URI malformed" onto the page; the
  // task page then says it is no task link).
  function decodedSegment(text) {
    try { return decodeURIComponent(text); } catch (_) { return text; }
  }
  function parseHash() {
    const raw = window.location.hash.replace(/^#/, "") || "/atlas";
    const [path, query = ""] = raw.split("?");
    return { path, query: new URLSearchParams(query) };
  }
  // keepScroll: a redraw of the page shown (its data changed), not a move to another page: the old content stays until
  // the new is drawn, and the page keeps its height until the new page's cards have loaded (KEEP_HEIGHT_MS), so the
  // browser keeps the scroll position (a "Loading…" placeholder collapsed the page to the top mid-upload; a task page
  // drawn with its cards still loading was shorter than the scroll position).
  const KEEP_HEIGHT_MS = 3000;
  // After a page is drawn, for `had`, the element of the old page that had the focus when navigate began (null: the
  // focus was elsewhere — a first load, or a timed redraw of a page the user had left — and nothing moves it): a
  // redraw that only moved it (the add panel outlives the atlas page) gives it back; one that removed it (a Delete
  // button's page) gives it to the new page, from which a keyboard user goes on (it fell to <body>).
  // `toPage`: an action of the old page asked for it (its button was disabled while it ran: the focus had fallen).
  let focusPageNext = false;
  // The element of a redrawn page that stands where `had` stood: itself while connected, else the one of the same id,
  // or of the same task and role (a map mark: focus fell to the page, 130 marks back, when the task list changed).
  // A control inside a task's or a job's row (a task link of the atlas list, a job's Cancel: the Jobs page's timed
  // redraw threw the focus to <body> every 1.5 s, and a keyboard user could not reach a lower Cancel) is found as the
  // element of the same tag, role and link in the redrawn row.
  function counterpart(had) {
    if (!had || had.isConnected) return had;
    if (had.id) return document.getElementById(had.id);
    const row = had.closest("[data-task-id], [data-job-id]");
    if (!row) return null;
    const role = had.getAttribute("data-testid");
    const roleSel = role ? `[data-testid="${CSS.escape(role)}"]` : "";
    const attr = row.hasAttribute("data-task-id") ? "data-task-id" : "data-job-id";
    const rowSel = `[${attr}="${CSS.escape(row.getAttribute(attr))}"]`;
    if (row === had) return view().querySelector(`${rowSel}${roleSel}`);
    const href = had.getAttribute("href");
    const inner = `${had.tagName.toLowerCase()}${roleSel}${href ? `[href="${CSS.escape(href)}"]` : ""}`;
    for (const r of view().querySelectorAll(rowSel)) {
      const el = r.querySelector(inner);
      if (el) return el;
    }
    return null;
  }
  function settleFocus(had, toPage) {
    if ((!had && !toPage) || (document.activeElement && document.activeElement !== document.body)) return;
    const target = counterpart(had);
    if (target && view().contains(target)) target.focus({ preventScroll: true });
    if (!target || document.activeElement !== target) view().focus({ preventScroll: true });
  }
  function navigate({ keepScroll = false } = {}) {
    const v = view();
    v.style.minHeight = keepScroll ? `${v.offsetHeight}px` : "";
    navSeq += 1;
    for (const fn of cleanups.splice(0)) { try { fn(); } catch (_) { /* ignore */ } }
    tooltip.hide();
    showBanner(null);
    showNotice(noticeNext);
    noticeNext = null;
    const { path, query } = parseHash();
    const route = ROUTES.find(([re]) => re.test(path));
    if (!route) { window.location.replace("#/atlas"); return Promise.resolve(); }
    for (const a of document.querySelectorAll("[data-nav]")) {
      if (a.dataset.nav === route[2]) a.setAttribute("aria-current", "page");
      else a.removeAttribute("aria-current");
    }
    const ctx = currentCtx();
    const had = document.activeElement !== view() && view().contains(document.activeElement)
      ? document.activeElement : null;  // focus in the old page
    const toPage = focusPageNext;
    focusPageNext = false;
    if (!keepScroll) view().replaceChildren(h("p", { class: "muted loading" }, "Loading…"));
    // a view that throws before its first await (a malformed escape in #/task/%E0) is shown like a failed one
    return loadKeyScopes().then(() => {
      if (!ctx.alive()) return undefined;
      showKeyScopes();
      return route[1](ctx, path.match(route[0]), query);
    }).then(() => {
      if (!ctx.alive()) return;
      const heading = view().querySelector("h1");  // each page its own title (history, tabs, screen readers)
      document.title = heading && heading.textContent.trim() ? `${heading.textContent.trim()} · FisherAtlas` : "FisherAtlas dashboard";
      settleFocus(had, toPage);  // it stayed on <body>: a keyboard user started over
      if (!keepScroll) return;
      const t = setTimeout(() => { if (ctx.alive()) v.style.minHeight = ""; }, KEEP_HEIGHT_MS);
      ctx.onCleanup(() => clearTimeout(t));
    }).catch((err) => {
      if (!ctx.alive()) return;
      view().replaceChildren(errorBox(err));
      settleFocus(had, toPage);
    });
  }

  // ------------------------------------------------------------------ shared widgets
  function pageHeader(title, subtitle, ...right) {
    return h("div", { class: "page-head" },
      h("div", {}, h("h1", {}, title), subtitle ? h("p", { class: "muted" }, subtitle) : null),
      h("div", { class: "page-tools" }, right));
  }
  function select(id, label, options, value, onchange) {
    return h("label", { class: "field", for: id }, h("span", {}, label),
      h("select", { id, onchange: (e) => onchange(e.target.value) },
        options.map(([v, text]) => h("option", { value: v, selected: String(v) === String(value) }, text))));
  }
  function spacesOf(tasks) {
    return [...new Set(tasks.map(taskSpace).filter((v) => v !== undefined && v !== null))];
  }
  function taskLink(id, name, attrs = {}) {
    return h("a", { href: `#/task/${encodeURIComponent(id)}`, ...attrs }, nameParts(name ?? `task ${id}`));
  }
  // A name with a line-break opportunity (a <wbr>) after each _ - . / and every NAME_RUN graphemes of a longer run
  // without spaces: a narrow column breaks "lama_trex_P19_capital" between its parts, not every few letters ("lam
  // a_tr ex_P"), and a name without separators still wraps instead of widening the page. Words shorter than the run
  // are never cut ("2024" in an Arabic name, a Hindi word: spaces wrap already), and a cut falls between graphemes,
  // never inside an emoji or a conjunct. (No lookbehind: older Safari cannot parse one, and the whole dashboard would
  // not load.)
  const NAME_RUN = 16;
  function nameParts(name) {
    if (typeof name !== "string") return name;
    const out = [];
    for (const part of name.match(/[^_\-./]*[_\-./]+|[^_\-./]+/g) || [name]) {
      if (out.length) out.push(h("wbr", {}));
      let piece = "";
      let run = 0;  // graphemes since the last space or break
      for (const g of graphemes(part)) {
        if (/\s/.test(g)) run = 0;
        else if (run === NAME_RUN) {
          out.push(piece, h("wbr", {}));
          piece = "";
          run = 1;
        } else run += 1;
        piece += g;
      }
      if (piece) out.push(piece);
    }
    return out;
  }

  // ------------------------------------------------------------------ Atlas view
  const atlasState = { colourBy: "cluster", space: "", pickedGroup: null };

  async function viewAtlas(ctx) {
    const [data, spaceList] = await Promise.all([
      atlasData(atlasState.space),
      api("/spaces").then((r) => (Array.isArray(r) ? r : (r && r.items) || [])).catch(() => []),
    ]);
    if (!ctx.alive()) return;
    const { atlas, mapped: tasks, counts } = data;
    // what the add form may append to: every ready task of the space (up to 2,000), not only those on the map (an
    // even sample of a space past 256 tasks)
    const targets = await listAllTasks({ space: (atlas && atlas.space_id) ?? atlasState.space, status: "ready" });
    if (!ctx.alive()) return;
    const byId = new Map(tasks.map((t) => [String(t.id), t]));
    const points = ((atlas && atlas.points) || []).map((p) => ({ ...p, task: byId.get(String(p.task_id)) }));
    const spaceOptions = spaceList.length
      ? spaceList.map((sp) => [String(sp.id), `${sp.id}: ${truncate(sp.model_name || "space", 28)}${sp.default ? " (default)" : ""}`
        + (sp.n_tasks !== undefined && sp.n_tasks !== null ? ` · ${sp.n_tasks} tasks` : "")])
      : spacesOf(tasks).map((sp) => [String(sp), `space ${sp}`]);
    const metaKeys = [...new Set(tasks.flatMap((t) => Object.keys(taskMeta(t))))].sort();

    const root = h("section", { class: "page", "data-testid": "atlas-view" });
    const tools = [];
    if (spaceOptions.length > 1 || atlasState.space) {
      tools.push(select("atlas-space", "Space", [["", "default space"], ...spaceOptions],
        atlasState.space, (v) => { atlasState.space = v; navigate(); }));
    }
    const colourOptions = [["cluster", "cluster"], ["status", "status"], ["mode", "mode"],
      ...metaKeys.map((k) => [`meta:${k}`, `metadata · ${k}`])];
    if (!colourOptions.some(([v]) => v === atlasState.colourBy)) atlasState.colourBy = "cluster";
    tools.push(select("atlas-colour", "Colour by", colourOptions, atlasState.colourBy,
      (v) => { atlasState.colourBy = v; atlasState.pickedGroup = null; draw(); }));
    const sampled = atlas && atlas.sampled ? ` (a sample of ${points.length} of ${atlas.total})` : "";
    root.append(pageHeader("Task atlas",
      `${points.length} task${points.length === 1 ? "" : "s"}${sampled} placed in 2-D` +
      `${atlas && atlas.method ? ` by ${atlas.method}` : ""}: nearby marks have aligned Fisher geometry. ` +
      "Hover for details, click to open a task.", tools));

    if (!points.length) {
      root.append(emptyState("No tasks on the map yet",
        counts.total ? `${counts.total} task(s) stored, ${counts.pending} still processing — see Jobs.`
          : "Add a task with the form below, the CLI (fisher-atlas add NAME samples.jsonl --wait) or POST /v1/tasks.",
        "Tasks appear here as soon as their first job succeeds."), addPanel(targets));
      view().replaceChildren(root);
      watchTasks(ctx, data);
      return;
    }

    const layout = h("div", { class: "atlas-layout" });
    const mapCard = h("div", { class: "card map-card" });
    const legendBox = h("div", { class: "legend", "data-testid": "atlas-legend" });
    const listCard = h("div", { class: "card list-card" });
    layout.append(mapCard, listCard);
    root.append(layout, addPanel(targets));
    view().replaceChildren(root);

    // The map is drawn at the card's own width (one unit a CSS pixel, up to 760): scaled down from 760 on a 390 px
    // screen, its marks were 3 px and its names 4 px tall. A resize of more than a tenth redraws it.
    const PAD = 34;
    const mapWidth = () => Math.round(Math.min(760, Math.max(280, (mapCard.clientWidth || 780) - 20)));
    let W = 760; let H = 520;
    function groupValue(p) {
      const t = p.task || {};
      if (atlasState.colourBy === "cluster") return p.cluster === -1 ? null : p.cluster ?? null;
      if (atlasState.colourBy === "status") return t.status ?? null;
      if (atlasState.colourBy === "mode") return t.mode ?? null;
      const key = atlasState.colourBy.slice(5);
      const meta = taskMeta(t);  // own keys only: "constructor" of a task without it is no group, not Object
      return Object.hasOwn(meta, key) ? meta[key] : null;
    }

    // mapOnly: a resize redraws the map alone (the task list, which may hold the focus, is left as it is)
    function draw({ mapOnly = false } = {}) {
      W = mapWidth(); H = Math.round(Math.max(W * 520 / 760, Math.min(W, 320)));
      const groups = colourGroups(points.map(groupValue), { categorical: atlasState.colourBy === "cluster" });
      // equal-aspect scaling so distances on the map are honest
      const xs = points.map((p) => Number(p.x)); const ys = points.map((p) => Number(p.y));
      const xmin = Math.min(...xs); const xmax = Math.max(...xs);
      const ymin = Math.min(...ys); const ymax = Math.max(...ys);
      const span = Math.max(xmax - xmin, ymax - ymin) || 1;
      const scale = Math.min((W - 2 * PAD) / span, (H - 2 * PAD) / span);
      const cx = (xmin + xmax) / 2; const cy = (ymin + ymax) / 2;
      const X = (x) => W / 2 + (x - cx) * scale;
      const Y = (y) => H / 2 - (y - cy) * scale;
      const inside = (v, hi) => Math.min(Math.max(v, 9), hi - 9);
      const place = stackedPlaces(points.map((p) => [X(Number(p.x)), Y(Number(p.y))]))
        .map(([x, y, k]) => [inside(x, W), inside(y, H), k]);

      const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, class: "atlas-svg", role: "img",
        "aria-label": `Map of ${points.length} tasks`, "data-testid": "atlas-map" });
      svg.append(s("rect", { x: 0, y: 0, width: W, height: H, class: "plot-bg" }));
      for (let i = 1; i < 6; i++) {
        svg.append(s("line", { x1: (W * i) / 6, x2: (W * i) / 6, y1: 0, y2: H, class: "grid" }));
        svg.append(s("line", { y1: (H * i) / 6, y2: (H * i) / 6, x1: 0, x2: W, class: "grid" }));
      }
      const showLabels = points.length <= 60;
      // greedy label placement: right, left, above, below the mark; skipped when all four collide
      const boxes = place.map(([px, py]) => ({ x0: px - 8, x1: px + 8, y0: py - 8, y1: py + 8 }));
      const overlaps = (b) => boxes.some((o) => b.x0 < o.x1 && b.x1 > o.x0 && b.y0 < o.y1 && b.y1 > o.y0);
      function placeLabel(px, py, text) {
        const tw = text.length * 6.3 + 4; const th = 13;
        const options = [
          [px + 10, py - th / 2, "start", px + 11, py + 4], [px - 10 - tw, py - th / 2, "end", px - 11, py + 4],
          [px - tw / 2, py - 11 - th, "middle", px, py - 13], [px - tw / 2, py + 10, "middle", px, py + 21],
        ];
        for (const [x0, y0, anchor, tx, ty] of options) {
          const b = { x0, x1: x0 + tw, y0, y1: y0 + th };
          if (b.x0 < 2 || b.x1 > W - 2 || b.y0 < 2 || b.y1 > H - 2 || overlaps(b)) continue;
          boxes.push(b);
          labels.append(s("text", { x: tx.toFixed(1), y: ty.toFixed(1), "text-anchor": anchor, class: "point-label" }, text));
          return;
        }
      }
      const labels = s("g", { class: "labels", "aria-hidden": "true" });
      const marks = s("g", { class: "marks" });
      points.forEach((p, i) => {
        const [px, py, stacked] = place[i];
        const colour = groups.colourOf(groupValue(p));
        const mark = s("circle", {
          cx: px.toFixed(2), cy: py.toFixed(2), r: 7, fill: colour, class: "atlas-point",
          tabindex: 0, role: "link", "aria-label": `${p.name ?? taskName(p.task)}, cluster ${p.cluster ?? "none"}` +
            (stacked > 1 ? `, one of ${stacked} tasks at one place` : ""),
          "data-testid": "atlas-point", "data-task-id": p.task_id, "data-cluster": p.cluster ?? "",
          "data-group": groups.groupOf ? groups.groupOf(groupValue(p)) : null,
          "data-stacked": stacked > 1 ? String(stacked) : null,
        });
        const open = () => { window.location.hash = `#/task/${encodeURIComponent(p.task_id)}`; };
        const tip = (evt) => tooltip.show(evt, pointTooltip(p, stacked), mark);
        mark.addEventListener("click", open);
        mark.addEventListener("keydown", (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); open(); } });
        mark.addEventListener("mouseenter", (e) => { tip(e); highlightRow(p.task_id, true); });
        mark.addEventListener("mousemove", tip);
        mark.addEventListener("mouseleave", () => { tooltip.hide(); highlightRow(p.task_id, false); });
        mark.addEventListener("focus", () => { tip(null); highlightRow(p.task_id, true); });
        mark.addEventListener("blur", () => { tooltip.hide(); highlightRow(p.task_id, false); });
        marks.append(mark);
        if (showLabels) placeLabel(px, py, truncate(p.name ?? taskName(p.task), 22));
      });
      svg.append(labels, marks);

      const legendItems = groups.numeric
        ? [h("span", { class: "legend-ramp" }, fmt(groups.numeric.lo, 2), h("span", { class: "ramp" }), fmt(groups.numeric.hi, 2))]
        : groups.legend.map((g) => {
          const sw = h("span", { class: "swatch" });
          sw.style.background = g.colour;
          // "0 (1)" read as two numbers: say what each is
          const what = atlasState.colourBy === "cluster" && g.label !== "none" ? `cluster ${g.label}` : g.label;
          // a toggle that dims every other group's marks: a group is told by more than its colour (WCAG 1.4.1; twelve
          // hues, some close, and no labels past 60 tasks)
          const picked = atlasState.pickedGroup === g.key;
          return h("button", { type: "button", class: `legend-item${picked ? " picked" : ""}`, "aria-pressed": String(picked),
            "data-testid": "legend-item", "data-group": g.key, title: picked ? "show every group" : "show this group alone",
            onclick: () => {
              atlasState.pickedGroup = picked ? null : g.key;
              draw({ mapOnly: true });  // the legend is drawn anew: the focus goes back to this entry's button
              legendBox.querySelector(`[data-group="${CSS.escape(g.key)}"]`)?.focus({ preventScroll: true });
            } },
          sw, `${what} · ${g.count} task${g.count === 1 ? "" : "s"}`);
        });
      if (atlasState.pickedGroup !== null && !groups.legend.some((g) => g.key === atlasState.pickedGroup)) atlasState.pickedGroup = null;
      for (const mark of marks.children) {
        mark.classList.toggle("dim", atlasState.pickedGroup !== null && mark.getAttribute("data-group") !== atlasState.pickedGroup);
      }
      legendBox.replaceChildren(
        h("span", { class: "legend-title" }, atlasState.colourBy.replace(/^meta:/, "metadata · ")), ...legendItems);
      mapCard.replaceChildren(svg, legendBox);
      if (mapOnly) return;

      // task list beside the map
      const rows = [...points].sort((a, b) => String(a.cluster ?? "").localeCompare(String(b.cluster ?? ""), undefined, { numeric: true })
        || String(a.name).localeCompare(String(b.name)));
      const table = h("table", { class: "table compact", "data-testid": "atlas-list" },
        h("thead", {}, h("tr", {}, h("th", {}, ""), h("th", {}, "Task"), h("th", { class: "num" }, "Samples"))),
        h("tbody", {}, rows.map((p) => {
          const dot = h("span", { class: "dot" });
          dot.style.background = groups.colourOf(groupValue(p));
          return h("tr", { "data-task-id": p.task_id,
            onmouseenter: () => highlightPoint(p.task_id, true), onmouseleave: () => highlightPoint(p.task_id, false) },
          h("td", {}, dot), h("td", {}, taskLink(p.task_id, truncate(p.name ?? taskName(p.task), 40))),
          h("td", { class: "num" }, fmtInt(taskSamples(p.task))));
        })));
      const { pending, failed } = counts;
      // (replaceChildren writes a null argument as the text "null": only nodes go in)
      listCard.replaceChildren(...[h("h2", {}, "Tasks"), h("div", { class: "scroll" }, table),
        pending + failed ? h("p", { class: "muted small list-note", "data-testid": "atlas-not-ready" },
          [pending ? `${pending} processing` : null, failed ? `${failed} failed or cancelled` : null].filter(Boolean).join(", "),
          " — not on the map. ", h("a", { href: "#/jobs" }, "See jobs")) : null].filter(Boolean));
    }
    function highlightRow(id, on) {
      const row = listCard.querySelector(`tr[data-task-id="${CSS.escape(String(id))}"]`);
      if (row) row.classList.toggle("hl", on);
    }
    function highlightPoint(id, on) {
      const pt = mapCard.querySelector(`circle[data-task-id="${CSS.escape(String(id))}"]`);
      if (pt) pt.classList.toggle("hl", on);
    }
    draw();
    const resized = new ResizeObserver(() => {
      if (!mapCard.isConnected) { resized.disconnect(); return; }
      if (Math.abs(mapWidth() - W) <= W / 10) return;  // its own redraw changes the card's height only
      const had = mapCard.contains(document.activeElement) ? document.activeElement.dataset.taskId : null;
      draw({ mapOnly: true });
      if (had) mapCard.querySelector(`circle[data-task-id="${CSS.escape(had)}"]`)?.focus({ preventScroll: true });
    });
    resized.observe(mapCard);
    watchTasks(ctx, data);
  }

  // Tasks added, finished or deleted elsewhere (CLI, API, another tab) land on the map without a reload: while
  // the page is shown, re-read the task list (every 3 s while a task is pending, else every 5 s) and redraw when
  // it changed — not while the add form has the focus (someone is typing; the form redraws when its job ends).
  const taskStamp = (data) => [...data.mapped, ...data.pendingTasks]
    .map((t) => `${t.id}:${t.status}:${taskSamples(t)}:${taskName(t)}`)
    .sort().join(",") + `|${((data.atlas && data.atlas.points) || []).map((p) => p.task_id).join(",")}`
    + `|${data.counts.total}:${data.counts.pending}:${data.counts.failed}`;
  function watchTasks(ctx, data) {
    const drawn = taskStamp(data);
    let pending = data.counts.pending > 0;
    const schedule = () => {
      const timer = setTimeout(check, pending ? POLL_MS * 2 : 5000);
      ctx.onCleanup(() => clearTimeout(timer));
    };
    const check = async () => {
      if (!ctx.alive()) return;
      let now = null;
      try { now = await atlasData(atlasState.space); } catch (_) { now = null; }
      if (!ctx.alive()) return;
      // typing, or an upload running (its disabled button gave the focus back to the page): the form redraws the
      // page when its job ends
      const typing = addPanelNode && (addPanelNode.contains(document.activeElement) || addPanelNode.isBusy());
      if (now && taskStamp(now) !== drawn && !typing) { navigate({ keepScroll: true }); return; }
      if (now) pending = now.counts.pending > 0;
      schedule();
    };
    schedule();
  }

  // Marks that would cover each other (tasks with identical or nearly identical signatures share a place on the
  // map, and one hid the others) are drawn on a small ring around their place, touching: [x, y, tasks there].
  // near: marks (14 px across) closer than this overlap by more than a third and are drawn around one place (3 px left
  // marks 5-10 px apart half hidden under each other).
  function stackedPlaces(xy, near = 10, r = 7) {
    const groups = [];  // [x, y, indices]: the first point of a group is its place
    const groupOf = xy.map(([x, y], i) => {
      let g = groups.find(([gx, gy]) => Math.abs(gx - x) < near && Math.abs(gy - y) < near);
      if (!g) { g = [x, y, []]; groups.push(g); }
      g[2].push(i);
      return g;
    });
    return xy.map(([x, y], i) => {
      const [gx, gy, members] = groupOf[i];
      const k = members.length;
      if (k === 1) return [x, y, 1];
      const ring = Math.min(r / Math.sin(Math.PI / k), 40);  // neighbours on the ring touch (up to 40 px)
      const a = (2 * Math.PI * members.indexOf(i)) / k - Math.PI / 2;
      return [gx + ring * Math.cos(a), gy + ring * Math.sin(a), k];
    });
  }
  function pointTooltip(p, stacked = 1) {
    const t = p.task || {};
    const meta = Object.entries(taskMeta(t)).slice(0, 6);
    return [
      h("div", { class: "tip-title" }, p.name ?? taskName(t)),
      kv([
        ["id", String(p.task_id)],
        ["cluster", p.cluster === null || p.cluster === undefined || p.cluster === -1 ? "none" : String(p.cluster)],
        t.status ? ["status", t.status] : null,
        t.mode ? ["mode", t.mode] : null,
        ["samples", fmtInt(taskSamples(t))],
        [t.mode === "completion" ? "tokens (completions)" : "tokens", fmtInt(taskTokens(t))],
        ...meta.map(([k, v]) => [k, truncate(typeof v === "object" ? JSON.stringify(v) : String(v), 40)]),
      ]),
      stacked > 1 ? h("div", { class: "tip-hint", "data-testid": "tip-stacked" },
        `${stacked} tasks share this place (near-identical signatures, or too close to tell apart at this size): drawn around it`) : null,
      h("div", { class: "tip-hint" }, "click to open"),
    ].filter(Boolean);
  }

  // ------------------------------------------------------------------ ordering
  function greedyChain(indices, sim) {
    // nearest-neighbour chain: start at the most central item, always step to the most similar unvisited one
    if (indices.length <= 2) return [...indices];
    const left = new Set(indices);
    let start = indices[0]; let best = -Infinity;
    for (const i of indices) {
      let sum = 0;
      for (const j of indices) if (j !== i) sum += sim[i][j];
      if (sum > best) { best = sum; start = i; }
    }
    const order = [start]; left.delete(start);
    while (left.size) {
      const last = order[order.length - 1];
      let next = null; let nb = -Infinity;
      for (const j of left) if (sim[last][j] > nb) { nb = sim[last][j]; next = j; }
      order.push(next); left.delete(next);
    }
    return order;
  }
  function orderMatrix(n, fisher, clusters, how) {
    const all = [...Array(n).keys()];
    const sim = fisher.map((row) => row.map((v) => (Number.isFinite(v) ? v : 0)));
    if (how === "input") return all;
    if (how === "chain" || !clusters.some((c) => c !== null && c !== undefined)) return greedyChain(all, sim);
    const groups = new Map();
    all.forEach((i) => {
      const c = clusters[i] === null || clusters[i] === undefined ? "none" : String(clusters[i]);
      if (!groups.has(c)) groups.set(c, []);
      groups.get(c).push(i);
    });
    const keys = [...groups.keys()];
    // order clusters by a chain over mean inter-cluster Fisher alignment
    const csim = keys.map((a) => keys.map((b) => {
      let sum = 0; let cnt = 0;
      for (const i of groups.get(a)) for (const j of groups.get(b)) if (i !== j) { sum += sim[i][j]; cnt++; }
      return cnt ? sum / cnt : 0;
    }));
    const korder = greedyChain(keys.map((_, i) => i), csim);
    return korder.flatMap((k) => greedyChain(groups.get(keys[k]), sim));
  }

  // ------------------------------------------------------------------ Matrix view
  // The API's `activation_dark` rule (activation >= 0.8 and fisher <= 0.3): the task page and the sources' badge keep
  // it; the Alignment page's own thresholds (adjustable there) colour only that page's matrix.
  const DARK_RULE = { darkAct: 0.8, darkFisher: 0.3 };
  const matrixState = { selected: null, edited: false, order: "cluster", show: "all", ...DARK_RULE };
  function isDark(fisher, activation, unestimated = false, rule = matrixState) {
    return !unestimated && Number.isFinite(activation) && Number.isFinite(fisher)
      && activation >= rule.darkAct && fisher <= rule.darkFisher;
  }
  // Pairs of a matrix answer whose Fisher alignment is a placeholder (never activation-dark, as in the API).
  const UNESTIMATED = new Set(["zero_norm_ae", "zero_norm_a", "empty"]);
  function unestimatedPairs(body) {
    const out = new Set();
    for (const p of (body && body.pair_flags) || []) {
      if ((p.flags || []).some((f) => UNESTIMATED.has(f))) { out.add(`${p.i},${p.j}`); out.add(`${p.j},${p.i}`); }
    }
    return out;
  }

  async function viewMatrix(ctx, query) {
    const atlas = await api(`/atlas${qs({ space: atlasState.space })}`);
    if (!ctx.alive()) return;
    const points = (atlas && atlas.points) || [];
    const pointById = new Map(points.map((p) => [String(p.task_id), p]));
    const fromHash = (query.get("ids") || "").split(",").map((x) => x.trim()).filter(Boolean);
    if (fromHash.length) {
      matrixState.selected = new Set(fromHash);
      matrixState.edited = true;
    } else if (!matrixState.selected || !matrixState.edited) {  // the default follows the map until the user picks
      matrixState.selected = new Set(points.slice(0, MATRIX_DEFAULT_MAX).map((p) => String(p.task_id)));
    }
    // only tasks on the map can be selected: a link's ids that are not (deleted, not ready, another space, or no
    // id at all) drop out, and the banner names them (they dropped silently)
    const offMap = fromHash.filter((id) => !pointById.has(id));
    if (offMap.length) {
      const shown = offMap.slice(0, 5).map((id) => truncate(id, 24)).join(", ") + (offMap.length > 5 ? ", …" : "");
      showBanner(`The link names ${offMap.length} task${offMap.length === 1 ? "" : "s"} not on the map (${shown}): ` +
        "not a task id, or a task deleted, still processing or in another space. The matrix shows the others.");
    }
    matrixState.selected = new Set([...matrixState.selected].filter((id) => pointById.has(id)));

    const root = h("section", { class: "page", "data-testid": "matrix-view" });
    root.append(pageHeader("Alignment matrix",
      "Fisher alignment next to its activation-only and error-only factors, ordered by cluster. " +
      "Outlined cells are activation-dark pairs: activations look alike, gradient updates do not."));
    if (!points.length) {
      root.append(emptyState("No tasks with signatures yet", "Add tasks and wait for their jobs; see Jobs."));
      view().replaceChildren(root);
      return;
    }
    const layout = h("div", { class: "matrix-layout" });
    const side = h("aside", { class: "card select-card" });
    const main = h("div", { class: "matrix-main" });
    layout.append(side, main);
    root.append(layout);
    view().replaceChildren(root);

    // --- selection panel
    const filter = h("input", { type: "search", placeholder: "filter tasks", "aria-label": "Filter tasks", class: "input" });
    const list = h("div", { class: "checklist", role: "group", "aria-label": "Tasks in the matrix" });
    const countLabel = h("span", { class: "muted small", "data-testid": "matrix-count" });
    function renderList() {
      const f = filter.value.trim().toLowerCase();
      list.replaceChildren(...points.filter((p) => !f || String(p.name).toLowerCase().includes(f)).map((p) => {
        const id = String(p.task_id);
        return h("label", { class: "check" },
          h("input", { type: "checkbox", checked: matrixState.selected.has(id), "data-task-id": id,
            onchange: (e) => { if (e.target.checked) matrixState.selected.add(id); else matrixState.selected.delete(id); matrixState.edited = true; updateCount(); } }),
          h("span", {}, nameParts(truncate(p.name, 34))));
      }));
      updateCount();
    }
    function updateCount() { countLabel.textContent = `${matrixState.selected.size} of ${points.length} selected`; }
    filter.addEventListener("input", renderList);
    const setAll = (ids) => { matrixState.selected = new Set(ids); matrixState.edited = true; renderList(); };
    side.append(
      h("h2", {}, "Tasks"), filter,
      h("div", { class: "btn-row" },
        h("button", { class: "btn small ghost", type: "button", onclick: () => setAll(points.map((p) => String(p.task_id))) }, "All"),
        h("button", { class: "btn small ghost", type: "button", onclick: () => setAll([]) }, "None"),
        h("button", { class: "btn small ghost", type: "button",
          onclick: () => setAll(points.slice(0, MATRIX_DEFAULT_MAX).map((p) => String(p.task_id))) }, `First ${MATRIX_DEFAULT_MAX}`)),
      list, countLabel,
      h("button", { class: "btn primary", type: "button", "data-testid": "matrix-compute", onclick: () => compute() }, "Compute matrix"));
    renderList();

    // --- controls
    const showSeg = h("div", { class: "segmented", role: "radiogroup", "aria-label": "Heatmaps shown" });
    for (const [v, label] of [["all", "All three"], ["fisher", "Fisher"], ["activation", "Activation"], ["error", "Error"]]) {
      showSeg.append(h("button", { type: "button", role: "radio", "aria-checked": matrixState.show === v ? "true" : "false",
        "data-show": v, onclick: () => { matrixState.show = v; for (const b of showSeg.children) b.setAttribute("aria-checked", b.dataset.show === v ? "true" : "false"); paint(); } }, label));
    }
    const darkHint = h("span", { class: "small field-hint", "data-testid": "dark-hint", role: "status" });
    // An empty or out-of-range value is not taken (Number("") is 0): the field gets its value back, with a hint.
    const setDark = (key, input) => {
      const v = input.value.trim() === "" ? NaN : Number(input.value);
      if (!(v >= 0 && v <= 1)) {
        input.value = matrixState[key];
        darkHint.textContent = `a number from 0 to 1; kept ${matrixState[key]}`;
        return;
      }
      darkHint.textContent = "";
      matrixState[key] = v;
      paint();
    };
    const numInput = (label, key, step) => h("label", { class: "field inline" }, h("span", {}, label),
      h("input", { type: "number", step, min: 0, max: 1, value: matrixState[key], class: "input num-input",
        "data-testid": `dark-${key}`, onchange: (e) => setDark(key, e.target) }));
    const controls = h("div", { class: "card controls" },
      select("matrix-order", "Order", [["cluster", "cluster, then chain"], ["chain", "Fisher chain"], ["input", "as selected"]],
        matrixState.order, (v) => { matrixState.order = v; paint(); }),
      showSeg,
      h("span", { class: "sep" }),
      h("span", { class: "muted small" }, "activation-dark:"),
      numInput("activation ≥", "darkAct", 0.05),
      numInput("and Fisher ≤", "darkFisher", 0.05), darkHint);
    const out = h("div", { class: "matrix-out" });
    const pairCard = h("div", { class: "pair-card", "data-testid": "pair-detail", hidden: true });
    main.append(controls, out, pairCard);

    let result = null;
    async function compute(again = false) {
      const ids = points.map((p) => String(p.task_id)).filter((id) => matrixState.selected.has(id));
      if (ids.length < 2) { out.replaceChildren(emptyState("Select at least two tasks")); return; }
      out.replaceChildren(h("p", { class: "muted loading" }, `Computing the ${ids.length}×${ids.length} matrix…`));
      pairCard.hidden = true;
      try {
        const body = await api("/align/matrix", { method: "POST",
          body: { task_ids: ids.map((x) => (/^\d+$/.test(x) ? Number(x) : x)) } });
        if (!ctx.alive()) return;
        result = body;
        paint();
        // a chosen selection goes into the page's link (a reload or a shared link showed the first 40 again); the
        // router reads it back, and replaceState moves neither the history nor the page
        if (matrixState.edited) history.replaceState(history.state, "", `#/matrix?ids=${ids.map(encodeURIComponent).join(",")}`);
      } catch (err) {
        if (!ctx.alive()) return;
        // tasks deleted since the page was drawn (another tab, another user): dropped, the others computed (the whole
        // matrix failed with "tasks do not exist: [36]" until a reload)
        const gone = err instanceof ApiError && err.status === 404 && err.detail && Array.isArray(err.detail.task_ids)
          ? err.detail.task_ids.map(String) : [];
        if (gone.length && !again) {
          for (const id of gone) {
            matrixState.selected.delete(id); pointById.delete(id);
            const at = points.findIndex((p) => String(p.task_id) === id);
            if (at >= 0) points.splice(at, 1);
          }
          renderList();
          showBanner(`${gone.length === 1 ? "A selected task was" : `${gone.length} selected tasks were`} deleted since `
            + `the page was drawn (id ${gone.slice(0, 5).join(", ")}${gone.length > 5 ? ", …" : ""}): the matrix shows the others.`);
          await compute(true);
          return;
        }
        out.replaceChildren(errorBox(err, "Matrix"));
      }
    }

    function paint() {
      if (!result) return;
      const ids = (result.ids || []).map(String);
      const n = ids.length;
      const F = result.fisher; const A = result.activation; const E = result.error;
      const clusters = ids.map((id) => (pointById.get(id) ? pointById.get(id).cluster : null));
      const order = orderMatrix(n, F, clusters, matrixState.order);
      const names = ids.map((id, i) => (Array.isArray(result.names) && result.names[i] !== undefined ? result.names[i]
        : pointById.get(id) ? pointById.get(id).name : `task ${id}`));
      const kinds = [["fisher", "Fisher alignment", F, "Â_F"], ["activation", "Activation only", A, "S_cov(M_a)"],
        ["error", "Error only", E, "S_cov(Γ_e)"]];
      const shown = matrixState.show === "all" ? kinds : kinds.filter(([k]) => k === matrixState.show);
      const single = shown.length === 1;
      let labelW = 150;
      // Room for the widest title over a panel (12 px bold words, then the symbol): "Activation only S_cov(M_a)" is
      // ~170 px, and a panel sized for 150 clipped it.
      const titleRoom = Math.max(...shown.map(([, t, , sym]) => Math.ceil(t.length * 7.2 + 6 + sym.length * 6.6))) + 8;
      const avail = Math.max(240, (out.clientWidth || 900) - 30);  // (a floor of 480 overflowed a phone's 330 px)
      // Side by side while a row keeps room for its label (11 px) and a panel for its title; past that, one panel per
      // row, each labelled.
      const layoutFor = (lw) => {
        const sideBySide = (avail - lw - shown.length * 22) / shown.length;
        const stacked = !single && (Math.floor(sideBySide / n) < 11 || sideBySide < titleRoom);
        const wide = Math.min(Math.max(620, n * 11), avail - lw - 20);
        const perPanel = single || stacked ? wide : sideBySide;
        return { stacked, cell: Math.max(3, Math.min(single || stacked ? 56 : 44, Math.floor(perPanel / n))) };
      };
      let { stacked, cell } = layoutFor(labelW);
      const rowLabels = cell >= 7;  // under 7 px a name cannot be read: its 150 px column went to the cells instead
      if (!rowLabels) { labelW = 4; ({ stacked, cell } = layoutFor(labelW)); }
      let darkCount = 0;
      const unestimated = unestimatedPairs(result);
      const darkAt = (i, j) => i !== j && isDark(F[i][j], A[i][j], unestimated.has(`${i},${j}`));
      for (let i = 0; i < n; i++) for (let j = i + 1; j < n; j++) if (darkAt(i, j)) darkCount++;

      const panels = shown.map(([kind, title, M, symbol], pi) => {
        const withLabels = pi === 0 || stacked;
        const grid = n * cell;
        const bare = (withLabels ? labelW : 4) + grid + 4;  // a title may reach over the row labels, not past the panel
        const pad = Math.max(0, Math.ceil((titleRoom - bare) / 2));
        const ox = (withLabels ? labelW : 4) + pad; const oy = 24;
        const w = ox + grid + 4 + pad; const hgt = oy + grid + 4;
        const titleX = Math.min(Math.max(ox + grid / 2, titleRoom / 2), w - titleRoom / 2);
        const svg = s("svg", { viewBox: `0 0 ${w} ${hgt}`, width: w, height: hgt, class: "heatmap-svg",
          role: "group", "aria-label": `${title}: ${n} by ${n} heatmap; arrow keys move between cells` });
        svg.append(s("text", { x: titleX, y: 14, "text-anchor": "middle", class: "heatmap-title" }, title,
          s("tspan", { class: "heatmap-symbol", dx: 6 }, symbol)));
        const g = s("g", {});
        const outlines = s("g", { class: "dark-outlines" });
        order.forEach((i, r) => {
          if (withLabels && rowLabels) {
            const shown = fitText(names[i], cell < 11 ? 8 : 11, ox - 12);
            const lab = s("text", { x: ox - 8, y: oy + r * cell + cell / 2 + 4, "text-anchor": "end", class: "row-label" },
              shown, shown === names[i] ? null : s("title", {}, names[i]));  // a cut name whole on hover
            if (cell < 11) lab.setAttribute("class", "row-label tiny");
            svg.append(lab);
          }
          order.forEach((j, c) => {
            const v = Number(M[i][j]);
            const dark = darkAt(i, j);
            const rect = s("rect", { x: ox + c * cell, y: oy + r * cell, width: cell, height: cell,
              fill: seqColour(v), class: "heatmap-cell", "data-testid": "heatmap-cell", "data-kind": kind,
              "data-row": ids[i], "data-col": ids[j], "data-value": Number.isFinite(v) ? v.toFixed(4) : "",
              "data-dark": dark ? "true" : null });
            rect.addEventListener("mouseenter", (e) => { cross(i, j, true); tooltip.show(e, cellTooltip(i, j)); });
            rect.addEventListener("mousemove", (e) => tooltip.show(e, cellTooltip(i, j)));
            rect.addEventListener("mouseleave", () => { cross(i, j, false); tooltip.hide(); });
            rect.addEventListener("click", () => openCell(i, j));
            g.append(rect);
            if (dark && cell >= 5) {  // an outline in a smaller cell covered it whole: the panels looked orange
              outlines.append(s("rect", { x: ox + c * cell + 1, y: oy + r * cell + 1, width: Math.max(1, cell - 2),
                height: Math.max(1, cell - 2), class: "dark-outline" }));
            }
          });
        });
        const bounds = s("g", { class: "cluster-bounds" });
        if (matrixState.order === "cluster") {
          for (let r = 1; r < n; r++) {
            if (String(clusters[order[r]]) === String(clusters[order[r - 1]])) continue;
            const at = r * cell;
            bounds.append(s("line", { x1: ox + at, x2: ox + at, y1: oy, y2: oy + n * cell, class: "cluster-bound" }),
              s("line", { x1: ox, x2: ox + n * cell, y1: oy + at, y2: oy + at, class: "cluster-bound" }));
          }
        }
        svg.append(g, bounds, outlines);
        const figure = h("figure", { class: "heatmap", "data-testid": "heatmap", "data-kind": kind, "data-size": n }, svg);
        cellKeys(figure, g, title, M);
        return figure;
      });

      function cellTooltip(i, j) {
        const dark = darkAt(i, j);
        return [
          h("div", { class: "tip-title" }, i === j ? names[i] : `${names[i]} ↔ ${names[j]}`),
          kv([["Fisher (raw)", fmt(F[i][j])], ["activation", fmt(A[i][j])], ["error", fmt(E[i][j])]]),
          dark ? h("div", { class: "badge dark" }, "activation-dark") : null,
          h("div", { class: "tip-hint" }, i === j ? "click to open the task" : "click for the pair's factors"),
        ];
      }
      function openCell(i, j) {
        if (i !== j) showPair(ids[i], ids[j]); else window.location.hash = `#/task/${encodeURIComponent(ids[i])}`;
      }
      // Keyboard: one cell of a heatmap is in the tab order (roving tabindex, labelled when it gets it, so a large
      // matrix stays cheap); arrow keys move it, Enter or Space opens it like a click. Cells are g's children, row-major.
      // The focus listeners sit on the figure: on an SVG element Chrome makes them focusable on click.
      function cellKeys(figure, g, title, M) {
        const at = (rect) => { const k = Array.prototype.indexOf.call(g.children, rect); return [Math.floor(k / n), k % n]; };
        const isCell = (node) => node.parentNode === g;
        const arm = (rect) => {
          const [r, c] = at(rect); const i = order[r]; const j = order[c];
          setAttrs(rect, { tabindex: 0, role: "button",
            "aria-label": `${title}, ${i === j ? names[i] : `${names[i]} ↔ ${names[j]}`}: ${fmt(M[i][j])}` });
        };
        const STEPS = { ArrowRight: [0, 1], ArrowLeft: [0, -1], ArrowDown: [1, 0], ArrowUp: [-1, 0] };
        g.addEventListener("keydown", (e) => {
          if (!isCell(e.target)) return;
          const [r, c] = at(e.target);
          if (e.key === "Enter" || e.key === " ") { e.preventDefault(); openCell(order[r], order[c]); return; }
          const step = STEPS[e.key];
          if (!step) return;
          e.preventDefault();
          const next = g.children[Math.max(0, Math.min(n - 1, r + step[0])) * n + Math.max(0, Math.min(n - 1, c + step[1]))];
          e.target.removeAttribute("tabindex");
          arm(next);
          next.focus();
        });
        figure.addEventListener("focusin", (e) => {
          if (!isCell(e.target)) return;
          const [r, c] = at(e.target);
          cross(order[r], order[c], true);
          tooltip.show(null, cellTooltip(order[r], order[c]), e.target);
        });
        figure.addEventListener("focusout", (e) => {
          if (!isCell(e.target)) return;
          const [r, c] = at(e.target);
          cross(order[r], order[c], false);
          tooltip.hide();
        });
        if (g.firstChild) arm(g.firstChild);
      }
      function cross(i, j, on) {
        for (const r of out.querySelectorAll(`rect[data-row="${CSS.escape(ids[i])}"][data-col="${CSS.escape(ids[j])}"]`)) r.classList.toggle("hl", on);
      }

      const legend = h("div", { class: "legend matrix-legend" },
        h("span", { class: "legend-ramp" }, "0", h("span", { class: "ramp" }), "1"),
        h("span", { class: "legend-item" }, h("span", { class: "swatch outline" }),
          `activation-dark pair (activation ≥ ${matrixState.darkAct} and Fisher ≤ ${matrixState.darkFisher}): ${darkCount} pair${darkCount === 1 ? "" : "s"}`),
        h("span", { class: "muted small" }, "Values below 0 (estimator noise) are drawn as 0. Hover a cell to compare the three factors."));
      out.replaceChildren(h("div", { class: "card heatmap-card" },
        h("div", { class: `heatmaps ${single ? "single" : ""} ${stacked ? "stacked" : ""}`, "data-testid": "heatmaps",
          "data-layout": stacked ? "stacked" : "side-by-side" }, panels), legend));
    }

    async function showPair(a, b) {
      pairCard.hidden = false;
      pairCard.replaceChildren(h("p", { class: "muted loading" }, "Loading pair…"));
      try {
        const r = await api(`/align${qs({ a, b })}`);
        if (!ctx.alive()) return;
        const name = (id) => (pointById.get(String(id)) ? pointById.get(String(id)).name : `task ${id}`);
        const rows = Object.entries(PAIR_FIELDS).filter(([k]) => r && (typeof r[k] === "number" || typeof r[k] === "boolean"));
        const flags = Array.isArray(r && r.flags) ? r.flags : [];
        pairCard.replaceChildren(...[  // (only nodes: a null went in as the text "null" for a pair without flags)
          h("div", { class: "pair-head" },
            h("h2", {}, taskLink(a, name(a)), " ↔ ", taskLink(b, name(b))),
            h("button", { class: "btn small ghost", type: "button", "aria-label": "Close", onclick: () => { pairCard.hidden = true; } }, "×")),
          factorBars(r, { big: true }),
          kv(rows.map(([k, [label, title]]) => [h("span", { title }, label), typeof r[k] === "number" ? fmt(r[k], 4) : String(r[k])])),
          flags.length ? h("div", { class: "flags" }, flags.map((f) => h("span", { class: "badge" }, String(f)))) : null].filter(Boolean));
      } catch (err) {
        if (!ctx.alive()) return;
        pairCard.replaceChildren(errorBox(err, "Alignment"));
      }
    }

    await compute();
  }

  // The fields of GET /v1/align shown in the pair card: label and hover text (docs/SCORES.md); others are not shown.
  const PAIR_FIELDS = {
    fisher: ["Fisher (raw)", "Â_F: cosine of the two tasks' mean head-gradient features, as estimated"],
    fisher_shrunk: ["Fisher (shrunk)", "Fisher alignment shrunk towards activation × error by its split-half uncertainty (the bar)"],
    activation: ["activation", "S_cov(M_a): cosine of the activation side"],
    error: ["error", "S_cov(Γ_e): cosine of the error (output-gradient) side"],
    rho: ["coupling ρ", "Fisher / (activation × error), bounded to [1/100, 100]"],
    se: ["SE of log ρ", "split-half standard error of log ρ"],
    chi: ["χ (diagnostic)", "raw kernel ratio S_ae / (S_a S_e): unbounded, a diagnostic only"],
    activation_dark: ["activation-dark", "activation ≥ 0.8 and Fisher ≤ 0.3 (the API's rule)"],
  };

  // ------------------------------------------------------------------ factor bars
  // Fisher (EB-shrunk), activation, error on [0, 1]. Coupling rho on a log axis from 0.1 to 10, drawn as a
  // diverging bar from rho = 1 (separable) with the split-half SE of log rho as a whisker (rho ×/÷ e^SE).
  const RHO_LOG_SPAN = 1; // decades either side of rho = 1
  const RHO_BOUND_TITLE = "ρ hit its bound (1/100 or 100): the activation × error proxy is near 0, so ρ carries no information (flag rho_bounded, docs/SCORES.md)";
  function rhoBounded(src) { return Array.isArray(src && src.flags) && src.flags.includes("rho_bounded"); }
  function factorBars(src, { big = false } = {}) {
    const rowH = big ? 20 : 16; const labelW = 92; const barW = (big ? 420 : 300) - labelW - 74;
    const rho = Number(pick(src, "rho"));
    const se = Number(pick(src, "se", "rho_se", "se_log_rho"));
    const shrunk = pick(src, "fisher_shrunk", "fisher_eb");
    const fisher = Number(shrunk !== undefined ? shrunk : pick(src, "fisher"));
    const rows = [
      [shrunk !== undefined ? "Fisher (shrunk)" : "Fisher", fisher, "f-fisher",
        shrunk !== undefined ? "Fisher alignment, empirical-Bayes shrunk" : "Fisher alignment"],
      ["activation", Number(pick(src, "activation")), "f-act", "S_cov(M_a): activation-only similarity"],
      ["error", Number(pick(src, "error")), "f-err", "S_cov(Γ_e): error-only similarity"],
      ["coupling ρ", rho, "f-rho", "coupling ratio ρ (log axis 0.1–10, centre ρ = 1); whisker: ρ ×/÷ e^SE, SE of log ρ"],
    ];
    const valueText = (cls, v) => (cls === "f-rho"
      // se is the standard error of log ρ: ρ ×/÷ e^se (read as "0.80 ±2.60" it said ρ ∈ [−1.8, 3.4])
      ? (rhoBounded(src) ? (v >= 1 ? `≥ ${fmt(v, 0)}` : `≤ ${fmt(v, 2)}`) : `${fmt(v, 2)}${Number.isFinite(se) && se > 0 ? ` ×/÷ ${fmt(Math.exp(se), 2)}` : ""}`) : fmt(v, 3));
    // wide enough for its longest value ("18.64 ×/÷ 1.08" ran out of a fixed 300)
    const W = labelW + barW + 6 + Math.max(68, ...rows.map(([, v, cls]) => Math.ceil(textWidth(valueText(cls, v), 11)) + 4));
    const svg = s("svg", { viewBox: `0 0 ${W} ${rows.length * rowH + 4}`, width: W, height: rows.length * rowH + 4,
      class: "factor-bars", role: "img", "aria-label": rows.map(([l, v]) => `${l} ${fmt(v)}`).join(", ") });
    const rhoX = (r) => labelW + clamp01((Math.log10(Math.max(r, 1e-12)) / RHO_LOG_SPAN + 1) / 2) * barW;
    rows.forEach(([label, v, cls, title], r) => {
      const y = 2 + r * rowH;
      const g = s("g", {}, s("title", {}, title));
      g.append(s("text", { x: labelW - 6, y: y + rowH * 0.68, "text-anchor": "end", class: "bar-label" }, label));
      g.append(s("rect", { x: labelW, y: y + 3, width: barW, height: rowH - 6, class: "bar-track", rx: 2 }));
      if (cls !== "f-rho" && Number.isFinite(v)) {
        g.append(s("rect", { x: labelW, y: y + 3, width: Math.max(0.5, clamp01(v) * barW), height: rowH - 6, class: `bar ${cls}`,
          rx: 2, "data-factor": cls.slice(2) }));
      }
      if (cls === "f-rho") {
        const one = rhoX(1);
        if (Number.isFinite(v)) {
          const x = rhoX(v);
          g.append(s("rect", { x: Math.min(one, x), y: y + 3, width: Math.max(1, Math.abs(x - one)), height: rowH - 6,
            class: `bar ${cls}`, rx: 2, "data-factor": "rho" }));
          if (Number.isFinite(se) && se > 0 && v > 0 && !rhoBounded(src)) {
            const lo = rhoX(v * Math.exp(-se)); const hi = rhoX(v * Math.exp(se)); const ym = y + rowH / 2;
            g.append(s("line", { x1: lo, x2: hi, y1: ym, y2: ym, class: "whisker", "data-testid": "se-whisker" }),
              s("line", { x1: lo, x2: lo, y1: ym - 4, y2: ym + 4, class: "whisker" }),
              s("line", { x1: hi, x2: hi, y1: ym - 4, y2: ym + 4, class: "whisker" }));
          }
        }
        g.append(s("line", { x1: one, x2: one, y1: y + 1, y2: y + rowH - 1, class: "ref-line" }));
      }
      g.append(s("text", { x: labelW + barW + 6, y: y + rowH * 0.68, class: "bar-value" }, valueText(cls, v)));
      svg.append(g);
    });
    return svg;
  }

  // ------------------------------------------------------------------ Task view
  async function viewTask(ctx, id) {
    if (!/^[0-9]{1,19}$/.test(id)) throw new Error(`“${truncate(id, 40)}” is not a task link: a task page is #/task/ and the task's number (the atlas and the jobs list link to them).`);
    const task = await api(`/tasks/${encodeURIComponent(id)}`);
    if (!ctx.alive()) return;
    const root = h("section", { class: "page", "data-testid": "task-page", "data-task-id": task.id });
    const meta = taskMeta(task);
    root.append(h("nav", { class: "crumbs", "aria-label": "Breadcrumb" }, h("a", { href: "#/atlas" }, "Atlas"), " / ", taskName(task)));
    root.append(h("div", { class: "page-head" },
      h("div", {}, h("h1", { "data-testid": "task-name" }, taskName(task), " ", statusBadge(task.status)),
        h("p", { class: "muted" }, `task ${task.id} · ${task.mode || "?"} mode · space ${taskSpace(task) ?? "?"}`)),
      h("div", { class: "page-tools" },
        h("a", { class: "btn small ghost", href: "#/route" }, "Route a prompt"), deleteButton(task))));

    const stats = h("div", { class: "stats" },
      stat("samples", fmtInt(taskSamples(task)), "task-samples"),
      stat(task.mode === "completion" ? "tokens (completions)" : "tokens", fmtInt(taskTokens(task)), "task-tokens"),
      stat("version", pick(task, "version") ?? "—"),
      stat("updated", fmtDate(pick(task, "updated_at", "created_at"))));
    const info = h("div", { class: "grid-2" });
    const modelCard = h("div", { class: "card" }, h("h2", {}, "Model & sketch"), h("p", { class: "muted" }, "Loading…"));
    const metaEntries = Object.entries(meta);
    const metaCard = h("div", { class: "card" }, h("h2", {}, "Metadata"),
      metaEntries.length ? kv(metaEntries.map(([k, v]) => [k, typeof v === "object" ? JSON.stringify(v) : String(v)]))
        : h("p", { class: "muted" }, "No metadata."),
      kv([["created", fmtDate(task.created_at)], ["updated", fmtDate(task.updated_at)]]));
    info.append(modelCard, metaCard);
    const routingCard = h("div", { class: "card", "data-testid": "task-routing" }, h("h2", {}, "Routing"),
      h("p", { class: "muted loading" }, "Loading…"));
    const jobBox = h("div", {});
    const sourcesCard = h("div", { class: "card", "data-testid": "sources" }, h("h2", {}, "Recommended sources"),
      h("p", { class: "muted loading" }, "Loading…"));
    const neighbours = h("div", { class: "grid-2" });
    const nearestCard = h("div", { class: "card", "data-testid": "nearest" }, h("h2", {}, "Nearest tasks"), h("p", { class: "muted loading" }, "Loading…"));
    const darkCard = h("div", { class: "card", "data-testid": "dark-neighbours" }, h("h2", {}, "Activation-dark neighbours"),
      h("p", { class: "muted loading" }, "Loading…"));
    neighbours.append(nearestCard, darkCard);
    // a completion task's signature counts its completion tokens; its jobs stream the prompts through the model too
    const tokensNote = task.mode === "completion" ? h("p", { class: "muted small", "data-testid": "tokens-note" },
      "“tokens” counts the completion tokens the signature is built from; “tokens through the model” (jobs) "
      + "also counts the prompts.") : null;
    root.append(...[stats, tokensNote, jobBox, info, routingCard, sourcesCard, neighbours].filter(Boolean));
    view().replaceChildren(root);

    // model & spec: from the task itself or its space
    (async () => {
      let space = typeof task.space === "object" && task.space ? task.space : null;
      if (!space && taskSpace(task) !== undefined) {
        try {
          const list = await api("/spaces");
          const items = Array.isArray(list) ? list : (list && list.items) || [];
          space = items.find((sp) => String(sp.id) === String(taskSpace(task))) || null;
        } catch (_) { space = null; }
      }
      if (!ctx.alive()) return;
      const src = { ...(space || {}), ...task };
      const spec = pick(src, "spec", "sketch_spec") || {};
      const rows = [
        ["model", pick(src, "model_name", "model")],
        ["model fingerprint", pick(src, "model_fingerprint", "fingerprint")],
        ["d (head input)", pick(src, "d") ?? spec.d],
        ["K (vocabulary)", pick(src, "K") ?? spec.K],
        ["m (sketch)", pick(src, "m") ?? spec.m],
        ["seed", pick(src, "seed") ?? spec.seed],
        ["error projection", spec.error_projection],
        ["granularity", spec.granularity],
        ["spec fingerprint", pick(src, "spec_fingerprint")],
      ].filter(([, v]) => v !== undefined && v !== null && v !== "")
        .map(([k, v]) => [k, h("span", { class: "mono" }, typeof v === "object" ? JSON.stringify(v) : String(v))]);
      modelCard.replaceChildren(h("h2", {}, "Model & sketch"),
        rows.length ? kv(rows) : h("p", { class: "muted" }, `space ${taskSpace(task) ?? "?"} (details not exposed by the API)`));
    })();

    // latest job, when the task says which
    let jobId = pick(task, "latest_job_id", "job_id", "last_job_id") ?? (task.latest_job && task.latest_job.id);
    {
      let sawActive = false;  // a job this page saw queued or running changes the task when it ends
      const jobRefresh = async () => {
        if (jobId === undefined) {
          try {
            const page = await api(`/jobs${qs({ task_id: task.id, limit: 1 })}`);
            const items = Array.isArray(page) ? page : (page && page.items) || [];
            if (items.length) jobId = items[0].id;
          } catch (_) { /* no job list */ }
          if (!ctx.alive()) return;
        }
        if (jobId === undefined) {
          if (task.status === "pending") jobBox.replaceChildren(h("div", { class: "card note" }, "This task is still being processed; see Jobs."));
          return;
        }
        try {
          const job = await api(`/jobs/${encodeURIComponent(jobId)}`);
          if (!ctx.alive()) return;
          if (job.status === "succeeded") {
            const p = job.progress || {};
            const notes = sampleNotes(job);
            jobBox.replaceChildren(h("p", { class: "muted small", "data-testid": "latest-job" },
              `Latest job ${job.id} (${job.kind || "job"}) succeeded ${fmtDate(job.finished_at)}: ${progressFigures(p, job.status)}.`
              + (notes ? ` ${notes}` : "")));
          } else {
            jobBox.replaceChildren(h("div", { class: "card", "data-testid": "latest-job" }, h("h2", {}, "Latest job"),
              jobRow(job, new Map([[String(task.id), task]]))));
          }
          if (job.status === "queued" || job.status === "running") {
            sawActive = true;
            const t = setTimeout(jobRefresh, POLL_MS); ctx.onCleanup(() => clearTimeout(t));
          } else if ((task.status === "pending" || sawActive) && ["succeeded", "failed", "cancelled"].includes(job.status)) {
            navigate({ keepScroll: true });  // the task's status or counts changed with its job: draw the page again
          }
        } catch (_) { /* the job list is optional */ }
      };
      jobRefresh();
    }

    routingPanel(ctx, task, routingCard);

    if (task.status !== "ready") {
      const msg = task.status === "failed" ? "This task has no signature: its job failed or was cancelled (see Jobs)." : "Sources and neighbours appear once the task's first job succeeds.";
      for (const c of [sourcesCard, nearestCard, darkCard]) c.replaceChildren(c.firstChild, h("p", { class: "muted" }, msg));
      return;
    }

    // recommended sources
    (async () => {
      try {
        const res = await api(`/tasks/${encodeURIComponent(task.id)}/sources${qs({ k: SOURCES_SHOWN, candidates: SOURCE_CANDIDATES })}`);
        if (!ctx.alive()) return;
        const sources = (res && res.sources) || [];
        if (!sources.length) {
          sourcesCard.replaceChildren(sourcesCard.firstChild, h("p", { class: "muted" }, "No other task in this space to recommend yet."));
          return;
        }
        sourcesCard.replaceChildren(h("h2", {}, "Recommended sources"),
          h("p", { class: "muted small", "data-testid": "sources-scope" }, `The best ${sources.length} of the ${res.compared ?? sources.length} tasks nearest this one by signature (up to ${SOURCE_CANDIDATES} compared), ranked by empirical-Bayes-shrunk Fisher alignment. Bars: Fisher (shrunk), activation-only, error-only on 0–1; coupling ρ on a log axis 0.1–10 from the centre line ρ = 1, whisker ρ ×/÷ e^SE (SE of log ρ).`),
          h("ol", { class: "sources" }, sources.map((src, i) => h("li", { class: "source-row", "data-testid": "source-row", "data-task-id": src.task_id },
            h("div", { class: "source-head" },
              h("span", { class: "rank" }, String(i + 1)),
              taskLink(src.task_id, truncate(src.name ?? `task ${src.task_id}`, 48)),
              src.activation_dark ? h("span", { class: "badge dark", title: "activations alike, updates not", "data-testid": "dark-badge" }, "activation-dark") : null,
              rhoBounded(src) ? h("span", { class: "badge", title: RHO_BOUND_TITLE, "data-testid": "rho-bound-badge" }, "ρ at bound") : null,
              h("span", { class: "score mono", title: "Fisher (raw → shrunk)" },
                `A_F ${fmt(src.fisher)}${src.fisher_shrunk !== undefined ? ` → ${fmt(src.fisher_shrunk)}` : ""}`)),
            factorBars(src)))));
      } catch (err) {
        if (!ctx.alive()) return;
        sourcesCard.replaceChildren(sourcesCard.firstChild, errorBox(err, "Sources"));
      }
    })();

    // nearest + activation-dark neighbours from one matrix row against the task's space
    (async () => {
      try {
        const atlas = await api(`/atlas${qs({ space: taskSpace(task) })}`).catch(() => api("/atlas"));
        const others = ((atlas && atlas.points) || []).filter((p) => String(p.task_id) !== String(task.id));
        if (!ctx.alive()) return;
        if (!others.length) {
          for (const c of [nearestCard, darkCard]) c.replaceChildren(c.firstChild, h("p", { class: "muted" }, "No other task in this space yet."));
          return;
        }
        // every task of the map (the map itself is an even subset past max_matrix_tasks: said under the table), in
        // matrices of this task and NEIGHBOUR_CHUNK others (the first 127 alone were compared: a twin past them was
        // missing from "Nearest tasks" while the sources ranked it first)
        const names = new Map(others.map((p) => [String(p.task_id), p.name]));
        const rows = [];
        for (let at = 0; at < others.length; at += NEIGHBOUR_CHUNK) {
          const ids = [task.id, ...others.slice(at, at + NEIGHBOUR_CHUNK).map((p) => p.task_id)];
          const m = await api("/align/matrix", { method: "POST", body: { task_ids: ids } });
          if (!ctx.alive()) return;
          const mids = (m.ids || ids).map(String);
          const me = mids.indexOf(String(task.id));
          const unestimated = unestimatedPairs(m);
          rows.push(...mids.map((tid, j) => ({ id: tid, name: names.get(tid) ?? `task ${tid}`,
            fisher: m.fisher[me][j], activation: m.activation[me][j], error: m.error[me][j],
            unestimated: unestimated.has(`${me},${j}`) })).filter((r) => r.id !== String(task.id)));
        }
        const nearest = [...rows].sort((a, b) => b.fisher - a.fisher).slice(0, 8);
        const dark = rows.filter((r) => isDark(r.fisher, r.activation, r.unestimated, DARK_RULE)).sort((a, b) => (b.activation - b.fisher) - (a.activation - a.fisher)).slice(0, 8);
        const among = atlas && atlas.sampled ? ` Among the ${others.length} tasks of the map, an even sample of the `
          + `space's ${atlas.total} ready tasks (see Recommended sources for all of them).` : "";
        nearestCard.replaceChildren(h("h2", {}, "Nearest tasks"), h("p", { class: "muted small" }, `By Fisher alignment.${among}`), neighbourTable(nearest, "nearest-row"));
        darkCard.replaceChildren(h("h2", {}, "Activation-dark neighbours"),
          h("p", { class: "muted small" }, `Activation ≥ ${DARK_RULE.darkAct} but Fisher ≤ ${DARK_RULE.darkFisher} (the API's rule, as the sources' badge): they look alike to the model's activations, yet fine-tuning on them moves the head differently.`),
          dark.length ? neighbourTable(dark, "dark-row") : h("p", { class: "muted" }, "None — every task whose activations resemble this one's also aligns in Fisher geometry."));
      } catch (err) {
        if (!ctx.alive()) return;
        for (const c of [nearestCard, darkCard]) c.replaceChildren(c.firstChild, errorBox(err, "Neighbours"));
      }
    })();
  }
  // A rate in [0, 1] as a percentage string (three decimals at most, no trailing zeros; a rate below 0.0005 % with three
  // significant digits: shown as "0", a stored 1e-9 % was refused by the form's own check when applied again).
  function fmtPct(rate) {
    const pct = 100 * rate; const short = +pct.toFixed(3);
    return String(short === 0 && pct !== 0 ? +pct.toPrecision(3) : short);
  }
  function hasRate(r) { return r.false_reject_rate !== undefined && r.false_reject_rate !== null; }
  // A task's open-set side (GET /v1/tasks/{id}/routing): its threshold and where it comes from, and its
  // template and novelty tests (docs/SCORES.md), which a write key can turn off and on (PATCH {"template": bool},
  // {"novelty": bool}).
  async function routingPanel(ctx, task, card) {
    const path = `/tasks/${encodeURIComponent(task.id)}/routing`;
    // The control in use (its test id, read before a request disables it: the focus then fell to the page body).
    const focused = () => (card.contains(document.activeElement) && document.activeElement.dataset.testid) || null;
    // A change answered: the card drawn anew, the focus back on the control that made it, and a line saying so.
    const changed = (r, focus, saved) => {
      render(r);
      const control = focus && card.querySelector(`[data-testid="${focus}"]`);
      if (control && !control.disabled) control.focus();
      const out = card.querySelector("[data-testid=routing-message]");
      if (out) out.replaceChildren(h("span", { class: "muted small", "data-testid": "routing-saved" }, saved));
    };
    const render = (r) => {
      const tpl = r.template_terms === undefined || r.template_terms === null ? "none stored (re-add the task to get one)"
        : !r.template_terms ? "no term is in every sample: not active (no prompt can lack the template)"
        : !r.template_active ? `${fmtInt(r.template_terms)} terms in every sample; not active (estimated ${fmt(100 * r.template_false_reject, 2)} % of own prompts lack one; active at ≤ 2 %)`
        : `${fmtInt(r.template_terms)} terms in every sample; active (estimated ${fmt(100 * r.template_false_reject, 2)} % of own prompts lack one)`;
      const on = r.template_test !== false;
      const noveltyOn = r.novelty_test !== false;
      const vectors = r.novelty_samples ?? 0;
      const needed = r.novelty_samples_needed ?? 39;  // at the task's rate (an older server: the default 5 %'s)
      const novelty = !noveltyOn ? `switched off (${fmtInt(vectors)} sample vectors kept)`
        : r.novelty_active ? `on (${fmtInt(vectors)} sample vectors; half the false-reject rate)`
        : needed > 128 ? `not tested (at this false-reject rate it needs ${fmtInt(needed)} sample vectors; a task keeps at most 128)`
        : vectors >= needed ? `not tested (${fmtInt(vectors)} sample vectors, ${fmtInt(needed)} needed at this rate: off for the service)`
        : `not tested (${fmtInt(vectors)} sample vectors; ${fmtInt(needed)} needed at half the false-reject rate — tasks of ${fmtInt(needed)} samples or more)`;
      // A switch of one test (PATCH {field: bool}); its error is shown below the switches, the button kept for a retry.
      const toggleError = h("div", { "data-testid": "routing-toggle-error", "aria-live": "polite" });
      const toggle = (testid, field, label, isOn) => {
        const button = h("button", { type: "button", class: "btn small ghost", "data-testid": testid,
          "data-on": String(isOn) }, isOn ? `Turn the ${label} off` : `Turn the ${label} on`);
        needsWrite(button);
        button.addEventListener("click", async () => {
          const focus = focused();
          button.disabled = true;
          toggleError.replaceChildren();
          try {
            changed(await api(path, { method: "PATCH", body: { [field]: !isOn } }), focus,
              `Saved: the ${label} is ${isOn ? "off" : "on"}.`);
          } catch (err) {
            button.disabled = false;
            toggleError.replaceChildren(errorBox(err, label));
          }
        });
        return button;
      };
      card.replaceChildren(h("h2", {}, "Routing"),
        h("p", { class: "muted small" }, "A prompt is answered “none” below the threshold, when it lacks a term every sample of this task has (its template) while the template test is on, or when its mean hidden state is atypical of this task's samples while the novelty test is on."),
        kv([["threshold", h("span", { "data-testid": "routing-threshold", "data-source": r.source },
          `${fmt(r.threshold)} (${r.source}${r.novelty_active && r.source === "calibrated" ? ": at half the rate, the novelty test has the other half" : ""})`)],
          ["false-reject rate", h("span", { "data-testid": "routing-rate-state" }, hasRate(r)
            ? `${fmtPct(r.false_reject_rate)} % of own prompts (threshold at that whole rate ${r.threshold_auto === undefined || r.threshold_auto === null ? "—" : fmt(r.threshold_auto)})`
            : task.status !== "ready" ? "— (none yet: the task has no signature; its first job calibrates it)"
            : "— (no calibration stored: the task is too small or older than calibration)")],
          ["calibration scores", fmtInt(r.calibration_scores ?? 0)],
          ["short prompts", h("span", { "data-testid": "routing-short-prompts" }, r.short_prompt_tokens === undefined || r.short_prompt_tokens === null
            ? "— (no held-out views stored: every prompt is judged on whole samples)"
            : `under ${fmtInt(Math.round(r.short_prompt_tokens))} tokens: threshold of their length (${fmtInt(r.length_views ?? 0)} held-out views), no novelty test`)],
          ["typical score", r.typical_score === undefined || r.typical_score === null ? "—" : fmt(r.typical_score)],
          ["template", h("span", { "data-testid": "template-state" }, tpl)],
          ["template test", h("span", { "data-testid": "template-test" }, on ? "on" : "off")],
          ["novelty test", h("span", { "data-testid": "novelty-test", "data-on": String(noveltyOn) }, novelty)]]),
        h("div", { class: "btn-row" }, toggle("template-toggle", "template", "template test", on),
          (() => {
            const b = toggle("novelty-toggle", "novelty", "novelty test", noveltyOn);
            // on but not tested (too few sample vectors at this rate): what the switch does then is not obvious
            if (noveltyOn && !r.novelty_active && !b.dataset.needsScope) {
              b.title = "The test does not run for this task now (see above); switched off, it stays off once the task has enough sample vectors.";
            }
            return b;
          })()),
        toggleError,
        thresholdForm(r));
    };
    // The task's false-reject rate (its threshold re-calibrated from stored held-out scores, no model run) and a
    // threshold override that wins over it (PATCH {"false_reject_rate"}, {"threshold"}; null clears the override).
    const thresholdForm = (r) => {
      const rate = h("input", { id: "routing-rate", type: "number", step: "any", min: 0, max: 50, class: "input num-input",
        value: hasRate(r) ? fmtPct(r.false_reject_rate) : "", disabled: hasRate(r) ? null : true, "data-testid": "routing-rate" });
      const override = h("input", { id: "routing-override", type: "number", step: "any", min: -1, max: 1, placeholder: "none",
        class: "input num-input", value: r.threshold_override === undefined || r.threshold_override === null ? "" : String(r.threshold_override),
        "data-testid": "routing-override" });
      const apply = h("button", { type: "submit", class: "btn small", "data-testid": "routing-apply" }, "Apply");
      const clear = h("button", { type: "button", class: "btn small ghost", "data-testid": "routing-clear",
        disabled: r.threshold_override === undefined || r.threshold_override === null ? true : null }, "Clear override");
      const out = h("div", { "data-testid": "routing-message", "aria-live": "polite" });
      const form = h("form", { class: "controls routing-form", novalidate: true, "data-testid": "routing-form" },
        h("label", { class: "field inline", for: "routing-rate" }, h("span", {}, "false-reject rate (%)"), rate),
        h("label", { class: "field inline", for: "routing-override" }, h("span", {}, "threshold override"), override),
        apply, clear, out);
      for (const control of [rate, override, apply, clear]) needsWrite(control);
      const send = async (body) => {
        const focus = focused();
        for (const b of [apply, clear]) b.disabled = true;
        try {
          changed(await api(path, { method: "PATCH", body }), focus === "routing-clear" ? "routing-override" : focus,
            body.threshold === null && Object.keys(body).length === 1 ? "Saved: the override is cleared."
              : "Saved: the threshold above is what prompts are held to now.");
        } catch (err) {
          apply.disabled = false;
          clear.disabled = r.threshold_override === undefined || r.threshold_override === null;
          out.replaceChildren(errorBox(err, "Routing"));
        }
      };
      form.addEventListener("submit", (ev) => {
        ev.preventDefault();
        const body = {};
        if (hasRate(r)) {
          const pct = rate.value.trim() === "" ? NaN : Number(rate.value);
          if (!(pct > 0 && pct <= 50)) {  // the API's (0, 0.5], said in percent
            out.replaceChildren(errorBox("give the false-reject rate as a percentage above 0 and at most 50", "Routing"));
            return;
          }
          if (rate.value !== fmtPct(r.false_reject_rate)) body.false_reject_rate = pct / 100;
        }
        const text = override.value.trim();
        if (text !== "" || override.validity.badInput) {  // (a number field reads "" for text it cannot parse)
          const thr = text === "" ? NaN : Number(text);
          if (!(thr >= -1 && thr <= 1)) { out.replaceChildren(errorBox("the threshold override is a number in [-1, 1]", "Routing")); return; }
          if (thr !== r.threshold_override) body.threshold = thr;
        } else if (r.threshold_override !== undefined && r.threshold_override !== null) {
          body.threshold = null;
        }
        if (!Object.keys(body).length) { out.replaceChildren(h("span", { class: "muted small" }, "Nothing changed.")); return; }
        send(body);
      });
      clear.addEventListener("click", () => send({ threshold: null }));
      return form;
    };
    try {
      const r = await api(path);
      if (ctx.alive()) render(r);
    } catch (err) {
      if (ctx.alive()) card.replaceChildren(card.firstChild, errorBox(err, "Routing"));
    }
  }

  function stat(label, value, testid) {
    return h("div", { class: "stat", "data-testid": testid || null }, h("div", { class: "stat-value" }, value), h("div", { class: "stat-label" }, label));
  }
  function miniBar(v, cls) {
    const wrap = h("span", { class: "minibar" });
    const fill = h("span", { class: `minibar-fill ${cls}` });
    fill.style.width = `${(clamp01(Number(v)) * 100).toFixed(1)}%`;
    wrap.append(fill);
    return wrap;
  }
  function neighbourTable(rows, testid) {
    return h("div", { class: "table-wrap" }, h("table", { class: "table compact" },
      h("thead", {}, h("tr", {}, h("th", {}, "Task"), h("th", { class: "num" }, "Fisher"), h("th", { class: "num" }, "Activation"),
        h("th", { class: "num" }, "Error"))),
      h("tbody", {}, rows.map((r) => h("tr", { "data-testid": testid, "data-task-id": r.id },
        h("td", {}, taskLink(r.id, truncate(r.name, 32))),
        h("td", { class: "num" }, miniBar(r.fisher, "f-fisher"), fmt(r.fisher, 2)),
        h("td", { class: "num" }, miniBar(r.activation, "f-act"), fmt(r.activation, 2)),
        h("td", { class: "num" }, miniBar(r.error, "f-err"), fmt(r.error, 2)))))));
  }

  // ------------------------------------------------------------------ Routing playground
  const routeState = { prompt: "", k: 5, threshold: "" };
  // What is wrong with the top-k and threshold fields (as the API takes them), or null.
  function routeInputError(k, thr) {
    const kn = k.value.trim() === "" ? 5 : Number(k.value);
    if (k.validity.badInput || !Number.isInteger(kn) || kn < 1 || kn > 100) return "top k is a whole number from 1 to 100.";
    const tv = Number(thr.value);
    if (thr.validity.badInput || (thr.value.trim() !== "" && !(tv >= -1 && tv <= 1))) {
      return "the threshold is a number from -1 to 1 (empty: each task's own).";
    }
    return null;
  }
  // How to read the matches (docs/SCORES.md): their order is the ranking's, the shown score the route score.
  function routeNote(matches) {
    const fused = matches.some((m) => m.lexical !== undefined && m.lexical !== null);
    return h("p", { class: "muted small route-note", "data-testid": "route-note" },
      `Ordered by the ${fused ? "combined Fisher + lexical ranking" : "Fisher ranking"}; the number shown is the route score, `
      + "so it need not descend. “None” is decided on the answered (first) task's route score against its threshold (tick); "
      + "the nearest task's threshold and the answered task's template and novelty tests can also answer “none”.");
  }
  async function viewRoute(ctx) {
    const root = h("section", { class: "page", "data-testid": "route-view" });
    root.append(pageHeader("Routing playground",
      "Type a prompt: its signature (all next-token positions) is matched against the stored tasks. " +
      "When no task is close enough the open-set answer is “none”: treat the prompt as a new task."));
    const prompt = h("textarea", { id: "route-prompt", rows: 5, class: "input", "data-testid": "route-prompt",
      placeholder: "e.g. Question: is the sky blue? Answer:", value: routeState.prompt });
    const k = h("input", { id: "route-k", type: "number", min: 1, max: 100, value: routeState.k, class: "input num-input" });
    const thr = h("input", { id: "route-threshold", type: "number", step: "any", min: -1, max: 1, value: routeState.threshold,
      placeholder: "auto", class: "input num-input" });
    const results = h("div", { class: "route-results", "data-testid": "route-results", "aria-live": "polite" });
    const submit = h("button", { class: "btn primary", type: "submit", "data-testid": "route-submit" }, "Route");
    const form = h("form", { class: "card route-form", novalidate: true },
      h("label", { for: "route-prompt", class: "field block" }, h("span", {}, "Prompt")), prompt,
      h("div", { class: "form-row" },
        h("label", { class: "field inline", for: "route-k" }, h("span", {}, "top k"), k),
        h("label", { class: "field inline", for: "route-threshold" }, h("span", {}, "threshold"), thr),
        h("span", { class: "grow" }), h("span", { class: "muted small" }, "Ctrl+Enter"), submit));
    prompt.addEventListener("keydown", (e) => { if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); form.requestSubmit(); } });
    form.addEventListener("submit", async (e) => {
      e.preventDefault();
      routeState.prompt = prompt.value; routeState.k = Number(k.value) || 5; routeState.threshold = thr.value;
      if (!prompt.value.trim()) { results.replaceChildren(errorBox(new Error("Type a prompt first."), "Routing")); return; }
      const bad = routeInputError(k, thr);  // the form's own check: a browser bubble left the last answer shown
      if (bad) { results.replaceChildren(errorBox(new Error(bad), "Routing")); return; }
      const body = { prompt: prompt.value, k: routeState.k };
      if (thr.value !== "" && Number.isFinite(Number(thr.value))) body.threshold = Number(thr.value);
      submit.disabled = true;
      results.replaceChildren(h("p", { class: "muted loading" }, "Routing…"));
      const t0 = performance.now();
      try {
        let res = await api("/route", { method: "POST", body });
        if (Array.isArray(res)) res = res[0];
        if (res && Array.isArray(res.results)) res = res.results[0];
        if (!ctx.alive()) return;
        renderRoute(res || {}, performance.now() - t0);
      } catch (err) {
        if (!ctx.alive()) return;
        results.replaceChildren(errorBox(err, "Routing"));
      } finally { submit.disabled = false; }
    });
    function renderRoute(res, ms) {
      const matches = res.matches || [];
      const none = !!res.none;
      const thrUsed = pick(res, "threshold");
      const top = res.best_score !== undefined && res.best_score !== null ? Number(res.best_score)
        : matches.length ? Number(matches[0].score) : null;
      const maxScore = Math.max(1e-9, ...matches.map((m) => Math.abs(Number(m.score)) || 0), 1);
      const best = matches.length ? truncate(matches[0].name ?? `task ${matches[0].task_id}`, 48) : null;
      results.replaceChildren(...[  // (only nodes: replaceChildren writes null as the text "null")
        h("div", { class: `verdict ${none ? "none" : "match"}`, "data-testid": "route-verdict", "data-none": String(none),
          "data-threshold": thrUsed !== undefined ? String(thrUsed) : null },
          none
            ? h("div", { "data-testid": "route-none" }, h("strong", {}, "None of the stored tasks. "),
              res.rejected_by ? `${capitalise(res.rejected_by.message)}.` : "", " This prompt looks like a new task (open set).")
            : h("div", {}, h("strong", {}, "Routed. "), best ? `Best match: ${best} (score ${fmt(top)})` : "No tasks stored.",
              thrUsed !== undefined ? ` · threshold ${fmt(thrUsed)}` : ""),
          h("span", { class: "muted small" }, `${Math.round(ms)} ms`)),
        res.truncated ? h("p", { class: "note small", "data-testid": "route-truncated" },
          "This prompt is longer than the model's token limit: only its first tokens were read, so the answer is about that prefix.") : null,
        matches.length ? routeNote(matches) : null,
        matches.length ? h("ol", { class: "matches" }, matches.map((m, i) => {
          const fill = h("span", { class: "score-fill" });
          fill.style.width = `${(clamp01(Number(m.score) / maxScore) * 100).toFixed(1)}%`;
          // each task has its own threshold (the answer's is the best match's): the row is judged by its own
          const thr = pick(m, "threshold") ?? thrUsed;
          const below = thr !== undefined && Number(m.score) < Number(thr);
          const bar = h("span", { class: "score-bar" }, fill);
          if (thr !== undefined && Number.isFinite(Number(thr))) {
            const tick = h("span", { class: "thr-tick", title: `threshold ${fmt(thr)}` + (m.length_matched
              ? " (the prompt is short for this task: the lower of its calibrated threshold and its held-out prefixes' of this length, moved by its override if it has one)" : "") });
            tick.style.left = `${(clamp01(Number(thr) / maxScore) * 100).toFixed(1)}%`;
            bar.append(tick);
          }
          return h("li", { class: `match-row ${below ? "below" : ""}`, "data-testid": "route-match", "data-task-id": m.task_id },
            h("span", { class: "rank" }, String(i + 1)),
            taskLink(m.task_id, truncate(m.name ?? `task ${m.task_id}`, 48)),
            bar,
            h("span", { class: "mono score", title: m.rank_score !== undefined && m.rank_score !== null
              ? `route score ${fmt(m.score)}; ranking score ${fmt(m.rank_score)}` + (m.lexical !== undefined && m.lexical !== null
                ? `; lexical ${fmt(m.lexical)} (both order the matches)` : " (orders the matches)")
              : `route score ${fmt(m.score)}` }, fmt(m.score)));
        })) : null].filter(Boolean));
    }
    root.append(form, results, fitPanel());
    view().replaceChildren(root);
    prompt.focus();
  }

  // ------------------------------------------------------------------ fit: thresholds from labelled prompts
  // The CLI's file format (JSON lines of {"prompt", "label"}; a label is a task name or id, or "none"), checked here
  // line by line so that a typo names its line; POST /v1/route/fit with or without dry_run (docs/SCORES.md, "fit").
  const FIT_MAX_EXAMPLES = 2000;  // FitRequest.examples' max_length
  const FIT_MAX_FILE_BYTES = 32 << 20;  // read into the page whole: a larger file is not 2,000 prompts one wants to paste
  const fitState = { text: "" };
  // The labelled prompts of the fit card's text, `.lines[i]`: the line (from 1) of example i. As `fisher-atlas fit`
  // reads them: one JSON object a line, or CSV / TSV with a header row naming "prompt" and "label" (other columns
  // ignored, a label a task's name or "none"). Which one the first line tells, as a file's or pasted: JSON lines when it
  // begins with "{", else a header row, of TSV when it holds a tab, of CSV otherwise.
  function parseFitExamples(text) {
    text = text.replace(/^\ufeff/, "");  // a BOM is no text
    const first = text.split(/\r?\n/).find((l) => l.trim()) || "";
    const examples = !first || first.trimStart().startsWith("{") ? parseFitLines(text)
      : parseFitTable(text, first.includes("\t") ? "\t" : ",");
    if (!examples.length) throw new Error("give at least one labelled prompt: one JSON object per line, or CSV / TSV rows under a header naming prompt and label.");
    if (examples.length > FIT_MAX_EXAMPLES) throw new Error(`at most ${FIT_MAX_EXAMPLES} labelled prompts per fit (${examples.length} given).`);
    return examples;
  }
  function parseFitLines(text) {
    const examples = []; examples.lines = [];
    const lines = text.split(/\r?\n/);
    for (let i = 0; i < lines.length; i++) {
      if (!lines[i].trim()) continue;
      let rec;
      try { rec = JSON.parse(lines[i]); } catch (_) { rec = undefined; }
      const ok = rec && typeof rec === "object" && !Array.isArray(rec) && typeof rec.prompt === "string"
        && rec.prompt.length > 0 && (typeof rec.label === "string" || Number.isInteger(rec.label));
      const top = ok ? topLevelMembers(lines[i]) : [];
      const twice = top.map((m) => m.key).find((k, at, keys) => keys.indexOf(k) !== at);
      if (twice !== undefined) throw new Error(`line ${i + 1}: key "${twice}" is given more than once (JSON keeps the last; say it once).`);
      const label = top.find((m) => m.key === "label");
      if (!ok || (typeof rec.label === "number" && !/^-?\d+$/.test(label.value)))
        throw new Error(`line ${i + 1}: expected a JSON object with a non-empty "prompt" and a "label" (a task name or id, or "none").`);
      examples.push({ prompt: rec.prompt, label: rec.label }); examples.lines.push(i + 1);
    }
    return examples;
  }
  // The members of a JSON object's text (one that JSON.parse has read) at its top level, in order, each key with the
  // raw text of its value: JSON.parse keeps the last of a repeated key, and reads 1.0 as the task id 1, where the CLI's
  // fit refuses both (a parity review, 2026-12-07).
  function topLevelMembers(text) {
    const members = [];
    let depth = 0, key = null, valueAt = -1;
    const close = (end) => {
      if (key !== null) members.push({ key, value: text.slice(valueAt, end).trim() });
      key = null;
    };
    for (let i = 0; i < text.length; i++) {
      const c = text[i];
      if (c === '"') {
        let j = i + 1;
        while (text[j] !== '"') j += text[j] === "\\" ? 2 : 1;
        const rest = text.slice(j + 1).match(/^\s*:/);
        if (depth === 1 && key === null && rest) { key = JSON.parse(text.slice(i, j + 1)); valueAt = j + 1 + rest[0].length; i = j + rest[0].length; }
        else i = j;
      } else if (c === "{" || c === "[") depth++;
      else if (c === "}" || c === "]") { if (depth === 1) close(i); depth--; }
      else if (c === "," && depth === 1) close(i);
    }
    return members;
  }
  // CSV (RFC 4180: a field in double quotes may hold the delimiter, line breaks and "" for a quote) or TSV rows, each
  // with the line it ends on; a malformed row (text after a closing quote, a quote left open) names the line it starts on.
  function delimitedRows(text, delim) {
    const rows = [];
    let row = [], field = "", line = 1, start = 1, i = 0, quoted = false;
    const endField = () => { row.push(field); field = ""; };
    const endRow = () => { endField(); rows.push({ cells: row, line }); row = []; };
    while (i < text.length) {
      const c = text[i];
      if (quoted) {
        if (c === '"' && text[i + 1] === '"') { field += '"'; i += 2; continue; }
        if (c === '"') {
          quoted = false; i++;
          const next = text[i];
          if (next !== undefined && next !== delim && next !== "\n" && next !== "\r")
            throw new Error(`line ${start}: not CSV: text after a closing quote (a quote inside a quoted field is written "").`);
          continue;
        }
        if (c === "\n") line++;
        field += c; i++; continue;
      }
      if (c === '"' && field === "") { quoted = true; i++; continue; }
      if (c === delim) { endField(); i++; continue; }
      if (c === "\n" || c === "\r") {
        endRow(); i += c === "\r" && text[i + 1] === "\n" ? 2 : 1; line++; start = line; continue;
      }
      field += c; i++;
    }
    if (quoted) throw new Error(`line ${start}: not CSV: a quoted field is not closed.`);
    if (field !== "" || row.length) endRow();
    return rows.filter((r) => !(r.cells.length === 1 && r.cells[0] === ""));  // blank lines
  }
  function parseFitTable(text, delim) {
    const rows = delimitedRows(text, delim);
    const examples = []; examples.lines = [];
    if (!rows.length) return examples;
    const header = rows[0].cells.map((n) => n.trim().toLowerCase());  // " Label" is "label"
    const p = header.indexOf("prompt"), l = header.indexOf("label");
    if (p < 0 || l < 0)
      throw new Error(`line ${rows[0].line}: expected a JSON object per line, or a header row naming the columns "prompt" and "label" (CSV, or TSV with tabs).`);
    const twice = ["prompt", "label"].filter((n) => header.indexOf(n) !== header.lastIndexOf(n));
    if (twice.length)  // which column is meant cannot be told (the last was read), as the CLI says
      throw new Error(`line ${rows[0].line}: the header row names ${twice.map((n) => `"${n}"`).join(" and ")} more than once.`);
    for (const { cells, line } of rows.slice(1)) {
      if (cells.length <= Math.max(p, l)) throw new Error(`line ${line}: the row has fewer columns than the header.`);
      if (cells.slice(header.length).some((c) => c.trim()))  // an unquoted comma cut the prompt there, without a word
        throw new Error(`line ${line}: the row has more columns than the header (quote a field that holds the delimiter).`);
      const prompt = cells[p], label = cells[l].trim();
      if (!prompt.trim() && !label) continue;
      if (!label) throw new Error(`line ${line}: no label: a task name, or "none".`);
      if (!prompt.trim()) throw new Error(`line ${line}: the prompt is empty.`);
      examples.push({ prompt, label }); examples.lines.push(line);
    }
    return examples;
  }
  function fitPanel() {
    const text = h("textarea", { id: "fit-examples", rows: 6, class: "input mono", "data-testid": "fit-examples",
      spellcheck: "false", value: fitState.text,
      placeholder: '{"prompt": "Question: is the sky blue? Answer:", "label": "questions"}\n{"prompt": "SELECT 1;", "label": "none"}' });
    const file = h("input", { id: "fit-file", type: "file", accept: ".jsonl,.json,.txt,.csv,.tsv,application/json,text/plain,text/csv,text/tab-separated-values",
      class: "input", "data-testid": "fit-file" });
    const preview = h("button", { type: "button", class: "btn", "data-testid": "fit-preview" }, "Preview (dry run)");
    const apply = needsWrite(h("button", { type: "button", class: "btn primary", "data-testid": "fit-apply" }, "Fit and store"));
    const out = h("div", { class: "fit-results", "data-testid": "fit-results", "aria-live": "polite" });
    text.addEventListener("input", () => { fitState.text = text.value; });
    file.addEventListener("change", async () => {
      const f = file.files && file.files[0];
      if (!f) return;
      if (f.size > FIT_MAX_FILE_BYTES) {
        out.replaceChildren(errorBox(new Error(`${f.name} is ${fmtInt(Math.round(f.size / 1048576))} MiB: fit takes at most ${FIT_MAX_EXAMPLES} labelled prompts, read from a file of at most ${FIT_MAX_FILE_BYTES >> 20} MiB.`), "Fit"));
        return;
      }
      try {
        text.value = fitState.text = await f.text();
        // labelled prompts, not lines (a CSV's header, and a quoted prompt over several lines, are no prompts)
        let count;
        try {
          const n = parseFitExamples(text.value).length;
          count = `${fmtInt(n)} labelled prompt${n === 1 ? "" : "s"}`;
        } catch (_) { count = null; }
        out.replaceChildren(h("p", { class: "muted small" }, count ? `Read ${f.name}: ${count}.`
          : `Read ${f.name}; Preview names what is wrong with it.`));
      } catch (err) { out.replaceChildren(errorBox(err, "Fit")); }
      file.value = "";  // choosing the same file again (after editing the text) reads it again
    });
    const run = async (dryRun) => {
      let examples;
      try { examples = parseFitExamples(text.value); } catch (err) { out.replaceChildren(errorBox(err, "Fit")); return; }
      for (const b of [preview, apply]) b.disabled = true;
      out.replaceChildren(h("p", { class: "muted loading" }, `Routing ${fmtInt(examples.length)} labelled prompts…`));
      try {
        const res = await api("/route/fit", { method: "POST", body: { examples: [...examples], dry_run: dryRun } });
        out.replaceChildren(fitSummary(res || {}, examples.length));
      } catch (err) {
        // the API numbers examples from 0 without blank lines; the card's own checks name lines from 1
        const at = err instanceof ApiError && err.detail && Number.isInteger(err.detail.example)
          ? examples.lines[err.detail.example] : undefined;
        out.replaceChildren(errorBox(at === undefined ? err
          : new ApiError(err.code, err.message.replace(/^example \d+/, `line ${at}`), err.status, err.detail), "Fit"));
      } finally { preview.disabled = false; apply.disabled = !canWrite(); }
    };
    preview.addEventListener("click", () => run(true));
    apply.addEventListener("click", () => run(false));
    return h("section", { class: "card fit-card", "data-testid": "fit-card" },
      h("h2", {}, "Tune thresholds from labelled prompts (fit)"),
      h("p", { class: "muted small" }, "One JSON object per line, as for ", h("code", {}, "fisher-atlas fit"), ": ",
        h("code", {}, '{"prompt": …, "label": …}'), ", the label a task's name or id, or ", h("code", {}, '"none"'),
        " for a prompt that belongs to no task; or CSV / TSV rows under a header naming ", h("code", {}, "prompt"), " and ",
        h("code", {}, "label"), " (a spreadsheet's export). Each task that answers prompts labelled otherwise gets the threshold with "
        + "the most right answers, never above what its own false-reject rate allows; a task's template or novelty "
        + "test is turned off when its labelled prompts show that they do not fit it. Needs a write key to store."),
      h("label", { for: "fit-examples", class: "field block" }, h("span", {}, "Labelled prompts")), text,
      h("div", { class: "form-row" },
        h("label", { class: "field inline", for: "fit-file" }, h("span", {}, "or read a file"), file),
        h("span", { class: "grow" }), preview, apply),
      out);
  }
  function fitSummary(res, n) {
    const thresholds = Object.entries(res.thresholds || {}).sort(([a], [b]) => a.localeCompare(b));
    // a task whose novelty test went off is held to its whole-rate threshold from then on (no override: said here)
    const unsplit = (n) => res.unsplit && Object.hasOwn(res.unsplit, n) && res.previous && Object.hasOwn(res.previous, n)
      ? `; threshold ${fmt(res.previous[n], 4)} → ${fmt(res.unsplit[n], 4)} (its whole false-reject rate, no longer half)` : "";
    const off = (names, what) => (names || []).map((n) =>
      h("li", { "data-testid": "fit-switched-off", "data-test": what },
        `${n}: ${what} test turned off${what === "novelty" ? unsplit(n) : ""}`));
    const switched = [...off(res.template_off, "template"), ...off(res.novelty_off, "novelty")];
    const held = Object.entries(res.held_by_cap || {}).sort(([a], [b]) => a.localeCompare(b)).map(([name, n]) =>
      h("li", { "data-testid": "fit-held-by-cap", "data-task": name },
        `${name}: still answers ${fmtInt(n)} prompt${n === 1 ? "" : "s"} labelled otherwise — refusing ${n === 1 ? "it" : "them"} `
        + "would pass its false-reject rate on its own prompts (more samples, or a higher rate, let fit go further)"));
    return h("div", { "data-testid": "fit-summary", "data-stored": String(!!res.stored) },
      h("p", {}, h("strong", {}, res.stored ? "Stored. " : "Dry run: nothing stored. "),
        h("span", { "data-testid": "fit-accuracy" },
          `Accuracy on the labelled prompts ${fmt(res.accuracy_before)} → ${fmt(res.accuracy_after)}`
          + (n && Number.isFinite(res.accuracy_before) && Number.isFinite(res.accuracy_after)
            ? ` (${Math.round(res.accuracy_before * n)} → ${Math.round(res.accuracy_after * n)} of ${fmtInt(n)} right).` : "."))),
      thresholds.length
        ? h("table", { class: "table", "data-testid": "fit-thresholds" },
          h("thead", {}, h("tr", {}, h("th", {}, "task"), h("th", {}, "threshold before"),
            h("th", {}, res.stored ? "new threshold (override)" : "threshold it would get"))),
          h("tbody", {}, thresholds.map(([name, thr]) => {
            const before = res.previous && Object.prototype.hasOwnProperty.call(res.previous, name) ? res.previous[name] : null;
            return h("tr", { "data-testid": "fit-threshold", "data-task": name, "data-threshold": String(thr),
              "data-before": before === null ? null : String(before) },
              h("td", {}, truncate(name, 64)), h("td", { class: "mono" }, before === null ? "—" : fmt(before, 4)),
              h("td", { class: "mono" }, fmt(thr, 4)));
          })))
        : h("p", { class: "muted", "data-testid": "fit-unchanged" }, "No threshold changes."),
      switched.length ? h("ul", { class: "fit-switched" }, switched) : null,
      held.length ? h("ul", { class: "fit-switched", "data-testid": "fit-held" }, held) : null);
  }

  // ------------------------------------------------------------------ Add / append a task (upload + live progress)
  // Errors from the API body ({code, message}) as an ApiError; shared by uploads and the SSE stream.
  async function apiErrorOf(res) {
    let data = null;
    try { data = await res.json(); } catch (_) { data = null; }
    const message = (data && typeof data.message === "string" && data.message) || `${res.status} ${res.statusText || "error"}`;
    return new ApiError((data && data.code) || String(res.status), message, res.status, data && data.detail);
  }
  function authHeaders(extra = {}) {
    const headers = { ...extra };
    const key = apiKey();
    if (key) headers["X-API-Key"] = key;
    return headers;
  }
  // A fresh Idempotency-Key per upload (crypto.randomUUID needs a secure context: localhost or https).
  function writeKey() {
    if (window.crypto && typeof window.crypto.randomUUID === "function") return `dash-${window.crypto.randomUUID()}`;
    const bytes = new Uint8Array(16);
    window.crypto.getRandomValues(bytes);
    return `dash-${Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("")}`;
  }
  const UPLOAD_ATTEMPTS = 4;
  // POST an upload with its own Idempotency-Key; a busy service (429, 503: uploads or queue full, Retry-After) is
  // asked again with the same key up to UPLOAD_ATTEMPTS times — a repeat is answered with the first one's task and
  // job, so a retry never adds twice. onWait(seconds, error) is told before each wait.
  async function upload(path, form, onWait = () => {}) {
    const headers = authHeaders({ Accept: "application/json", "Idempotency-Key": writeKey() });
    for (let attempt = 1; ; attempt++) {
      let res;
      try {
        res = await fetch(API_BASE + path, { method: "POST", headers, body: form });
      } catch (err) {
        throw new ApiError("network", `Cannot reach the service (${err && err.message ? err.message : err}).`, 0);
      }
      if (res.ok) return res.json();
      const error = await apiErrorOf(res);
      if (![429, 503].includes(res.status) || attempt >= UPLOAD_ATTEMPTS) throw error;
      const after = Number(res.headers.get("Retry-After"));
      const seconds = Math.min(Number.isFinite(after) && after > 0 ? after : 2 ** attempt, 30);
      onWait(seconds, error);
      await new Promise((r) => setTimeout(r, seconds * 1000));
    }
  }
  // Server-sent events of GET /v1/jobs/{id}/events, read with fetch() so the X-API-Key header goes along
  // (EventSource cannot send headers). Calls onJob(job) per `progress` event; resolves with the last job.
  async function streamJob(jobId, onJob, signal) {
    const res = await fetch(`${API_BASE}/jobs/${encodeURIComponent(jobId)}/events`,
      { headers: authHeaders({ Accept: "text/event-stream" }), signal });
    if (!res.ok) throw await apiErrorOf(res);
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buffer = ""; let last = null;
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      // Line ends normalised on the whole buffer, a trailing "\r" kept as is: it may be the first half of a "\r\n"
      // split between two chunks (normalised alone it made a blank line and cut the event in two).
      buffer += decoder.decode(value, { stream: true });
      const pending = buffer.endsWith("\r") ? "\r" : "";
      buffer = buffer.slice(0, buffer.length - pending.length).replace(/\r\n?/g, "\n") + pending;
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, cut); buffer = buffer.slice(cut + 2);
        let event = "message"; const data = [];
        for (const line of block.split("\n")) {
          if (line.startsWith(":")) continue;
          const i = line.indexOf(":"); const field = i < 0 ? line : line.slice(0, i);
          const val = i < 0 ? "" : line.slice(i + 1).replace(/^ /, "");
          if (field === "event") event = val; else if (field === "data") data.push(val);
        }
        if (!data.length) continue;
        const payload = JSON.parse(data.join("\n"));
        if (event === "progress") { last = payload; onJob(payload); }
        if (event === "end") { reader.cancel().catch(() => {}); return { job: last, end: payload }; }
      }
    }
    return { job: last, end: null };
  }
  // The bar's share of a job: its samples, then (phase "routing", while running) the prompts of the routing
  // pass, like the figures and the API's ETA (it stood at 100 % through the pass, often as long as the samples).
  // The bar covers a job's two passes: its samples (the signature), then its routing pass (`phase: routing`: the
  // calibration samples of a text task, every prompt of a completion task, which costs about three times the
  // completion-token extraction: bench/results/extraction.md, 2b) — so it never runs back to 0 between them.
  function jobFraction(job, mode) {
    const p = job.progress || {};
    if (job.status === "succeeded") return 1;
    const share = mode === "completion" ? 0.25 : 0.9;  // of the bar, the samples' pass
    const part = (done, total) => (Number(total) > 0 ? clamp01((Number(done) || 0) / Number(total)) : 0);
    if (p.phase === "routing") return share + (1 - share) * part(p.routing_done, p.routing_total);
    return share * part(p.samples_done, p.samples_total);
  }
  // What a succeeded job left out of its samples or cut (the API's `result.notes`), as one sentence, or "".
  function sampleNotes(job) {
    const notes = (job && job.result && job.result.notes) || [];
    return notes.length ? `${notes.join("; ")}.` : "";
  }
  function progressFigures(p, status) {
    // tokens streamed through the model (prompts included), their rate, samples/s and the ETA, from the job
    const streamed = Number(p.tokens_streamed); const tps = Number(p.tokens_streamed_per_s ?? p.tokens_per_s);
    const sps = Number(p.samples_per_s); const eta = p.eta_s === null || p.eta_s === undefined ? NaN : Number(p.eta_s);
    return [
      `${fmtInt(Number(p.samples_done) || 0)} / ${Number(p.samples_total) ? fmtInt(Number(p.samples_total)) : "?"} samples`,
      ` · ${fmtInt(Number.isFinite(streamed) ? streamed : Number(p.tokens) || 0)} tokens through the model`,
      Number.isFinite(tps) && tps > 0 ? ` · ${fmtInt(Math.round(tps))} tokens/s` : "",
      Number.isFinite(sps) && sps > 0 ? ` · ${fmt(sps, 1)} samples/s` : "",
      p.phase === "routing" && status === "running"  // after the samples: the prompts that route to the task
        ? ` · routing prompts ${fmtInt(Number(p.routing_done) || 0)} / ${fmtInt(Number(p.routing_total) || 0)}` : "",
      // the job's estimate is of its samples' pass, which the routing pass follows (3x it in completion mode): said
      // as such, and not shown once that pass is over ("about 0 s left" with three quarters of the bar to go)
      status === "running" && p.phase !== "routing" && Number.isFinite(eta) ? ` · about ${fmtDuration(eta)} left for the samples` : "",
    ].join("");
  }

  // The service's rule for a text file (file_formats.check_plain_text): JSON lines when the first line is a JSON
  // object ("{{user}} asked…" or "{ int x = 1; }" are text samples).
  function firstLineIsObject(text) {
    try {
      const first = JSON.parse(text.split("\n", 1)[0]);
      return first !== null && typeof first === "object" && !Array.isArray(first);
    } catch (_) { return false; }
  }
  let addPanelNode = null;
  // One panel for the whole page life, re-attached on each atlas render, so a running upload keeps its
  // progress while the atlas redraws around it.
  function addPanel(tasks) {
    if (!addPanelNode) addPanelNode = buildAddPanel();
    addPanelNode.setTasks(tasks || []);
    return addPanelNode;
  }
  function buildAddPanel() {
    const target = h("select", { id: "add-target", "data-testid": "add-target" });
    const file = h("input", { id: "add-file", type: "file", "data-testid": "add-file",
      accept: ".jsonl,.ndjson,.jsonlines,.json,.csv,.tsv,.parquet,.txt,.text,.gz,text/plain,application/json,text/csv,text/tab-separated-values,application/gzip" });
    const name = h("input", { id: "add-name", type: "text", autocomplete: "off", spellcheck: "false",
      placeholder: "e.g. legal-contracts", "data-testid": "add-name", class: "input" });  // styled as the selects beside it
    const mode = h("select", { id: "add-mode", "data-testid": "add-mode" },  // short labels: a long one was clipped
      h("option", { value: "text", title: "every next token of each sample counts" }, "text"),
      h("option", { value: "completion", title: "prompt/completion pairs: only the completion's tokens count" }, "completion"));
    const meta = h("textarea", { id: "add-metadata", rows: 2, spellcheck: "false", placeholder: '{"domain": "law"}',
      "data-testid": "add-metadata" });
    // Samples typed or pasted instead of a file: sent as the file the service reads the same way (a .txt of one sample
    // per line; JSON lines, {"text"} or {"prompt", "completion"}, when the first line is a JSON object).
    const paste = h("textarea", { id: "add-paste", rows: 3, spellcheck: "false", "data-testid": "add-paste",
      placeholder: "one sample per line — or JSON lines of {\"prompt\": …, \"completion\": …}" });
    const submit = h("button", { type: "submit", class: "btn primary", "data-testid": "add-submit" }, "Upload");
    const readOnly = h("span", { class: "muted small", "data-testid": "add-read-only", hidden: true }, READ_ONLY_TITLE);
    // The outcome is read once: by taking the focus (the pressed button was disabled, the focus fell to <body>), or
    // else through the hidden live region. A message both focused and live was announced twice.
    const message = h("div", { "data-testid": "add-message", tabindex: "-1" });
    const live = h("div", { class: "sr-only", "data-testid": "add-live", "aria-live": "polite" });
    const announce = () => { live.textContent = message.textContent; };
    const fill = h("span", { class: "progress-fill" });
    const bar = h("div", { class: "progress", role: "progressbar", "aria-valuemin": 0, "aria-valuemax": 100, "aria-valuenow": 0,
      "aria-label": "upload progress" }, fill);
    const statusLine = h("div", { class: "muted small", "data-testid": "add-progress-text" });
    const cancel = h("button", { type: "button", class: "btn small ghost danger", "data-testid": "add-cancel", hidden: true }, "Cancel");
    const progressBox = h("div", { class: "add-progress", "data-testid": "add-progress", hidden: true },
      h("div", { class: "job-head" }, h("span", { class: "add-status" }), h("span", { class: "muted small add-job" }),
        h("span", { class: "grow" }), cancel), bar, statusLine);
    const newOnly = [h("label", { class: "field", for: "add-name" }, h("span", {}, "Name"), name),
      h("label", { class: "field", for: "add-mode", title: "text: every next token counts; completion: prompt/completion pairs, only the completions' tokens" },
        h("span", {}, "Mode (text, or prompt → completion)"), mode),
      h("label", { class: "field", for: "add-metadata" }, h("span", {}, "Metadata (JSON object, optional)"), meta)];
    const form = h("form", { class: "add-form", "data-testid": "add-form", autocomplete: "off" },
      h("label", { class: "field", for: "add-target" }, h("span", {}, "Add to"), target),
      h("label", { class: "field", for: "add-file" }, h("span", {}, "File (JSONL, JSON, CSV, TSV, Parquet or .txt; gzipped too)"), file),
      h("label", { class: "field", for: "add-paste" }, h("span", {}, "…or paste samples"), paste),
      newOnly, h("div", { class: "btn-row" }, submit, readOnly));
    const card = h("div", { class: "card add-card", "data-testid": "add-panel" }, h("h2", {}, "Add a task"), form, message, live,
      progressBox);
    let busy = false;
    let taskModes = new Map(); let jobMode = "text";  // the uploading task's mode: its job's bar (jobFraction)

    const syncTarget = () => { for (const n of newOnly) n.hidden = target.value !== ""; };
    target.addEventListener("change", syncTarget);
    card.isBusy = () => busy;  // an upload or its job is running
    card.setTasks = (tasks) => {
      // the panel outlives a view (an upload keeps going): the key's scopes are applied at each showing
      readOnly.hidden = canWrite();
      submit.disabled = busy || !canWrite();
      if (canWrite()) { submit.removeAttribute("title"); delete submit.dataset.needsScope; } else needsWrite(submit);
      taskModes = new Map(tasks.map((t) => [String(t.id), t.mode]));
      const keep = target.value;
      target.replaceChildren(h("option", { value: "" }, "a new task"),
        ...tasks.filter((t) => t.status === "ready").map((t) => h("option", { value: String(t.id) }, `append to ${taskName(t)}`)));
      target.value = [...target.options].some((o) => o.value === keep) ? keep : "";
      syncTarget();
    };
    // quiet: an upload's own outcome, announced or focused when it ends (the submit handler's finally)
    const showError = (err, what, quiet = false) => {
      message.replaceChildren(errorBox(
        err instanceof ApiError && err.code && err.status ? new Error(`${err.message} (${err.code})`) : err, what));
      if (!quiet) announce();
    };
    // The upload was accepted and its job lives on in the service: contact was lost, not the upload (the box kept
    // "running … 0 s left" with a live Cancel under "Upload: Cannot reach the service"). retrying: the page asks
    // again and takes the job up when the service answers (after a restart it said "unknown" for good).
    const showLost = (jobId, refused, retrying) => {
      progressBox.dataset.status = "unknown";
      progressBox.querySelector(".add-status").replaceChildren(statusBadge("unknown"));
      fill.className = "progress-fill st-unknown";
      cancel.hidden = true;
      // a key revoked mid-job: "Upload: invalid or revoked API key" read as a failed upload, and it had succeeded
      statusLine.textContent = refused
        ? `Cannot follow job ${jobId}: the API key was refused. The upload was accepted and its job goes on in `
          + "the service; the Jobs page shows it with a valid key."
        : retrying ? `Lost contact with job ${jobId}: asking again every few seconds. The upload was accepted; `
          + "its job goes on once the service answers."
          : `Lost contact with job ${jobId}: its state is unknown. The upload was accepted; `
          + "the Jobs page shows the job once the service answers again.";
    };
    const showJob = (job) => {
      const p = job.progress || {};
      const frac = jobFraction(job, jobMode);
      fill.className = `progress-fill st-${job.status}`;
      fill.style.width = `${(Math.max(frac, job.status === "running" ? 0.015 : 0) * 100).toFixed(1)}%`;
      bar.setAttribute("aria-valuenow", String(Math.round(frac * 100)));
      progressBox.dataset.status = job.status;
      progressBox.dataset.phase = p.phase || "sketch";
      progressBox.dataset.jobId = String(job.id);
      progressBox.querySelector(".add-status").replaceChildren(statusBadge(job.status));
      progressBox.querySelector(".add-job").textContent = ` job ${job.id} · ${job.kind || ""}`;
      statusLine.textContent = progressFigures(p, job.status);
      cancel.hidden = !(job.status === "queued" || job.status === "running");
      if (cancel.hidden || !cancelAsked.has(String(job.id))) { cancel.textContent = "Cancel"; cancel.disabled = false; }
      if (job.status === "failed" && job.error) showError(new Error(job.error), "Job failed", busy);
    };
    // a new submit starts without the last job's bar (a failed upload showed above its green "succeeded")
    const resetProgress = () => {
      progressBox.hidden = true;
      for (const k of ["status", "phase", "jobId"]) delete progressBox.dataset[k];
    };
    cancel.addEventListener("click", async () => {
      cancel.disabled = true;
      const id = progressBox.dataset.jobId;
      try {
        const job = await cancelJob(id);
        showJob(job);
        // a running job stops at its next step: the button says so until the job ends (it came back as "Cancel", as
        // if the click had not been taken)
        if (job.status === "queued" || job.status === "running") {
          cancelAsked.add(String(id));
          cancel.textContent = "Cancelling…";
          return;
        }
      } catch (err) {
        showError(err, "Cancel");
      }
      cancel.disabled = false;
    });

    form.addEventListener("submit", async (e) => {
      e.preventDefault();
      if (busy) return;
      message.replaceChildren(); live.textContent = "";
      resetProgress();
      const chosen = file.files && file.files[0];
      const pasted = paste.value.trim();
      if (chosen && pasted) { showError(new Error("give a file or pasted samples, not both"), "Upload"); return; }
      if (!chosen && !pasted) { showError(new Error("choose a file to upload, or paste samples"), "Upload"); return; }
      const f = chosen || new File([paste.value], firstLineIsObject(pasted) ? "pasted.jsonl" : "pasted.txt",
        { type: "text/plain" });
      const data = new FormData();
      data.append("file", f, f.name);
      let path = "/tasks";
      if (target.value === "") {
        if (!name.value.trim()) { showError(new Error("give the task a name"), "Upload"); return; }
        // the service's bound, counted as it counts (code points of the NFC form), before the file is sent
        if (Array.from(name.value.trim().normalize("NFC")).length > 300) {
          showError(new Error("a task name has at most 300 characters"), "Upload");
          return;
        }
        if (meta.value.trim()) {
          let parsed;
          try { parsed = JSON.parse(meta.value); } catch (err) { showError(new Error(`metadata is not JSON: ${err.message}`), "Upload"); return; }
          if (!parsed || typeof parsed !== "object" || Array.isArray(parsed)) { showError(new Error("metadata must be a JSON object"), "Upload"); return; }
          // the text as typed: re-serialising what JSON.parse read rounded integers beyond 2^53 and sent 1e400 as
          // null; the service reads the text exactly (and refuses a number JSON cannot hold, saying so)
          data.append("metadata", meta.value.trim());
        }
        data.append("name", name.value.trim());
        data.append("mode", mode.value);
        if (atlasState.space) data.append("space", atlasState.space);
      } else {
        path = `/tasks/${encodeURIComponent(target.value)}/samples`;
      }
      jobMode = target.value === "" ? mode.value : taskModes.get(target.value);
      busy = true; submit.disabled = true;
      try {
        const accepted = await upload(path, data, (seconds, error) => {
          message.replaceChildren(h("p", { class: "muted small", "data-testid": "add-waiting" },
            `${error.message} — trying again in ${seconds} s.`));
          announce();
        });
        message.replaceChildren();
        const job = accepted.job;
        progressBox.hidden = false;
        showJob(job);
        let final = job;
        try {
          const { job: last } = await streamJob(job.id, showJob);
          if (last) final = last;
        } catch (err) {  // a cut stream (a fetch that failed: a TypeError naming fetch) is followed by polling
          const cut = err instanceof TypeError && /fetch|network/i.test(String(err.message));
          if (!(err instanceof ApiError) && !cut) throw err;
        }
        // the stream ends with the job; read the final row once (the stream may have been cut)
        let gone = false;  // the task was deleted while its job ran: the job went with it (404)
        let lostSince = null;  // no answer since (a restart): asked again, the job taken up when the service is back
        if (!["succeeded", "failed", "cancelled"].includes(final.status)) {
          for (;;) {
            try {
              final = await api(`/jobs/${encodeURIComponent(job.id)}`);
            } catch (err) {
              if (err instanceof ApiError && err.status === 404) {
                gone = true; final = { ...final, status: "cancelled" }; break;
              }
              // no answer, or a proxy's or a restarting service's (502/503/504): asked again; a 500 is said at once
              const noAnswer = !(err instanceof ApiError) || err.code === "network" || [502, 503, 504].includes(err.status);
              if (!noAnswer || (lostSince !== null && Date.now() - lostSince > RECONTACT_MS)) throw err;
              if (lostSince === null) {
                lostSince = Date.now();
                showLost(job.id, false, true);
              }
              await new Promise((r) => setTimeout(r, 2 * POLL_MS));
              continue;
            }
            if (lostSince !== null) { lostSince = null; message.replaceChildren(); cancel.hidden = false; }
            showJob(final);
            if (["succeeded", "failed", "cancelled"].includes(final.status)) break;
            await new Promise((r) => setTimeout(r, POLL_MS));
          }
        }
        showJob(final);
        if (gone) {
          message.replaceChildren(h("p", { class: "note small", "data-testid": "add-gone" },
            "The task was deleted while its job ran: nothing was added."));
        }
        if (final.status === "succeeded") {
          const notes = sampleNotes(final);
          message.replaceChildren(h("p", { class: "muted small", "data-testid": "add-done" },
            `${accepted.task ? `Task ${taskName(accepted.task)} added` : "Samples appended"}: `,
            taskLink(final.task_id, "open the task")),
          ...(notes ? [h("p", { class: "note small", "data-testid": "add-notes" }, notes)] : []));
          if (target.value === "") { name.value = ""; meta.value = ""; }
          file.value = ""; paste.value = "";
        } else if (final.status === "cancelled" && !gone) {  // it ended with the badge alone
          message.replaceChildren(h("p", { class: "note small", "data-testid": "add-cancelled" }, accepted.task
            ? `Cancelled: nothing was added. The task ${taskName(accepted.task)} is kept, failed (no signature): `
              + "upload to that name again to retry, or delete it."
            : "Cancelled: no sample was appended; the task is as it was."));
        }
        // the new point, or the task's failure; drawn before the outcome takes the focus (the redraw moves this panel)
        if (parseHash().path === "/atlas") await navigate({ keepScroll: true });
      } catch (err) {
        const jobId = progressBox.hidden ? null : progressBox.dataset.jobId;
        const noAnswer = !(err instanceof ApiError) || err.code === "network" || err.status >= 500;
        const refused = err instanceof ApiError && (err.status === 401 || err.status === 403);
        if (jobId && (noAnswer || refused) && ["queued", "running", "unknown"].includes(progressBox.dataset.status)) {
          showLost(jobId, refused, false);
          showError(err, `Following job ${jobId}`, true);
        } else if (!chosen && err instanceof Error && /^pasted\.(txt|jsonl): /.test(err.message)) {
          // named by the file the form made of them, which the user never saw
          showError(new ApiError(err.code, err.message.replace(/^pasted\.(txt|jsonl): /, "the pasted samples: "),
            err.status, err.detail), "Upload", true);
        } else {
          showError(err, "Upload", true);
        }
      } finally {
        busy = false; submit.disabled = !canWrite();
        // the button pressed was disabled while busy, which dropped the focus on <body>: the outcome takes it
        const focusTo = !document.activeElement || document.activeElement === document.body
          ? (message.childElementCount || submit.disabled ? message : submit) : null;
        if (focusTo) focusTo.focus({ preventScroll: true });
        if (focusTo !== message) announce();  // the focus is elsewhere (the user moved on): the live region reads it
      }
    });
    return card;
  }
  // Delete a task: the button asks once more before DELETE /v1/tasks/{id}.
  function deleteButton(task) {
    const btn = needsWrite(h("button", { type: "button", class: "btn small ghost danger", "data-testid": "task-delete" }, "Delete task"));
    let armed = false;
    const disarm = () => { armed = false; btn.textContent = "Delete task"; delete btn.dataset.armed; };
    btn.addEventListener("keydown", (e) => { if (e.key === "Escape" && armed && !btn.disabled) disarm(); });
    btn.addEventListener("click", async () => {
      if (!armed) {
        armed = true; btn.textContent = `Delete ${truncate(taskName(task), 24)}? Click again`;
        btn.dataset.armed = "true";
        setTimeout(() => {  // a click much later is not the confirmation of this one
          if (!btn.disabled && btn.isConnected) disarm();
        }, DELETE_ARMED_MS);
        return;
      }
      btn.disabled = true;
      try {
        await api(`/tasks/${encodeURIComponent(task.id)}`, { method: "DELETE" });
        focusPageNext = true;  // this button goes with its page (and lost the focus when disabled)
        noticeNext = `Deleted task ${taskName(task)}.`;  // said on the page it goes to (it went there silently)
        window.location.hash = "#/atlas";
      } catch (err) {
        btn.disabled = false; disarm();
        errorAfter(btn, err, "Delete");
      }
    });
    return btn;
  }
  // An action's error shown just after its button, which stays for a retry (the error replaced the button: a retry
  // took a reload); a later error replaces the earlier one.
  function errorAfter(btn, err, label) {
    const old = btn.nextElementSibling;
    if (old && old.dataset.actionError === "true") old.remove();
    const box = errorBox(err, label);
    box.dataset.actionError = "true";
    btn.after(box);
  }

  // ------------------------------------------------------------------ Jobs
  async function fetchJobs() {
    // Preferred: GET /v1/jobs, one call per status (a page of the newest jobs would drop older failures),
    // with the API's totals for the counts. Fallback: latest job of each task (when the task exposes it).
    try {
      const pages = await Promise.all([["running", 100], ["queued", 100], ["failed", 100], ["succeeded", 30], ["cancelled", 30]]
        .map(([status, limit]) => api(`/jobs${qs({ status, limit })}`)));
      const items = pages.flatMap((res) => (Array.isArray(res) ? res : (res && (res.items || res.jobs)) || []));
      const total = (i) => Number(pages[i] && pages[i].total);
      const totals = { running: total(0) + total(1), failed: total(2), finished: total(3) + total(4) };
      return { jobs: items, source: "jobs", totals };
    } catch (err) {
      if (!(err instanceof ApiError) || (err.status !== 404 && err.status !== 405)) throw err;
    }
    const tasks = await listAllTasks({}, 500);
    const ids = tasks.map((t) => pick(t, "latest_job_id", "job_id", "last_job_id") ?? (t.latest_job && t.latest_job.id))
      .filter((x) => x !== undefined && x !== null);
    const jobs = (await Promise.all(ids.slice(0, 60).map((id) => api(`/jobs/${encodeURIComponent(id)}`).catch(() => null)))).filter(Boolean);
    return { jobs, source: "tasks", tasks };
  }
  // POST /v1/jobs/{id}/cancel (a write call): a queued job ends at once, a running one at its next batch.
  function cancelJob(id) {
    return api(`/jobs/${encodeURIComponent(id)}/cancel`, { method: "POST" });
  }
  const cancelAsked = new Set();  // job ids: their rows say "Cancelling…" until the job ends
  function cancelButton(job, onError, taskLabel) {
    const asked = cancelAsked.has(String(job.id));
    const btn = h("button", { type: "button", class: "btn small ghost danger", "data-testid": "job-cancel",
      "aria-label": `Cancel job ${job.id}${taskLabel ? ` of ${taskLabel}` : ""}`,  // one of many "Cancel"s
      disabled: asked ? true : null }, asked ? "Cancelling…" : "Cancel");
    needsWrite(btn);
    btn.addEventListener("click", async () => {
      btn.disabled = true;
      try {
        const j = await cancelJob(job.id);
        if (j.status === "queued" || j.status === "running") cancelAsked.add(String(job.id));
        btn.textContent = j.status === "cancelled" ? "Cancelled" : "Cancelling…";
      } catch (err) {
        btn.disabled = false;
        if (onError) onError(err); else errorAfter(btn, err, "Cancel");
      }
    });
    return btn;
  }
  function jobRow(job, taskById, onCancelError) {
    const p = job.progress || {};
    const done = Number(p.samples_done) || 0; const total = Number(p.samples_total) || 0;
    const frac = jobFraction(job, (taskById && taskById.get(String(job.task_id)) || {}).mode);
    const tps = Number(p.tokens_per_s);
    const active = job.status === "running" || job.status === "queued";
    const task = taskById && taskById.get(String(job.task_id));
    const fill = h("span", { class: `progress-fill st-${job.status}` });
    fill.style.width = `${(Math.max(frac, job.status === "running" ? 0.015 : 0) * 100).toFixed(1)}%`;
    let eta = null;
    if (job.status === "running" && total > done && done > 0 && job.started_at) {
      const elapsed = (Date.now() - new Date(job.started_at).getTime()) / 1000;
      if (elapsed > 0) eta = (elapsed / done) * (total - done);
    }
    return h("div", { class: `job-row ${active ? "active" : ""}`, "data-testid": "job-row", "data-job-id": job.id, "data-status": job.status,
      "data-phase": p.phase || "sketch" },
      h("div", { class: "job-head" },
        statusBadge(job.status),
        h("span", { class: "job-title" }, job.task_id !== undefined && job.task_id !== null
          ? taskLink(job.task_id, task ? taskName(task) : pick(job, "task_name", "name") ?? `task ${job.task_id}`) : "(task deleted)"),
        h("span", { class: "muted small" }, `job ${job.id}${job.kind ? ` · ${job.kind}` : ""}${job.attempts ? ` · attempt ${job.attempts}` : ""}`),
        h("span", { class: "grow" }),
        h("span", { class: "muted small" }, fmtDate(pick(job, "finished_at", "started_at", "created_at"))),
        active ? cancelButton(job, onCancelError, task ? taskName(task) : pick(job, "task_name", "name")) : null),
      h("div", { class: "progress", role: "progressbar", "aria-valuemin": 0, "aria-valuemax": 100,
        "aria-valuenow": Math.round(frac * 100), "aria-label": `progress of job ${job.id}` }, fill),
      h("div", { class: "job-stats muted small" },
        p.tokens_streamed !== undefined ? progressFigures(p, job.status) : [
          `${fmtInt(done)} / ${total ? fmtInt(total) : "?"} samples · ${fmtInt(p.tokens)} tokens`,
          Number.isFinite(tps) && tps > 0 ? ` · ${fmtInt(Math.round(tps))} tokens/s` : "",
          eta !== null ? ` · about ${fmtDuration(eta)} left` : ""]),
      job.status === "failed" && job.error ? h("pre", { class: "job-error", "data-testid": "job-error" }, String(job.error)) : null);
  }
  function finishedTable(jobs, taskById) {  // (in a scroll box: seven columns do not fit a phone)
    return h("div", { class: "table-wrap" }, h("table", { class: "table compact" },
      h("thead", {}, h("tr", {}, h("th", {}, "Status"), h("th", {}, "Task"), h("th", {}, "Job"), h("th", { class: "num" }, "Samples"),
        h("th", { class: "num", title: "every token streamed through the model, prompts included (a task's page counts its sketched tokens)" }, "Tokens through model"), h("th", { class: "num" }, "Tokens/s"), h("th", { class: "num" }, "Finished"))),
      h("tbody", {}, jobs.map((job) => {
        const p = job.progress || {};
        const task = taskById.get(String(job.task_id));
        return h("tr", { "data-testid": "job-row", "data-job-id": job.id, "data-status": job.status },
          h("td", {}, statusBadge(job.status)),
          h("td", {}, job.task_id !== undefined && job.task_id !== null
            ? taskLink(job.task_id, task ? taskName(task) : pick(job, "task_name", "name") ?? `task ${job.task_id}`) : "—"),
          h("td", { class: "muted nowrap" }, `${job.id}${job.kind ? ` · ${job.kind}` : ""}`),
          h("td", { class: "num" }, fmtInt(p.samples_done)),
          h("td", { class: "num" }, fmtInt(p.tokens_streamed ?? p.tokens)),
          h("td", { class: "num" }, Number(p.tokens_streamed_per_s ?? p.tokens_per_s) > 0
            ? fmtInt(Math.round(Number(p.tokens_streamed_per_s ?? p.tokens_per_s))) : "—"),
          h("td", { class: "num muted" }, fmtDate(pick(job, "finished_at", "started_at", "created_at"))));
      }))));
  }
  async function viewJobs(ctx) {
    const root = h("section", { class: "page", "data-testid": "jobs-view" });
    const stamp = h("span", { class: "muted small", "aria-live": "off" });
    root.append(pageHeader("Jobs", "Uploads being sketched, live; failed jobs with their error.", stamp));
    const notice = h("div", { "data-testid": "jobs-message", "aria-live": "polite" });  // kept across refreshes
    const body = h("div", { class: "stack" });
    root.append(notice, body);
    view().replaceChildren(root);
    const refresh = async () => {
      let active = false;
      try {
        const { jobs, source, tasks, totals = {} } = await fetchJobs();
        if (!ctx.alive()) return;
        const taskById = new Map((tasks || []).map((t) => [String(t.id), t]));
        if (source === "jobs") {
          // names of the job rows' tasks, read by id at each poll (a rename elsewhere shows; the oldest 500 tasks were
          // listed before, so a big store's newer jobs were named one call each, 20 at most)
          const ids = [...new Set(jobs.map((j) => j.task_id).filter((id) => id !== null && id !== undefined))];
          let named = [];
          try { named = await tasksByIds(ids); } catch (_) { /* names optional */ }
          for (const t of named) taskById.set(String(t.id), t);
          if (!ctx.alive()) return;
        }
        const byNewest = (a, b) => String(pick(b, "created_at") || "").localeCompare(String(pick(a, "created_at") || "")) || Number(b.id) - Number(a.id);
        const running = jobs.filter((j) => j.status === "running" || j.status === "queued").sort(byNewest);
        const failed = jobs.filter((j) => j.status === "failed").sort(byNewest);
        const finished = jobs.filter((j) => j.status === "succeeded" || j.status === "cancelled").sort(byNewest).slice(0, 30);
        active = running.length > 0;
        const section = (title, list, emptyText, testid, render, total) => h("div", { class: "card", "data-testid": testid },
          h("h2", {}, title, h("span", { class: "count" }, String(Number.isFinite(total) ? total : list.length))),
          list.length ? render(list) : h("p", { class: "muted" }, emptyText));
        const onCancelError = (err) => notice.replaceChildren(errorBox(err, "Cancel"));
        const rowsOf = (list) => list.map((j) => jobRow(j, taskById, onCancelError));
        const had = body.contains(document.activeElement) ? document.activeElement : null;
        body.replaceChildren(
          section("Running and queued", running, "Nothing running.", "jobs-running", rowsOf, totals.running),
          section("Failed", failed, "No failed jobs.", "jobs-failed", rowsOf, totals.failed),
          section("Recently finished", finished, "No finished jobs yet.", "jobs-finished", (list) => finishedTable(list, taskById),
            totals.finished));
        settleFocus(had, false);  // the same control of the same job or task, else the page
        stamp.textContent = `updated ${new Date().toLocaleTimeString()}${active ? " · live" : ""}`;
      } catch (err) {
        if (!ctx.alive()) return;
        body.replaceChildren(errorBox(err, "Jobs"));
      }
      if (!ctx.alive()) return;
      const t = setTimeout(refresh, active ? POLL_MS : 5000);
      ctx.onCleanup(() => clearTimeout(t));
    };
    await refresh();
  }

  // ------------------------------------------------------------------ boot
  function initKeyForm() {
    const form = $("#keyform"); const input = $("#apikey"); const state = $("#keystate");
    input.value = apiKey();
    state.textContent = apiKey() ? "saved" : "";
    form.addEventListener("submit", (e) => {
      e.preventDefault();
      try {
        if (input.value.trim()) window.sessionStorage.setItem(KEY_STORAGE, input.value.trim());
        else window.sessionStorage.removeItem(KEY_STORAGE);
      } catch (_) { /* private mode */ }
      state.textContent = input.value.trim() ? "saved" : "cleared";
      navigate();
    });
  }
  // "Skip to content" (href="#view") is no route: it moves the focus to the page and leaves the hash alone.
  function initSkipLink() {
    $(".skip-link").addEventListener("click", (e) => { e.preventDefault(); view().focus(); });
  }
  window.addEventListener("hashchange", navigate);
  window.addEventListener("scroll", () => tooltip.hide(), { passive: true });
  document.addEventListener("DOMContentLoaded", () => {
    initKeyForm();
    initSkipLink();
    if (!window.location.hash) window.history.replaceState(null, "", "#/atlas");
    navigate();
  });
})();
