// Switchboard console: browser notifications for new escalated holds, for an operator who asked.
//
// Opt-in: a "Notify me" button in the header asks the browser's permission; the choice is kept in
// this browser (localStorage). While it is on, this script listens on the console's live socket
// (/ws/console/, the same events the pages show) and shows one notification per new hold that
// needs a human (escalate=required). A notification names the sessions and what matched, never
// the message's text; clicking it opens the hold's page, where the operator can acknowledge it.
(() => {
  "use strict";
  const KEY = "switchboard.notify";
  const body = document.body;
  const header = document.querySelector("header.top");
  if (!body || !body.dataset.wsPath || !header || !("Notification" in window)) return;

  let socket = null;
  let attempts = 0;
  const button = document.createElement("button");
  button.type = "button";
  button.className = "link";
  button.id = "notify-toggle";

  const wanted = () => localStorage.getItem(KEY) === "on";
  const enabled = () => wanted() && Notification.permission === "granted";

  function render() {
    const blocked = Notification.permission === "denied";
    button.disabled = blocked;
    button.setAttribute("aria-pressed", enabled() ? "true" : "false");
    button.textContent = blocked ? "Notifications blocked" : enabled() ? "Notifications on" : "Notify me";
    button.title = blocked
      ? "This browser blocks notifications from the console; allow them in its site settings."
      : enabled()
        ? "Escalated holds show as notifications. Click to stop."
        : "Show a notification when a hold needs a human, even when this tab is in the background.";
  }

  function label(who) {
    return who ? who.name + " [" + who.ref + "]" : "the hub";
  }

  function show(d) {
    const matched = Array.isArray(d.matched) && d.matched.length ? d.matched.join(", ") : "escalated";
    const note = new Notification("Hold needs a human: " + label(d.to), {
      body: label(d.from) + " → " + label(d.to) + " · " + matched,
      tag: "switchboard-hold-" + d.delivery_id, // one per hold, however many tabs show it
    });
    note.addEventListener("click", () => {
      window.focus();
      location.href = "/alerts/holds/" + encodeURIComponent(String(d.delivery_id)) + "/";
      note.close();
    });
  }

  function heard(kind, d) {
    if (kind === "message.sent" && d && d.state === "held" && d.escalate === "required") show(d);
  }

  function connect() {
    if (!enabled() || socket) return;
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    socket = new WebSocket(scheme + location.host + body.dataset.wsPath);
    socket.addEventListener("open", () => {
      attempts = 0;
      button.dataset.listening = "on";
    });
    socket.addEventListener("message", (e) => {
      let event;
      try {
        event = JSON.parse(e.data);
      } catch (err) {
        return;
      }
      if (event && typeof event.kind === "string") heard(event.kind, event.data);
    });
    socket.addEventListener("close", (e) => {
      socket = null;
      delete button.dataset.listening;
      if (e.code === 4403 || e.code === 403 || !enabled()) return;
      attempts += 1;
      setTimeout(connect, Math.min(15000, 500 * 2 ** Math.min(attempts, 5)));
    });
  }

  button.addEventListener("click", async () => {
    if (enabled()) {
      localStorage.setItem(KEY, "off");
      if (socket) socket.close();
      render();
      return;
    }
    const answer = await Notification.requestPermission();
    if (answer === "granted") localStorage.setItem(KEY, "on");
    render();
    connect();
  });

  const live = header.querySelector("#live");
  if (live) live.after(button);
  else header.append(button);
  render();
  connect();
})();
