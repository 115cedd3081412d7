// The chat: streams replies from /v1/chat/completions (or /v1/completions for a model without a
// chat template, such as the bundled one), shows the model's reasoning folded and its tool calls
// as calls, keeps conversations and settings in localStorage. Stop aborts the fetch: the server
// sees the connection close and cancels the generation.
"use strict";

const Chat = {
  convs: [],
  current: null,  // the conversation shown
  abort: null,    // the AbortController of the reply streaming now

  load() {
    try { Chat.convs = JSON.parse(localStorage.getItem("expertd.conversations") || "[]"); }
    catch (_) { Chat.convs = []; }
    const id = localStorage.getItem("expertd.current");
    Chat.current = Chat.convs.find((c) => c.id === id) || null;
    const s = JSON.parse(localStorage.getItem("expertd.settings") || "{}");
    for (const k of ["system", "temperature", "top_p", "top_k", "max_tokens", "seed"])
      if (s[k] !== undefined) document.getElementById(k).value = s[k];
  },
  save() {
    // Keep the last 50 conversations: localStorage holds a few MB per origin.
    Chat.convs = Chat.convs.slice(-50);
    localStorage.setItem("expertd.conversations", JSON.stringify(Chat.convs));
    localStorage.setItem("expertd.current", Chat.current ? Chat.current.id : "");
    const s = {};
    for (const k of ["system", "temperature", "top_p", "top_k", "max_tokens", "seed"])
      s[k] = document.getElementById(k).value;
    localStorage.setItem("expertd.settings", JSON.stringify(s));
  },
  chatMode() { return !App.info || App.info.chat_template; },

  renderList() {
    const ul = document.getElementById("conversations");
    ul.replaceChildren();
    for (const c of Chat.convs.slice().reverse()) {
      const li = document.createElement("li");
      const b = document.createElement("button");
      b.type = "button";
      b.textContent = c.title || "(empty)";
      if (c === Chat.current) b.setAttribute("aria-current", "true");
      b.addEventListener("click", () => { Chat.current = c; Chat.save(); Chat.renderAll(); });
      li.append(b);
      ul.append(li);
    }
  },
  renderMessage(m, el) {
    el = el || document.createElement("div");
    el.className = "msg " + m.role + (m.error ? " failed" : "");
    el.replaceChildren();
    const who = document.createElement("div");
    who.className = "who";
    who.textContent = m.role === "user" ? (m.mode === "completion" ? "Prompt" : "You")
                                        : (m.mode === "completion" ? "Continuation" : "Model");
    el.append(who);
    if (m.reasoning) {
      const d = document.createElement("details");
      const s = document.createElement("summary");
      s.textContent = "Reasoning";
      const p = document.createElement("div");
      p.className = "reasoning";
      p.textContent = m.reasoning;
      d.append(s, p);
      el.append(d);
    }
    const body = document.createElement("div");
    body.className = "text";
    body.textContent = m.content;
    el.append(body);
    for (const c of m.calls || []) {
      const call = document.createElement("div");
      call.className = "call";
      call.textContent = "call " + (c.name || "?") + "(" + (c.arguments || "") + ")";
      el.append(call);
    }
    if (m.error || m.stopped) {
      const e = document.createElement("div");
      e.className = "status";
      e.textContent = m.error ? "Error: " + m.error : "(stopped)";
      el.append(e);
    }
    el.dataset.done = m.done ? "1" : "0";
    return el;
  },
  renderAll() {
    Chat.renderList();
    const box = document.getElementById("messages");
    box.replaceChildren();
    for (const m of Chat.current ? Chat.current.messages : []) box.append(Chat.renderMessage(m));
    box.scrollTop = box.scrollHeight;
  },
  setBusy(busy) {
    document.getElementById("send").hidden = busy;
    document.getElementById("stop").hidden = !busy;
    document.getElementById("messages").dataset.busy = busy ? "1" : "0";
  },

  params() {
    const num = (id) => { const v = document.getElementById(id).value; return v === "" ? undefined : Number(v); };
    const p = { temperature: num("temperature"), top_p: num("top_p"), top_k: num("top_k"),
                max_tokens: num("max_tokens"), seed: num("seed") };
    for (const k of Object.keys(p)) if (p[k] === undefined || Number.isNaN(p[k])) delete p[k];
    return p;
  },
  // The OpenAI messages of the conversation so far (the reply being made left out).
  history(conv) {
    const out = [];
    const sys = document.getElementById("system").value.trim();
    if (sys) out.push({ role: "system", content: sys });
    for (const m of conv.messages) {
      if (m.mode === "completion" || m.error || !m.done) continue;
      const msg = { role: m.role, content: m.content };
      if (m.calls && m.calls.length)
        msg.tool_calls = m.calls.map((c, i) => ({ id: c.id || "call_" + i, type: "function",
                                                   function: { name: c.name, arguments: c.arguments } }));
      out.push(msg);
    }
    return out;
  },

  async send() {
    const input = document.getElementById("input");
    const text = input.value;
    if (!text.trim() || Chat.abort) return;
    if (!Chat.current) {
      Chat.current = { id: String(Date.now()), title: "", messages: [] };
      Chat.convs.push(Chat.current);
    }
    const conv = Chat.current;
    if (!conv.title) conv.title = text.slice(0, 40);
    const mode = Chat.chatMode() ? "chat" : "completion";
    const body = Object.assign({ model: App.info ? App.info.model : undefined, stream: true }, Chat.params());
    let path;
    if (mode === "chat") {
      conv.messages.push({ role: "user", content: text, mode, done: true });
      body.messages = Chat.history(conv);
      path = "/v1/chat/completions";
    } else {
      conv.messages.push({ role: "user", content: text, mode, done: true });
      body.prompt = text;
      path = "/v1/completions";
    }
    const reply = { role: "assistant", content: "", reasoning: "", calls: [], mode, done: false };
    conv.messages.push(reply);
    input.value = "";
    Chat.save();
    Chat.renderAll();
    const box = document.getElementById("messages");
    const el = box.lastElementChild;
    Chat.abort = new AbortController();
    Chat.setBusy(true);
    let pending = false;  // one repaint per animation frame however fast tokens come
    const paint = () => {
      if (pending) return;
      pending = true;
      requestAnimationFrame(() => {
        pending = false;
        Chat.renderMessage(reply, el);
        box.scrollTop = box.scrollHeight;
      });
    };
    try {
      const r = await App.fetch(path, { method: "POST", signal: Chat.abort.signal,
                                        headers: { "Content-Type": "application/json" },
                                        body: JSON.stringify(body) });
      if (!r.ok) throw new Error(await App.message(r));
      await App.readEvents(r, (data) => {
        if (data === "[DONE]") return;
        const j = JSON.parse(data);
        if (j.error) throw new Error(j.error.message || "generation failed");
        const ch = (j.choices || [])[0];
        if (!ch) return;
        if (mode === "completion") { reply.content += ch.text || ""; paint(); return; }
        const d = ch.delta || {};
        if (d.content) reply.content += d.content;
        if (d.reasoning_content) reply.reasoning += d.reasoning_content;
        for (const tc of d.tool_calls || []) {
          const c = reply.calls[tc.index] || (reply.calls[tc.index] = { id: tc.id, name: "", arguments: "" });
          if (tc.function && tc.function.name) c.name += tc.function.name;
          if (tc.function && tc.function.arguments) c.arguments += tc.function.arguments;
        }
        paint();
      });
    } catch (e) {
      if (e.name === "AbortError") reply.stopped = true;
      else reply.error = e.status === 401 ? "unauthorized" : e.message;
    }
    reply.done = true;
    Chat.abort = null;
    Chat.setBusy(false);
    Chat.save();
    Chat.renderMessage(reply, el);
    Chat.renderList();
    input.focus();
  },
  stop() { if (Chat.abort) Chat.abort.abort(); },
};

document.addEventListener("DOMContentLoaded", () => {
  Chat.load();
  Chat.renderAll();
  Chat.setBusy(false);
  const input = document.getElementById("input");
  input.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); Chat.send(); }
  });
  document.getElementById("composer").addEventListener("submit", (e) => { e.preventDefault(); Chat.send(); });
  document.getElementById("stop").addEventListener("click", Chat.stop);
  document.addEventListener("keydown", (e) => { if (e.key === "Escape") Chat.stop(); });
  document.getElementById("new-chat").addEventListener("click", () => {
    Chat.current = null; Chat.save(); Chat.renderAll(); input.focus();
  });
  for (const k of ["system", "temperature", "top_p", "top_k", "max_tokens", "seed"])
    document.getElementById(k).addEventListener("change", Chat.save);
  document.addEventListener("app-info", () => {
    document.getElementById("mode-note").textContent = Chat.chatMode()
      ? "Chat through /v1/chat/completions with the model's template."
      : "This model has no chat template: the box's text is a prompt, continued through /v1/completions.";
    input.placeholder = Chat.chatMode() ? "Message (Enter sends, Shift+Enter: new line)"
                                        : "Prompt to continue (Enter sends, Shift+Enter: new line)";
  });
  input.focus();
});
