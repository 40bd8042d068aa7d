// The imqbridge browser console: a hash-routed page over /api/v1 (docs/console.md).
// Everything shown is set with textContent (never HTML from data); changes send the
// session's CSRF token. It refreshes the current view every REFRESH_MS.
"use strict";

const API = "/api/v1";
const REFRESH_MS = 2000;
const SPARK = 60; // samples in an overview sparkline: two minutes (the link page's hour is the service's)
const PAGE = 20; // messages a browsed page shows

let me = null; // {user, group, mayAct, csrfToken}
let timer = null;
const history = new Map(); // "bridge/link" -> [{t, rate}]: the overview's sparklines

function $(id) { return document.getElementById(id); }

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "text") node.textContent = String(v);
    else if (k === "onclick") node.addEventListener("click", v);
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children) if (c !== null && c !== undefined) node.append(c instanceof Node ? c : String(c));
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  return node;
}

class Problem extends Error {}

async function api(method, path, body) {
  const headers = {};
  if (method !== "GET") {
    headers["Content-Type"] = "application/json";
    if (me && me.csrfToken) headers["X-CSRF-Token"] = me.csrfToken;
  }
  const response = await fetch(API + path, {
    method, headers, credentials: "same-origin",
    body: body === undefined ? (method === "GET" ? undefined : "{}") : JSON.stringify(body),
  });
  const answer = await response.json();
  if (response.status === 401 && path !== "/session") {
    showLogin("Your session has ended: log in again.");
    throw new Problem(answer.message);
  }
  if (!response.ok) throw new Problem(answer.message);
  return answer.data;
}

function enc(name) { return encodeURIComponent(name); }

function showProblem(text) {
  const p = $("problem");
  p.textContent = text || "";
  p.hidden = !text;
}

// --- login -------------------------------------------------------------------------------
function showLogin(message) {
  me = null;
  if (timer) clearInterval(timer);
  timer = null;
  $("top").hidden = true;
  $("view").replaceChildren();
  showProblem("");
  $("login").hidden = false;
  $("login-error").textContent = message || "";
  $("login-user").focus();
}

async function logIn(event) {
  event.preventDefault();
  const user = $("login-user").value;
  const password = $("login-password").value;
  $("login-password").value = "";
  try {
    const response = await fetch(API + "/session", {
      method: "POST", headers: {"Content-Type": "application/json"}, credentials: "same-origin",
      body: JSON.stringify({user, password}),
    });
    const answer = await response.json();
    if (!response.ok) { $("login-error").textContent = answer.message; return; }
    started(answer.data);
  } catch (e) {
    $("login-error").textContent = "The service does not answer: " + e.message;
  }
}

async function logOut() {
  try { await api("DELETE", "/session"); } catch (e) { /* logged out either way */ }
  showLogin("Logged out.");
}

function started(who) {
  me = who;
  $("login").hidden = true;
  $("top").hidden = false;
  $("who").textContent = `${who.user} (${who.mayAct ? "may act" : "read only"})`;
  route();
  if (!timer) timer = setInterval(refresh, REFRESH_MS);
}

// --- routing -----------------------------------------------------------------------------
let current = null; // {name, args, data: a function that refreshes the view's data}

function route() {
  const parts = location.hash.replace(/^#\/?/, "").split("/").filter(Boolean).map(decodeURIComponent);
  const name = parts[0] || "overview";
  const views = {overview, link, destinations, dmq, cluster};
  const view = views[name] || overview;
  for (const a of document.querySelectorAll("header nav a")) a.classList.toggle("current", a.id === "nav-" + name);
  showProblem("");
  const root = $("view");
  root.replaceChildren();
  current = {name, refresh: view(root, parts.slice(1))};
  refresh();
}

let busy = null; // the view whose refresh is under way: a slow answer is not asked again

async function refresh() {
  if (!me || !current || busy === current) return;
  const mine = busy = current;
  try {
    await mine.refresh();
    if (mine === current) showProblem("");
  } catch (e) {
    if (mine === current && me) showProblem(e instanceof Problem ? e.message : "The service does not answer: " + e.message);
  } finally {
    if (busy === mine) busy = null;
  }
}

// --- samples -----------------------------------------------------------------------------
function sample(bridge, l) {
  const key = bridge + "/" + l.name;
  const list = history.get(key) || [];
  list.push({t: Date.now(), rate: (l.counters || {}).rate || 0});
  while (list.length > SPARK) list.shift();
  history.set(key, list);
  return list;
}

function chart(values, cls, width, height) {
  const node = svg("svg", {class: cls, viewBox: `0 0 ${width} ${height}`, preserveAspectRatio: "none"});
  const shown = values.filter((v) => v !== null);
  const top = Math.max(1, ...shown);
  if (values.length === 1) values = [values[0], values[0]]; // one interval: a flat line across
  const step = values.length > 1 ? width / (values.length - 1) : width;
  const points = values.map((v, i) => `${(i * step).toFixed(1)},${(height - ((v || 0) / top) * (height - 2) - 1).toFixed(1)}`);
  node.append(svg("polyline", {points: points.join(" ")}));
  return node;
}

function caption(values, unit, step) {
  const shown = values.filter((v) => v !== null);
  const last = shown.length ? shown[shown.length - 1] : 0;
  const seconds = Math.round(values.length * step);
  const since = seconds < 120 ? `${seconds} s` : `${Math.round(seconds / 60)} min`;
  return el("p", {class: "muted",
    text: `now ${last.toFixed(1)} ${unit}, top ${Math.max(0, ...shown).toFixed(1)} ${unit}, over ${since}`});
}

function health(l) {
  const error = l.counters && l.counters.current_error;
  if (l.state === "STARTED" && !error) return "ok";
  if (l.state === "PAUSED" && !error) return "paused";
  return "bad";
}

function rate(value) { return (value || 0).toFixed(1); }

// --- views: each builds its frame and returns the function that fills in the data -------
function overview(root) {
  root.append(el("h1", {text: "Bridges and links"}));
  const body = el("tbody", {id: "links"});
  root.append(el("table", {},
    el("thead", {}, el("tr", {}, ...["bridge", "type", "link", "state", "msg/s", "last 2 min", "backlog", "to DMQ", "error"]
      .map((h) => el("th", {text: h})))), body));
  return async () => {
    const {bridges} = await api("GET", "/bridges?links=true"); // one request for every bridge's links
    const rows = [];
    bridges.forEach((b) => {
      const links = b.links || [];
      if (!links.length) {
        rows.push(el("tr", {class: b.state === "STARTED" ? "ok" : "bad", "data-bridge": b.name},
          el("td", {text: b.name}), el("td", {text: b.type}), el("td", {class: "muted", text: "-"}),
          el("td", {class: "state", text: b.state}), el("td"), el("td"), el("td"), el("td"), el("td")));
      }
      for (const l of links) {
        const samples = sample(b.name, l);
        const c = l.counters || {};
        rows.push(el("tr", {class: health(l), "data-link": `${b.name}/${l.name}`},
          el("td", {text: b.name}), el("td", {text: b.type}),
          el("td", {}, el("a", {href: `#/link/${enc(b.name)}/${enc(l.name)}`, text: l.name})),
          el("td", {class: "state", text: l.state}),
          el("td", {class: "num rate", text: rate(c.rate)}),
          el("td", {}, chart(samples.map((s) => s.rate), "spark", 120, 24)),
          el("td", {class: "num", text: l.backlog ?? "-"}),
          el("td", {class: "num", text: c.to_dmq ?? 0}),
          el("td", {class: "error", text: c.current_error || ""})));
      }
    });
    body.replaceChildren(...rows);
  };
}

function link(root, [bridge, name]) {
  const path = `/bridges/${enc(bridge)}/links/${enc(name)}`;
  root.append(el("h1", {text: `Link ${name} of bridge ${bridge}`}));
  const actions = el("p", {class: "actions"});
  if (me.mayAct) {
    for (const action of ["pause", "resume", "stop", "start"]) {
      actions.append(el("button", {type: "button", id: "action-" + action, text: action, onclick: async () => {
        try { await api("POST", `${path}/${action}`); await refresh(); } catch (e) { showProblem(e.message); }
      }}));
    }
  }
  const facts = el("dl", {id: "link-facts"});
  const rateChart = el("div", {id: "rate-chart"});
  const latencyChart = el("div", {id: "latency-chart"});
  const errors = el("dl", {id: "link-errors"});
  root.append(actions, facts, el("h2", {text: "msg/s, the last hour"}), rateChart,
    el("h2", {text: "mean latency, ms, the last hour"}), latencyChart, el("h2", {text: "Errors"}), errors);
  return async () => {
    const [data, hour] = await Promise.all([api("GET", path), api("GET", path + "/history")]);
    const l = data.links[0];
    const c = l.counters || {};
    const row = (k, v, cls) => [el("dt", {text: k}), el("dd", {class: cls, text: v ?? "-"})];
    facts.replaceChildren(
      ...row("state", l.state, "state " + health(l)), ...row("source", l.source), ...row("target", l.target),
      ...row("transaction", l.transaction), ...row("msg/s", rate(c.rate), "rate"), ...row("backlog", l.backlog),
      ...row("received", c.received), ...row("transferred", c.transferred), ...row("to DMQ", c.to_dmq),
      ...row("redelivered", c.redelivered), ...row("reconnects", c.reconnects));
    const rates = hour.intervals.map((i) => i.rate);
    rateChart.replaceChildren(chart(rates, "chart", 640, 120), caption(rates, "msg/s", hour.step));
    const lat = hour.intervals.map((i) => i.latency_ms);
    const lc = chart(lat, "chart", 640, 120);
    lc.firstChild.setAttribute("class", "latency");
    latencyChart.replaceChildren(lc, caption(lat, "ms", hour.step));
    errors.replaceChildren(...row("now", c.current_error || "none", c.current_error ? "error" : null),
      ...row("last", c.last_error || "none"),
      ...row("at", c.last_error_at ? new Date(c.last_error_at * 1000).toISOString() : null),
      ...Object.entries(c.dmq_reasons || {}).flatMap(([k, v]) => row("DMQ " + k, v)));
  };
}

function destinations(root, [type, name]) {
  root.append(el("h1", {text: "Destinations"}));
  const body = el("tbody");
  root.append(el("table", {id: "destinations"}, el("thead", {}, el("tr", {},
    ...["type", "name", "state", "depth", "unacked", "bytes", "producers", "consumers"].map((h) => el("th", {text: h})))), body));
  const browse = el("div", {id: "browse"});
  root.append(browse);
  if (type === "q" && name) {
    if (!me.mayAct) browse.append(el("p", {class: "muted", text: "Browsing messages needs a user who may act."}));
    else showMessages(browse, `/destinations/q/${enc(name)}/messages?count=${PAGE}`, `Messages of queue ${name}`, null);
  }
  return async () => {
    const data = await api("GET", "/destinations");
    body.replaceChildren(...data.destinations.map((d) => el("tr", {"data-destination": `${d.type}/${d.name}`},
      el("td", {text: d.type === "q" ? "queue" : "topic"}),
      el("td", {}, d.type === "q" ? el("a", {href: `#/destinations/q/${enc(d.name)}`, text: d.name}) : d.name),
      el("td", {text: d.state}), el("td", {class: "num", text: d.pending}), el("td", {class: "num", text: d.unacked}),
      el("td", {class: "num", text: d.bytes}), el("td", {class: "num", text: d.producers}),
      el("td", {class: "num", text: d.consumers}))));
  };
}

function messageView(m) {
  const headers = ["message_id", "timestamp", "priority", "persistent", "redelivered", "delivery_count",
    "expiration", "correlation_id", "type", "reply_to", "body_type", "body_size"];
  const dl = el("dl");
  for (const h of headers) dl.append(el("dt", {text: h}), el("dd", {text: m[h] ?? "-"}));
  for (const [k, v] of Object.entries(m.properties || {})) dl.append(el("dt", {text: k}), el("dd", {text: v}));
  return el("div", {class: "message"}, dl, el("pre", {class: "preview", text: m.preview ?? ""}));
}

// A page of a queue's messages; "next page" asks for those after its last (data.next).
async function showMessages(target, path, title, after) {
  try {
    const data = await api("GET", path + (after ? `&after=${enc(after)}` : ""));
    const pages = el("p", {class: "actions"});
    if (after) {
      pages.append(el("button", {type: "button", id: "browse-first", text: "first page",
        onclick: () => showMessages(target, path, title, null)}));
    }
    if (data.next) {
      pages.append(el("button", {type: "button", id: "browse-next", text: "next page",
        onclick: () => showMessages(target, path, title, data.next)}));
    }
    target.replaceChildren(el("h2", {text: title}),
      el("p", {class: "muted", id: "browse-where", text: after ? `after ${after}` : "from the first"}));
    if (!data.messages.length) target.append(el("p", {class: "muted", text: "No waiting message."}));
    for (const m of data.messages) target.append(messageView(m));
    target.append(pages);
  } catch (e) {
    if (after) target.replaceChildren(el("h2", {text: title}));
    showProblem(e.message);
  }
}

function dmq(root) {
  root.append(el("h1", {text: "Dead message queues"}));
  const box = el("div", {id: "dmqs"});
  root.append(box);
  if (!me.mayAct) {
    box.append(el("p", {class: "muted", text: "Reading DMQ entries needs a user who may act."}));
    return async () => {};
  }
  let loaded = false;
  let outcome = "";
  // redrive or archive the picked entries (or all) of one DMQ, then show the list again
  const move = async (bridge, q, action, all) => {
    const picked = [...box.querySelectorAll(`input.dmq-pick[data-dmq="${CSS.escape(bridge + "/" + q.name)}"]`)]
      .filter((i) => i.checked).map((i) => i.dataset.id);
    if (!all && !picked.length) { showProblem("Pick the entries first (the boxes on the left)."); return; }
    try {
      const done = await api("POST", `/dmq/${enc(bridge)}/${action}`,
        all ? {all: true, dmq: q.name} : {message_ids: picked, dmq: q.name});
      const kept = done.entries.filter((e) => !["redriven", "archived"].includes(e.status));
      outcome = `${action}: ${done.moved} of ${done.chosen} moved` +
        kept.map((e) => `; ${e.message_id} ${e.status}${e.detail ? ": " + e.detail : ""}`).join("");
    } catch (e) { outcome = ""; showProblem(e.message); }
    loaded = false;
    await refresh();
  };
  return async () => {
    if (loaded) return; // a list to read at leisure: loaded once per visit (and after an action)
    const {bridges} = await api("GET", "/bridges?type=JMS");
    const all = await Promise.all(bridges.map((b) => api("GET", `/dmq/${enc(b.name)}?count=50`)));
    loaded = true;
    const parts = [el("p", {id: "dmq-outcome", text: outcome, hidden: !outcome})];
    for (const data of all) {
      for (const q of data.dmqs) {
        parts.push(el("h2", {text: `bridge ${data.bridge}: ${q.name}` + (q.destination ? ` (queue ${q.destination})` : "")}));
        if (q.entries === null) { parts.push(el("p", {class: "muted", text: "on another broker: not shown"})); continue; }
        const reasons = new Map();
        for (const e of q.entries) reasons.set(e.reason, (reasons.get(e.reason) || 0) + 1);
        parts.push(el("p", {text: q.entries.length ? [...reasons].map(([r, n]) => `${r}: ${n}`).join(", ") : "empty"}));
        if (q.entries.length) {
          const button = (action, all, label) => el("button", {type: "button", class: "dmq-action",
            "data-action": action, "data-all": all ? "yes" : "no", text: label, onclick: () => move(data.bridge, q, action, all)});
          parts.push(el("p", {class: "actions"}, button("redrive", false, "redrive picked"),
            button("redrive", true, "redrive all"), button("archive", false, "archive picked"),
            button("archive", true, "archive all")));
        }
        q.entries.forEach((e, i) => {
          const dl = el("dl", {class: "dmq-properties"});
          for (const [k, v] of Object.entries(e.bridgeProperties)) dl.append(el("dt", {text: k}), el("dd", {text: v}));
          parts.push(el("div", {class: "dmq-row"},
            el("input", {type: "checkbox", class: "dmq-pick", "data-dmq": `${data.bridge}/${q.name}`,
              "data-id": e.message.message_id, "aria-label": "pick " + e.message.message_id}),
            el("details", {class: "dmq-entry", "data-reason": e.reason, "data-id": e.message.message_id},
              el("summary", {text: `#${i + 1} ${e.reason}: ${(e.original || e.message).preview ?? ""}`.slice(0, 200)}),
              dl, el("h3", {text: "the message that failed"}), e.original ? messageView(e.original) : el("p",
                {class: "muted", text: "only its text is kept (JMS_SUN_JMSBRIDGE_DMQ_BODY_TRUNCATED)"}),
              el("h3", {text: "the DMQ message"}), messageView(e.message))));
        });
      }
    }
    box.replaceChildren(...parts);
  };
}

function cluster(root) {
  root.append(el("h1", {text: "HA cluster"}));
  const box = el("div", {id: "cluster"});
  root.append(box);
  return async () => {
    const {properties} = await api("GET", "/properties");
    if (properties["imq.cluster.ha"] !== "true") {
      box.replaceChildren(el("p", {class: "muted", text: "This service is in no HA cluster (imq.cluster.ha is false)."}));
      return;
    }
    const data = await api("GET", "/cluster");
    const table = (heads, rows) => el("table", {}, el("thead", {}, el("tr", {}, ...heads.map((h) => el("th", {text: h})))),
      el("tbody", {}, ...rows.map((r) => el("tr", {}, ...r.map((v) => el("td", {text: v ?? "-"}))))));
    box.replaceChildren(el("p", {text: `cluster ${data.clusterid}, this instance ${data.instance}`}),
      table(["instance", "state", "address", "lease until", "lease current", "taken by"],
        data.instances.map((i) => [i.brokerid, i.state, i.address, i.leaseExpires, i.leaseCurrent ? "yes" : "no", i.takenBy])),
      table(["bridge", "owner", "since"], data.bridges.map((b) => [b.name, b.owner, b.since])));
  };
}

// --- start -------------------------------------------------------------------------------
document.addEventListener("DOMContentLoaded", async () => {
  $("login").addEventListener("submit", logIn);
  $("logout").addEventListener("click", logOut);
  window.addEventListener("hashchange", () => { if (me) route(); });
  if (document.body.dataset.session !== "yes") { showLogin(""); return; }
  try { started(await api("GET", "/session")); } catch (e) { showLogin(""); }
});
