// Threadline's console: the few things a server-rendered page cannot do by itself. Every call goes to the
// HTTP API, with the key from the sign-in form (session storage) as `x-api-key`.
"use strict";
(function () {
  const body = document.body;
  const API = body.dataset.api || "";
  const UI = body.dataset.ui || "/console";
  const KEY = "threadline.apiKey";

  function headers(extra) {
    const h = Object.assign({"content-type": "application/json"}, extra || {});
    const key = sessionStorage.getItem(KEY);
    if (key) h["x-api-key"] = key;
    return h;
  }

  async function api(method, path, payload) {
    const res = await fetch(API + path, {method, headers: headers(),
      body: payload === undefined ? undefined : JSON.stringify(payload)});
    const text = await res.text();
    let data = null;
    try { data = text ? JSON.parse(text) : null; } catch (e) { data = text; }
    if (!res.ok) {
      const detail = data && data.detail !== undefined ? data.detail : text;
      throw new Error(res.status + ": " + (typeof detail === "string" ? detail : JSON.stringify(detail)));
    }
    return data;
  }

  function parseJSON(text, what) {
    try { return JSON.parse(text); } catch (e) { throw new Error(what + " is not valid JSON: " + e.message); }
  }

  function showErrors(box, messages) {
    box.replaceChildren(...messages.map((m) => { const p = document.createElement("p"); p.textContent = m; return p; }));
    if (messages.length) box.closest("form")?.querySelector("textarea")?.setAttribute("aria-invalid", "true");
  }

  // --- Sign in: a seam for when the API requires a key. A page the API refused (401/403) is fetched again
  // with the stored key and replaces this one.
  if (body.hasAttribute("data-unauthorized") && sessionStorage.getItem(KEY) && !sessionStorage.getItem(KEY + ".retried")) {
    sessionStorage.setItem(KEY + ".retried", "1");
    fetch(location.href, {headers: headers()}).then((r) => r.text()).then((html) => {
      document.open(); document.write(html); document.close();
    }).finally(() => sessionStorage.removeItem(KEY + ".retried"));
  }
  const login = document.getElementById("login-form");
  if (login) {
    const status = document.getElementById("login-status");
    login.addEventListener("submit", (ev) => {
      ev.preventDefault();
      sessionStorage.setItem(KEY, login.elements.key.value);
      status.textContent = "Signed in for this tab.";
    });
    document.getElementById("sign-out").addEventListener("click", () => {
      sessionStorage.removeItem(KEY); status.textContent = "Signed out.";
    });
  }
  const loginLink = document.getElementById("login-link");
  if (loginLink && sessionStorage.getItem(KEY)) loginLink.textContent = "Signed in";

  // --- Input checked against the assistant's input schema (its top-level properties: what a graph's
  // input is made of). A key the schema does not know, or a value of the wrong JSON type, is refused here.
  const schemas = {};
  async function inputSchema(assistantId) {
    if (!(assistantId in schemas)) schemas[assistantId] = (await api("GET", `/assistants/${assistantId}/schemas`)).input_schema || {};
    return schemas[assistantId];
  }
  function jsonType(v) {
    if (v === null) return "null";
    if (Array.isArray(v)) return "array";
    if (typeof v === "number") return Number.isInteger(v) ? "integer" : "number";
    return typeof v;
  }
  function resolve(schema, root) {
    if (schema && schema.$ref) {
      const name = schema.$ref.split("/").pop();
      return ((root.$defs || root.definitions || {})[name]) || {};
    }
    return schema || {};
  }
  function types(schema, root) {
    schema = resolve(schema, root);
    if (schema.type) return [].concat(schema.type);
    const alts = schema.anyOf || schema.oneOf;
    if (alts) { const out = []; for (const a of alts) { const t = types(a, root); if (!t) return null; out.push(...t); } return out; }
    return null;  // anything
  }
  function checkInput(value, schema) {
    if (jsonType(value) !== "object") return ["The input must be a JSON object."];
    const props = schema.properties || {};
    const errors = [];
    if (Object.keys(props).length) {
      for (const [k, v] of Object.entries(value)) {
        if (!(k in props)) { errors.push(`"${k}" is not in the input schema (${Object.keys(props).join(", ")}).`); continue; }
        const allowed = types(props[k], schema);
        const t = jsonType(v);
        if (allowed && !allowed.includes(t) && !(t === "integer" && allowed.includes("number")))
          errors.push(`"${k}" must be ${allowed.join(" or ")}, not ${t}.`);
      }
    }
    for (const k of schema.required || []) if (!(k in value)) errors.push(`"${k}" is required.`);
    return errors;
  }

  function runPage(run) {
    return run.thread_id && !run.__stateless ? `${UI}/threads/${run.thread_id}/runs/${run.run_id}` : `${UI}/runs/${run.run_id}`;
  }
  const STREAM_MODES = ["messages-tuple", "updates", "custom"];

  document.querySelectorAll("[data-run-form]").forEach((form) => {
    const box = form.querySelector(".errors");
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const assistantId = form.elements.assistant_id.value;
      try {
        const input = parseJSON(form.elements.input.value, "The input");
        const errors = checkInput(input, await inputSchema(assistantId));
        showErrors(box, errors);
        if (errors.length) return;
        const payload = {assistant_id: assistantId, input, stream_mode: STREAM_MODES};
        let thread = form.dataset.thread;
        const where = form.elements.where ? form.elements.where.value : "thread";
        if (where === "stateless") {  // kept once done, so that its page can still be read
          const run = await api("POST", "/runs", Object.assign({on_completion: "keep"}, payload));
          location.href = `${UI}/runs/${run.run_id}`;
          return;
        }
        if (!thread) thread = (await api("POST", "/threads", {})).thread_id;
        const run = await api("POST", `/threads/${thread}/runs`, payload);
        location.href = `${UI}/threads/${thread}/runs/${run.run_id}`;
      } catch (e) { showErrors(box, [e.message]); }
    });
  });

  document.querySelectorAll("[data-resume-form]").forEach((form) => {
    const box = form.querySelector(".errors");
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      try {
        const resume = parseJSON(form.elements.resume.value, "The resume value");
        const thread = form.dataset.thread;
        const run = await api("POST", `/threads/${thread}/runs`, {assistant_id: form.elements.assistant_id.value,
          command: {resume}, stream_mode: STREAM_MODES});
        location.href = `${UI}/threads/${thread}/runs/${run.run_id}`;
      } catch (e) { showErrors(box, [e.message]); }
    });
  });

  // --- An assistant's schemas, fetched once, when one is first opened.
  document.querySelectorAll("[data-schemas]").forEach((section) => {
    let loaded = null;
    section.querySelectorAll("details[data-schema]").forEach((details) => {
      details.addEventListener("toggle", async () => {
        if (!details.open) return;
        const pre = details.querySelector("pre");
        try {
          loaded = loaded || api("GET", section.dataset.schemas.slice(API.length));
          const value = (await loaded)[details.dataset.schema];
          pre.textContent = value ? JSON.stringify(value, null, 2) : "(none)";
        } catch (e) { loaded = null; pre.textContent = e.message; }
      });
    });
  });

  // --- Store: put and delete, then show the page again.
  document.querySelectorAll("[data-put-form]").forEach((form) => {
    const box = form.querySelector(".errors");
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      try {
        const value = parseJSON(form.elements.value.value, "The value");
        const namespace = form.elements.namespace.value.split("/").map((s) => s.trim()).filter(Boolean);
        await api("PUT", "/store/items", {namespace, key: form.elements.key.value, value});
        const q = new URLSearchParams(); namespace.forEach((p) => q.append("ns", p));
        location.href = `${UI}/store?${q}`;
      } catch (e) { showErrors(box, [e.message]); }
    });
  });
  document.querySelectorAll("[data-delete-item]").forEach((button) => {
    button.addEventListener("click", async () => {
      if (!confirm(`Delete ${button.dataset.key}?`)) return;
      try {
        await api("DELETE", "/store/items", {namespace: JSON.parse(button.dataset.namespace), key: button.dataset.key});
        location.reload();
      } catch (e) { alert(e.message); }
    });
  });

  // --- The live run view: the run's event stream read with fetch (EventSource cannot send a key), each
  // event kept in session storage so a reload shows them again and resumes after the last (Last-Event-ID).
  const view = document.querySelector("[data-run-view]");
  if (view) liveRun(view);

  function liveRun(view) {
    const runId = view.dataset.run;
    const store = "threadline.run." + runId;
    const saved = JSON.parse(sessionStorage.getItem(store) || '{"last": null, "events": []}');
    const list = document.getElementById("events");
    const chat = document.getElementById("live-messages");
    const state = document.getElementById("stream-state");
    const cancel = document.getElementById("cancel-run");
    const bubbles = {};

    function bubble(id, role) {
      if (!bubbles[id]) {
        const li = document.createElement("li");
        li.className = "msg msg-" + role;
        li.dataset.message = id;
        const who = document.createElement("span"); who.className = "who";
        who.textContent = {ai: "AI", human: "You", tool: "Tool"}[role] || role;
        const text = document.createElement("div"); text.className = "text";
        li.append(who, text);
        chat.append(li);
        bubbles[id] = li;
      }
      return bubbles[id];
    }
    function roleOf(m) {
      const t = (m.type || m.role || "").replace("MessageChunk", "").toLowerCase();
      return {human: "human", user: "human", ai: "ai", assistant: "ai", tool: "tool"}[t] || t || "ai";
    }
    function text(content) {
      if (typeof content === "string") return content;
      if (Array.isArray(content)) return content.map((b) => typeof b === "string" ? b : (b.text || "")).join("");
      return "";
    }
    function showMessage(m, append) {
      const li = bubble(m.id || ("m" + Object.keys(bubbles).length), roleOf(m));
      const t = li.querySelector(".text");
      const content = text(m.content);
      if (append) t.textContent += content; else if (content) t.textContent = content;
      const calls = m.tool_calls || [];
      calls.filter((c) => c.name).forEach((c) => {
        let div = li.querySelector(`[data-call="${c.id}"]`);
        if (!div) { div = document.createElement("div"); div.className = "tool-call"; div.dataset.call = c.id; li.append(div); }
        const args = JSON.stringify(c.args || {});
        div.textContent = `calls ${c.name}(${args.length > 240 ? args.slice(0, 240) + "…" : args})`;
      });
    }
    function show(ev) {
      const li = document.createElement("li");
      const name = document.createElement("strong"); name.textContent = ev.event;
      const data = document.createElement("code");
      const raw = JSON.stringify(ev.data);
      data.textContent = raw.length > 300 ? raw.slice(0, 300) + "…" : raw;
      li.append(name, " ", data);
      list.append(li);
      if (list.children.length > 500) list.firstElementChild.remove();
      list.scrollTop = list.scrollHeight;  // the newest event in view
      if (ev.event.startsWith("messages")) {
        const [chunk] = Array.isArray(ev.data) ? ev.data : [ev.data];
        if (chunk && typeof chunk === "object") showMessage(chunk, (chunk.type || "").endsWith("Chunk"));
      } else if (ev.event.startsWith("updates") && ev.data && typeof ev.data === "object") {
        for (const update of Object.values(ev.data)) {
          for (const m of (update && Array.isArray(update.messages) ? update.messages : [])) {
            if (m && typeof m === "object" && (roleOf(m) === "tool" || !bubbles[m.id])) showMessage(m, false);
          }
        }
      }
    }
    saved.events.forEach(show);

    async function refreshStatus() {
      try {
        const run = await api("GET", view.dataset.runUrl.slice(API.length));
        const badge = document.querySelector("#run-status .status");
        badge.textContent = run.status; badge.className = "status status-" + run.status;
        cancel.disabled = !["pending", "running"].includes(run.status);
        return run.status;
      } catch (e) { return null; }
    }

    cancel.addEventListener("click", async () => {
      cancel.disabled = true;
      try {
        await api("POST", view.dataset.cancel.slice(API.length));
        state.textContent = "cancel requested";
      } catch (e) { state.textContent = e.message; cancel.disabled = false; }
    });

    async function follow() {
      // "-1": every event the server still holds for the run (a join otherwise starts from now).
      const extra = {accept: "text/event-stream", "Last-Event-ID": saved.last || "-1"};
      let res;
      try { res = await fetch(view.dataset.stream, {headers: headers(extra)}); }
      catch (e) { state.textContent = "disconnected: " + e.message; return; }
      if (!res.ok) { state.textContent = "the stream answered " + res.status; await refreshStatus(); return; }
      state.textContent = "streaming";
      const reader = res.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const {value, done} = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, {stream: true}).replace(/\r\n/g, "\n");
        let cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, cut); buffer = buffer.slice(cut + 2);
          const ev = {event: "message", data: "", id: null};
          const lines = [];
          for (const line of block.split("\n")) {
            if (line.startsWith(":")) continue;
            const i = line.indexOf(":");
            const field = i < 0 ? line : line.slice(0, i);
            const val = i < 0 ? "" : line.slice(i + 1).replace(/^ /, "");
            if (field === "event") ev.event = val;
            else if (field === "data") lines.push(val);
            else if (field === "id") ev.id = val;
          }
          if (!lines.length) continue;
          try { ev.data = JSON.parse(lines.join("\n")); } catch (e) { ev.data = lines.join("\n"); }
          if (ev.event === "end") continue;
          show(ev);
          if (ev.id) saved.last = ev.id;
          saved.events.push(ev);
          if (saved.events.length > 500) saved.events.shift();
          try { sessionStorage.setItem(store, JSON.stringify(saved)); } catch (e) { /* full: keep streaming */ }
        }
      }
      const status = await refreshStatus();
      state.textContent = "stream ended" + (status ? ": " + status : "");
    }
    follow();
  }
})();
