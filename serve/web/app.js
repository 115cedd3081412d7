// expert-serve's page: what the chat and the dashboard share: the API key (kept in this
// browser's localStorage), requests that carry it, the error banner, the tabs and the server's
// description (GET /dashboard/info). No framework, no build step.
"use strict";

const App = {
  info: null,
  key() { return localStorage.getItem("expertd.key") || ""; },
  headers(extra) {
    const h = Object.assign({}, extra || {});
    const k = App.key();
    if (k) h["Authorization"] = "Bearer " + k;
    return h;
  },
  // fetch() with the key; a 401 shows the key form and a visible error, never a blank page.
  async fetch(path, opts) {
    opts = Object.assign({}, opts || {});
    opts.headers = App.headers(opts.headers);
    const r = await fetch(path, opts);
    if (r.status === 401) {
      App.error(App.key() ? "The API key was refused (401). Enter the server's --api-key."
                          : "This server needs an API key (--api-key). Enter it above.");
      App.showKeyForm(true);
      const e = new Error("unauthorized");
      e.status = 401;
      throw e;
    }
    return r;
  },
  // An error answer's message (OpenAI's or Anthropic's JSON, else the text).
  async message(r) {
    const t = await r.text();
    try { const j = JSON.parse(t); return (j.error && j.error.message) || t; } catch (_) { return t; }
  },
  error(text) {
    const b = document.getElementById("banner");
    b.textContent = text;
    b.hidden = !text;
  },
  showKeyForm(show) {
    const f = document.getElementById("key-form");
    f.hidden = !show;
    if (show) document.getElementById("key-input").focus();
  },
  // Reads a server-sent-event stream from a fetch() response; calls onData(text) per data line.
  async readEvents(response, onData) {
    const reader = response.body.getReader();
    const dec = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let i;
      while ((i = buf.indexOf("\n\n")) >= 0) {
        const ev = buf.slice(0, i);
        buf = buf.slice(i + 2);
        for (const line of ev.split("\n"))
          if (line.startsWith("data: ")) onData(line.slice(6));
      }
    }
  },
  async loadInfo() {
    try {
      const r = await App.fetch("/dashboard/info");
      if (!r.ok) { App.error("The server's description failed: " + await App.message(r)); return; }
      App.info = await r.json();
      App.error("");
      App.showKeyForm(false);
      document.getElementById("model-name").textContent =
        App.info.model + " (" + App.info.arch + ", experts " +
        (App.info.experts === "local" ? "in RAM" : "from expertd") + ")";
      document.dispatchEvent(new CustomEvent("app-info"));
    } catch (e) {
      if (e.status !== 401) App.error("The server cannot be reached: " + e.message);
    }
  },
  selectTab(which) {
    for (const [tab, view] of [["tab-chat", "view-chat"], ["tab-dash", "view-dash"]]) {
      const on = tab === which;
      const t = document.getElementById(tab);
      t.setAttribute("aria-selected", on ? "true" : "false");
      t.tabIndex = on ? 0 : -1;
      document.getElementById(view).hidden = !on;
    }
    document.dispatchEvent(new CustomEvent("app-tab", { detail: which }));
  },
};

document.addEventListener("DOMContentLoaded", () => {
  for (const id of ["tab-chat", "tab-dash"]) {
    const t = document.getElementById(id);
    t.addEventListener("click", () => App.selectTab(id));
    t.addEventListener("keydown", (e) => {  // arrow keys move between tabs (WAI-ARIA tabs)
      if (e.key !== "ArrowLeft" && e.key !== "ArrowRight") return;
      const other = id === "tab-chat" ? "tab-dash" : "tab-chat";
      App.selectTab(other);
      document.getElementById(other).focus();
    });
  }
  document.getElementById("key-button").addEventListener("click", () => {
    const f = document.getElementById("key-form");
    App.showKeyForm(f.hidden);
  });
  document.getElementById("key-form").addEventListener("submit", (e) => {
    e.preventDefault();
    localStorage.setItem("expertd.key", document.getElementById("key-input").value.trim());
    document.getElementById("key-input").value = "";
    App.loadInfo();
  });
  document.getElementById("key-clear").addEventListener("click", () => {
    localStorage.removeItem("expertd.key");
    App.loadInfo();
  });
  App.selectTab(location.hash === "#dashboard" ? "tab-dash" : "tab-chat");
  App.loadInfo();
});
