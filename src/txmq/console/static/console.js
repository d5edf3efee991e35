/* txmq console: fetch-based actions against the JSON API, polling and chart updates.
 *
 * No framework and no build step. Every action goes through /api with fetch and shows the API's
 * error `detail` next to the form that asked. Data from the broker is only ever put in the page
 * with textContent (never innerHTML), so message keys and bodies cannot inject markup.
 */
"use strict";

const txmq = (() => {
  const POLL_MS = 2000;
  const CHART_POINTS_MAX = 1800;  // a lag chart keeps its last hour of 2 s samples

  // -- API ------------------------------------------------------------------------------------
  function detailText(detail) {
    if (typeof detail === "string") return detail;
    if (Array.isArray(detail)) {  // FastAPI validation errors: [{loc, msg}]
      return detail.map((d) => {
        const loc = (d.loc || []).filter((p) => p !== "body" && p !== "query").join(".");
        return (loc ? loc + ": " : "") + (d.msg || JSON.stringify(d));
      }).join("; ");
    }
    return JSON.stringify(detail);
  }

  async function api(method, url, body) {
    // X-Requested-With: a 401 then carries no WWW-Authenticate (no browser Basic-auth dialog)
    const init = { method, headers: { Accept: "application/json", "X-Requested-With": "txmq-console" } };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let resp;
    try {
      resp = await fetch(url, init);
    } catch (e) {
      throw new Error("the console could not be reached: " + e.message);
    }
    const text = await resp.text();
    let data = null;
    try { data = text ? JSON.parse(text) : null; } catch (e) { data = null; }
    if (resp.status === 401) {  // the login (ACL) expired or was logged out elsewhere: log in again
      window.location.assign("/login?next=" + encodeURIComponent(location.pathname + location.search));
    }
    if (!resp.ok) {
      const detail = data && data.detail !== undefined ? detailText(data.detail)
        : (text || resp.statusText);
      const err = new Error(detail);
      err.status = resp.status;
      throw err;
    }
    return data;
  }

  // -- small DOM helpers ------------------------------------------------------------------------
  function $(sel, root) { return (root || document).querySelector(sel); }
  function $all(sel, root) { return Array.from((root || document).querySelectorAll(sel)); }

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null) continue;
      if (k === "class") node.className = v;
      else if (k === "text") node.textContent = String(v);
      else node.setAttribute(k, String(v));
    }
    for (const c of children) {
      if (c === undefined || c === null) continue;
      node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  }

  function setStatus(node, state, text) {
    if (!node) return;
    node.dataset.state = state;
    node.textContent = text;
  }

  function pad(n, w) { return String(n).padStart(w || 2, "0"); }

  function fmtTime(ms) {
    if (!ms) return "-";
    const d = new Date(ms);
    return d.getUTCFullYear() + "-" + pad(d.getUTCMonth() + 1) + "-" + pad(d.getUTCDate()) + " "
      + pad(d.getUTCHours()) + ":" + pad(d.getUTCMinutes()) + ":" + pad(d.getUTCSeconds());
  }

  function fmtNum(x, digits) {
    if (x === null || x === undefined) return "-";
    return Number(x).toLocaleString("en-US", { maximumFractionDigits: digits === undefined ? 1 : digits });
  }

  /** "1712345678901" or an ISO 8601 date-time; one without a zone ("2026-11-23T08:00") is UTC,
   *  as every time the console shows. */
  function parseTimeMs(text) {
    let t = String(text || "").trim();
    if (!t) return null;
    if (/^\d+$/.test(t)) return Number(t);
    if (/^\d{4}-\d{2}-\d{2}$/.test(t)) t += "T00:00:00";
    if (/T\d{2}:\d{2}(:\d{2}(\.\d+)?)?$/.test(t)) t += "Z";
    const ms = Date.parse(t);
    if (Number.isNaN(ms)) throw new Error(t + " is neither ms since the epoch nor an ISO 8601 date-time");
    return ms;
  }

  function flash(text) {
    try { sessionStorage.setItem("txmq.flash", text); } catch (e) { /* private mode */ }
  }

  function showFlash() {
    const box = $("#flash");
    let text = null;
    try { text = sessionStorage.getItem("txmq.flash"); sessionStorage.removeItem("txmq.flash"); } catch (e) { /* */ }
    if (box && text) setStatus(box, "ok", text);
  }

  function fill(template, values) {
    return template.replace(/\{(\w+)\}/g, (_, k) => (values[k] === undefined ? "" : String(values[k])));
  }

  // -- generic API forms ----------------------------------------------------------------------
  // <form data-api-form data-method="POST" data-url="/api/topics/{topic}" data-success="reload"
  //       data-success-message="Topic {topic} created" data-after="hookName">
  // Fields named in the URL template go into the path (URL-encoded) and not into the body;
  // data-type="int" fields are sent as numbers, data-type="time" as ms since the epoch, and empty
  // optional fields are left out. The submit button's own name=value counts as a field.
  function formValues(form, submitter) {
    const values = {};
    for (const input of $all("input, select, textarea", form)) {
      if (!input.name || input.disabled || input.type === "checkbox") continue;
      let v = input.value;
      const type = input.dataset.type;
      if (v === "" && !input.required) continue;
      if (type === "int") {
        if (!/^-?\d+$/.test(v.trim())) throw new Error(input.name + ": " + JSON.stringify(v) + " is not a whole number");
        v = Number(v);
      } else if (type === "time") {
        v = parseTimeMs(v);
      }
      values[input.name] = v;
    }
    if (submitter && submitter.name) values[submitter.name] = submitter.value;
    return values;
  }

  function splitUrl(template, values) {
    const body = Object.assign({}, values);
    const url = template.replace(/\{(\w+)\}/g, (_, k) => {
      const v = body[k];
      delete body[k];
      if (v === undefined || v === "") throw new Error(k + " is required");
      return encodeURIComponent(String(v));
    });
    return { url, body };
  }

  async function submitApiForm(form, submitter) {
    const status = $("[data-role=status]", form) || $(form.dataset.status || "#none");
    const method = (submitter && submitter.dataset.method) || form.dataset.method || "POST";
    const template = (submitter && submitter.dataset.url) || form.dataset.url;
    const confirmText = (submitter && submitter.dataset.confirm) || form.dataset.confirm;
    let values, parts;
    try {
      values = formValues(form, submitter);
      parts = splitUrl(template, values);
    } catch (e) {
      setStatus(status, "error", e.message);
      return;
    }
    if (confirmText && !window.confirm(fill(confirmText, values))) return;
    const buttons = $all("button:not([data-guard])", form);
    buttons.forEach((b) => { b.disabled = true; });
    setStatus(status, "busy", "working…");
    try {
      const sendBody = method === "GET" || method === "DELETE" ? undefined : parts.body;
      const data = await api(method, parts.url, sendBody);
      const merged = Object.assign({}, values, data || {});
      const msg = fill(form.dataset.successMessage || "done", merged);
      const after = form.dataset.after && hooks[form.dataset.after];
      if (after) after(data, form, values);
      finish(form.dataset.success || "", msg, status, merged);
    } catch (e) {
      setStatus(status, "error", e.message);
    } finally {
      buttons.forEach((b) => { b.disabled = false; });
    }
  }

  function finish(success, msg, status, values) {
    if (success === "reload") {
      flash(msg);
      window.location.reload();
    } else if (success.startsWith("redirect:")) {
      flash(msg);
      window.location.assign(fill(success.slice("redirect:".length), values));
    } else {
      setStatus(status, "ok", msg);
    }
  }

  function bindForms() {
    for (const form of $all("form[data-api-form]")) {
      form.addEventListener("submit", (ev) => {
        ev.preventDefault();
        submitApiForm(form, ev.submitter);
      });
    }
  }

  // -- hooks run after a form's API call succeeded ----------------------------------------------
  const hooks = {};

  hooks.resetDone = (data) => {
    const table = $("#group-reset-results");
    if (!table) return;
    const body = $("tbody", table);
    body.replaceChildren();
    for (const q of (data && data.queues) || []) {
      body.append(el("tr", { "data-testid": "group-reset-row" },
        el("td", { class: "num", text: q.queue_id }), el("td", { class: "num", text: fmtNum(q.offset, 0) })));
    }
    table.hidden = false;
  };

  // -- transactions ---------------------------------------------------------------------------
  function renderAudit(items) {
    const body = $("#tx-audit-table tbody");
    if (!body) return;
    body.replaceChildren();
    for (const a of items) {
      const badge = el("span", { class: "badge " + (a.outcome === "COMMIT" || a.outcome === "commit" ? "ok" : "bad"),
        text: a.outcome });
      body.append(el("tr", { "data-testid": "tx-audit-row", "data-tx-id": a.id },
        el("td", { class: "nowrap", text: fmtTime(a.time_ms) }), el("td", { class: "mono nowrap", text: a.id }),
        el("td", { text: a.topic }), el("td", {}, badge), el("td", { text: a.operator }),
        el("td", { text: a.reason })));
    }
    const empty = $("#tx-audit-empty");
    if (empty) empty.hidden = items.length > 0;
  }

  async function refreshAudit() {
    try {
      const data = await api("GET", "/api/transactions/audit?limit=50");
      renderAudit(data.items || []);
    } catch (e) {
      setStatus($("#tx-decide-status"), "error", "audit log: " + e.message);
    }
  }
  hooks.refreshAudit = refreshAudit;

  function bindTransactions() {
    for (const b of $all("[data-testid=tx-decide-button]")) {
      b.addEventListener("click", () => {
        const id = $("#tx-decide-id");
        id.value = b.dataset.txId;
        $("#tx-decide-form").scrollIntoView({ behavior: "smooth", block: "center" });
        ($("#tx-decide-operator").value ? $("#tx-decide-reason") : $("#tx-decide-operator")).focus();
      });
    }
    for (const b of $all("[data-testid=tx-resume-button]")) {
      b.addEventListener("click", async () => {
        const row = b.closest("tr");
        const status = $("[data-testid=tx-resume-status]", row);
        b.disabled = true;
        setStatus(status, "busy", "resuming…");
        try {
          const data = await api("POST", "/api/transactions/" + encodeURIComponent(b.dataset.txId) + "/resume");
          setStatus(status, "ok", "resumed (half offset " + data.half_offset + ")");
          $("#tx-decide-id").value = b.dataset.txId;
          setStatus($("#tx-decide-status"), "ok",
            "Transaction " + b.dataset.txId + " resumed; commit or roll it back below.");
        } catch (e) {
          setStatus(status, "error", e.message);
          b.disabled = false;
        }
      });
    }
    const op = $("#tx-decide-operator");
    if (op) {
      try { op.value = op.value || localStorage.getItem("txmq.operator") || ""; } catch (e) { /* */ }
      op.addEventListener("change", () => {
        try { localStorage.setItem("txmq.operator", op.value); } catch (e) { /* */ }
      });
    }
  }

  // -- dead letters ---------------------------------------------------------------------------
  function renderResendResults(results) {
    const table = $("#dlq-resend-results");
    const body = $("tbody", table);
    body.replaceChildren();
    for (const r of results) {
      body.append(el("tr", { "data-testid": "dlq-result-row", "data-msg-id": r.msg_id, "data-ok": String(!!r.ok) },
        el("td", { class: "mono nowrap", text: r.msg_id }),
        el("td", {}, el("span", { class: "badge " + (r.ok ? "ok" : "bad"), text: r.ok ? "resent" : "failed" })),
        el("td", { class: "mono nowrap", text: r.new_msg_id || "" }),
        el("td", { text: r.error || "" })));
    }
    table.hidden = false;
  }

  async function resend(group, msgIds) {
    const status = $("#dlq-resend-status");
    setStatus(status, "busy", "resending…");
    $all("#dlq-actions button").forEach((b) => { b.disabled = true; });
    try {
      const data = await api("POST", "/api/dlq/" + encodeURIComponent(group) + "/resend", { msg_ids: msgIds });
      const results = data.results || [];
      renderResendResults(results);
      const ok = results.filter((r) => r.ok).length;
      setStatus(status, ok === results.length ? "ok" : "error",
        ok + " of " + results.length + " message(s) resent");
    } catch (e) {
      setStatus(status, "error", e.message);
    } finally {
      $all("#dlq-actions button").forEach((b) => { b.disabled = false; });
    }
  }

  function renderMessageDetail(cell, m) {
    cell.replaceChildren();
    const props = m.properties || {};
    const kv = el("table", { class: "data kv" });
    const tb = el("tbody");
    for (const k of Object.keys(props).sort()) {
      tb.append(el("tr", {}, el("th", { class: "mono", text: k }), el("td", { class: "mono wrap", text: props[k] })));
    }
    kv.append(tb);
    const enc = m.body_encoding ? " (" + m.body_encoding + ")" : "";
    cell.append(el("h2", { text: "Properties" }), kv, el("h2", { text: "Body" + enc }),
      el("pre", { class: "body", "data-testid": "dlq-detail-body", text: m.body === undefined ? "" : m.body }));
  }

  function bindDlq() {
    const root = $("#dlq-page");
    if (!root) return;
    const group = root.dataset.group;
    const all = $("#dlq-select-all");
    if (all) {
      all.addEventListener("change", () => {
        $all("[data-testid=dlq-select]").forEach((c) => { c.checked = all.checked; });
      });
    }
    $("#dlq-resend-selected").addEventListener("click", () => {
      const ids = $all("[data-testid=dlq-select]").filter((c) => c.checked).map((c) => c.value);
      if (!ids.length) {
        setStatus($("#dlq-resend-status"), "error", "select at least one message");
        return;
      }
      resend(group, ids);
    });
    $("#dlq-resend-all").addEventListener("click", () => {
      if (window.confirm("Resend every message in %DLQ%" + group + "?")) resend(group, []);
    });
    for (const b of $all("[data-testid=dlq-show-button]")) {
      b.addEventListener("click", async () => {
        const row = b.closest("tr");
        let detail = row.nextElementSibling;
        if (detail && detail.classList.contains("detail")) { detail.remove(); return; }
        const cell = el("td", { colspan: row.children.length, "data-testid": "dlq-detail" }, "loading…");
        detail = el("tr", { class: "detail" }, cell);
        row.after(detail);
        try {
          const m = await api("GET", "/api/dlq/" + encodeURIComponent(group) + "/" + encodeURIComponent(b.dataset.msgId));
          renderMessageDetail(cell, m);
        } catch (e) {
          cell.replaceChildren(el("div", { class: "status", "data-state": "error", text: e.message }));
        }
      });
    }
  }

  // -- message search -------------------------------------------------------------------------
  function renderSearch(items) {
    const table = $("#msg-results-table");
    const body = $("tbody", table);
    body.replaceChildren();
    for (const m of items) {
      const link = el("a", { href: "/messages/" + encodeURIComponent(m.msg_id), "data-testid": "msg-link",
        text: m.msg_id });
      body.append(el("tr", { "data-testid": "msg-result-row", "data-msg-id": m.msg_id },
        el("td", { class: "mono nowrap" }, link), el("td", { text: m.topic }),
        el("td", { class: "clip", title: m.keys || "", text: m.keys || "" }), el("td", { text: m.tags || "" }),
        el("td", { class: "nowrap", text: fmtTime(m.stored_ms) }),
        el("td", { class: "clip", title: m.body_preview || "", text: m.body_preview || "" })));
    }
    table.hidden = false;
    $("#msg-results-empty").hidden = items.length > 0;
  }

  function bindSearch() {
    const form = $("#msg-search-form");
    if (!form) return;
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const status = $("#msg-search-status");
      const q = new URLSearchParams();
      try {
        const id = $("#msg-search-id").value.trim();
        if (id) {
          q.set("msg_id", id);
        } else {
          const topic = $("#msg-search-topic").value.trim();
          const key = $("#msg-search-key").value.trim();
          if (!topic || !key) throw new Error("give a topic and a key, or a message id");
          q.set("topic", topic);
          q.set("key", key);
          const begin = parseTimeMs($("#msg-search-begin").value);
          const end = parseTimeMs($("#msg-search-end").value);
          if (begin !== null) q.set("begin_ms", String(begin));
          if (end !== null) q.set("end_ms", String(end));
        }
      } catch (e) {
        setStatus(status, "error", e.message);
        return;
      }
      setStatus(status, "busy", "searching…");
      try {
        const data = await api("GET", "/api/messages?" + q.toString());
        const items = data.items || [];
        renderSearch(items);
        setStatus(status, "ok", items.length + " message(s) found");
        history.replaceState(null, "", "/messages?" + q.toString());
      } catch (e) {
        setStatus(status, "error", e.message);
      }
    });
  }

  // -- charts ---------------------------------------------------------------------------------
  // plotly.min.js (4.8 MB) is fetched once the page has loaded (a script inserted earlier would
  // hold the load event): tables and numbers render and poll at once, the chart is drawn when
  // plotly has arrived.
  let plotlyPromise = null;
  const pageLoaded = () => new Promise((resolve) => {
    if (document.readyState === "complete") resolve();
    else window.addEventListener("load", () => resolve(), { once: true });
  });
  function loadPlotly() {
    if (window.Plotly) return Promise.resolve(window.Plotly);
    if (!plotlyPromise) {
      plotlyPromise = pageLoaded().then(() => new Promise((resolve, reject) => {
        const script = el("script", { src: "/static/plotly.min.js" });
        script.onload = () => resolve(window.Plotly);
        script.onerror = () => reject(new Error("could not load /static/plotly.min.js"));
        document.head.append(script);
      }));
    }
    return plotlyPromise;
  }

  const chartLayout = (extra) => Object.assign({
    margin: { l: 56, r: 56, t: 12, b: 40 },
    paper_bgcolor: "#ffffff", plot_bgcolor: "#ffffff",
    font: { family: "system-ui, sans-serif", size: 12, color: "#1d2433" },
    legend: { orientation: "h", y: -0.18 },
    xaxis: { type: "date", gridcolor: "#eef1f6" },
    yaxis: { gridcolor: "#eef1f6", rangemode: "tozero" },
  }, extra || {});

  const CHART_CONFIG = { displayModeBar: false, responsive: true };

  /** A y axis of counts: whole-number ticks (one per unit while the range is small). */
  function countAxis(title, values, extra) {
    const top = Math.max(0, ...values.filter((v) => Number.isFinite(v)));
    return Object.assign({ title: { text: title }, gridcolor: "#eef1f6", rangemode: "tozero",
      tickformat: ",d", dtick: top <= 8 ? 1 : undefined }, extra || {});
  }

  /** Plotly draws Date objects in the browser's zone; the console shows UTC everywhere, so it
   *  gets UTC wall-clock strings. */
  function utc(t) { return new Date(t).toISOString().replace("Z", ""); }
  function toDates(ts) { return (ts || []).map(utc); }

  function chartError(div, e) {
    div.replaceChildren(el("div", { class: "status", "data-state": "error", text: e.message }));
  }

  function overviewTraces(h) {
    return [
      { name: "in / s", x: toDates(h.t_ms), y: h.in_per_s || [], mode: "lines", line: { color: "#2563eb", width: 2 } },
      { name: "out / s", x: toDates(h.t_ms), y: h.out_per_s || [], mode: "lines", line: { color: "#15803d", width: 2 } },
      { name: "half-message backlog", x: toDates(h.t_ms), y: h.half_backlog || [], mode: "lines", yaxis: "y2",
        line: { color: "#a16207", width: 2, dash: "dot" } },
    ];
  }

  function drawOverview(div, data) {
    const h = data.history || {};
    const layout = chartLayout({
      yaxis: { title: { text: "messages / s" }, gridcolor: "#eef1f6", rangemode: "tozero" },
      yaxis2: countAxis("half messages", h.half_backlog || [], { overlaying: "y", side: "right", showgrid: false }),
    });
    Plotly.react(div, overviewTraces(h), layout, CHART_CONFIG);
    div.dataset.points = String((h.t_ms || []).length);
  }

  function startOverview() {
    const div = $("#overview-chart");
    if (!div) return;
    let latest = JSON.parse($("#overview-data").textContent);
    let ready = false;
    const update = (data) => {
      latest = data;
      const set = (id, v, d) => { const n = $(id); if (n) n.textContent = fmtNum(v, d); };
      set("#kpi-in", data.in_per_s, 1);
      set("#kpi-out", data.out_per_s, 1);
      set("#kpi-half", data.half_backlog, 0);
      set("#kpi-parked", data.parked, 0);
      set("#kpi-discarded", data.discarded, 0);
      if (ready) drawOverview(div, data);
    };
    poll("/api/overview", update, $("#overview-status"));
    loadPlotly().then(() => { ready = true; drawOverview(div, latest); }, (e) => chartError(div, e));
  }

  function renderGroupQueues(queues) {
    const body = $("#group-queues-table tbody");
    if (!body) return;
    body.replaceChildren();
    for (const q of queues) {
      body.append(el("tr", { "data-testid": "group-queue-row", "data-topic": q.topic, "data-queue-id": q.queue_id },
        el("td", { text: q.topic }), el("td", { class: "num", text: q.queue_id }),
        el("td", { class: "num", text: fmtNum(q.broker_offset, 0) }),
        el("td", { class: "num", text: fmtNum(q.consumer_offset, 0) }),
        el("td", { class: "num", "data-testid": "group-queue-lag", text: fmtNum(q.lag, 0) })));
    }
  }

  /** The group's lag series: History samples (server time), or the polled lag (browser time) while
   *  the History has none for the group. Only ever extended. */
  function lagSeries(initial) {
    const series = { x: [], y: [], lastT: -Infinity };
    series.add = (data) => {
      const h = data.lag_history || { t_ms: [], lag: [] };
      const nx = [], ny = [];
      (h.t_ms || []).forEach((t, i) => {
        if (t > series.lastT) { nx.push(utc(t)); ny.push(h.lag[i]); series.lastT = t; }
      });
      if (!(h.t_ms || []).length) { series.lastT = Date.now(); nx.push(utc(series.lastT)); ny.push(data.lag); }
      series.x.push(...nx);
      series.y.push(...ny);
      const extra = series.x.length - CHART_POINTS_MAX;
      if (extra > 0) { series.x.splice(0, extra); series.y.splice(0, extra); }
      return { x: nx, y: ny };
    };
    series.add(initial);
    return series;
  }

  function startGroupChart() {
    const div = $("#group-lag-chart");
    if (!div) return;
    const series = lagSeries(JSON.parse($("#group-data").textContent));
    let drawn = false;
    const layout = () => chartLayout({ showlegend: false, yaxis: countAxis("messages behind", series.y) });
    const mark = () => {
      div.dataset.points = String(div.data[0].x.length);
      div.dataset.lastLag = String(div.data[0].y[div.data[0].y.length - 1]);
    };
    poll("/api/groups/" + encodeURIComponent(div.dataset.group), (data) => {
      const added = series.add(data);
      if (drawn && added.x.length) {
        Plotly.extendTraces(div, { x: [added.x], y: [added.y] }, [0], CHART_POINTS_MAX);
        Plotly.relayout(div, { yaxis: layout().yaxis });
        mark();
      }
      const total = $("#group-lag-total");
      if (total) { total.textContent = fmtNum(data.lag, 0); total.dataset.lag = String(data.lag); }
      renderGroupQueues(data.queues || []);
    }, $("#group-poll-status"));
    loadPlotly().then(() => {
      Plotly.newPlot(div, [{ name: "lag", x: series.x.slice(), y: series.y.slice(), mode: "lines+markers",
        fill: "tozeroy", line: { color: "#2563eb", width: 2 }, marker: { size: 4 } }], layout(), CHART_CONFIG);
      drawn = true;
      mark();
    }, (e) => chartError(div, e));
  }

  function poll(url, onData, statusNode) {
    let busy = false;
    setInterval(async () => {
      if (busy || document.hidden) return;
      busy = true;
      try {
        onData(await api("GET", url));
        if (statusNode) setStatus(statusNode, "ok", "");
      } catch (e) {
        if (statusNode) setStatus(statusNode, "error", "refresh failed: " + e.message);
      } finally {
        busy = false;
      }
    }, POLL_MS);
  }

  function init() {
    showFlash();
    bindForms();
    bindTransactions();
    bindDlq();
    bindSearch();
    startOverview();
    startGroupChart();
  }

  return { api, init, parseTimeMs, fmtTime, hooks };
})();

document.addEventListener("DOMContentLoaded", txmq.init);
